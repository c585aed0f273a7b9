package store

import (
	"context"
	"fmt"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// AuditStream is the SIEM webhook that receives every audit event. The
// secret signs deliveries and is never shown again once set.
type AuditStream struct {
	URL         string     `json:"url"`
	Enabled     bool       `json:"enabled"`
	SecretSet   bool       `json:"secret_set"`
	DeliveredID int64      `json:"delivered_id"` // the last event the receiver acknowledged
	LastError   string     `json:"last_error"`
	LastAttempt *time.Time `json:"last_attempt"`
	UpdatedAt   time.Time  `json:"updated_at"`
	UpdatedBy   string     `json:"updated_by"`

	Secret string `json:"-"`
}

type auditStreamRow struct {
	ID          bool `gorm:"primaryKey"`
	URL         string
	Secret      string
	Enabled     bool
	DeliveredID int64
	LastError   string
	LastAttempt *time.Time
	UpdatedAt   time.Time
	UpdatedBy   string
}

func (auditStreamRow) TableName() string { return "audit_stream" }

func (r auditStreamRow) stream() AuditStream {
	return AuditStream{URL: r.URL, Enabled: r.Enabled, SecretSet: r.Secret != "", DeliveredID: r.DeliveredID,
		LastError: r.LastError, LastAttempt: r.LastAttempt, UpdatedAt: r.UpdatedAt, UpdatedBy: r.UpdatedBy, Secret: r.Secret}
}

// FindAuditStream returns the audit stream's settings and cursor.
func (s *Store) FindAuditStream(ctx context.Context) (AuditStream, error) {
	var row auditStreamRow
	if err := s.db.WithContext(ctx).Take(&row).Error; err != nil {
		return AuditStream{}, fmt.Errorf("read audit stream: %w", err)
	}
	return row.stream(), nil
}

// AuditStreamUpdate changes the audit stream; a nil Secret keeps the one
// set.
type AuditStreamUpdate struct {
	URL     string
	Secret  *string
	Enabled bool
}

// UpdateAuditStream applies u and audits it, the URL but never the
// secret. Enabling a stream without a URL and a secret is refused.
func (s *Store) UpdateAuditStream(ctx context.Context, u AuditStreamUpdate, actor Actor) (AuditStream, error) {
	var row auditStreamRow
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Clauses(clause.Locking{Strength: "UPDATE"}).Take(&row).Error; err != nil {
			return fmt.Errorf("read audit stream: %w", err)
		}
		before := map[string]any{"url": row.URL, "enabled": row.Enabled}
		changed := u.Secret != nil && *u.Secret != row.Secret
		if u.Secret != nil {
			row.Secret = *u.Secret
		}
		row.URL, row.Enabled = u.URL, u.Enabled
		if row.Enabled && (row.URL == "" || row.Secret == "") {
			return &InvalidError{Reason: "an enabled audit stream needs a url and a secret"}
		}
		row.UpdatedAt, row.UpdatedBy = time.Now().UTC(), actor.Name
		if err := tx.Model(&auditStreamRow{}).Where("id").Updates(map[string]any{
			"url": row.URL, "secret": row.Secret, "enabled": row.Enabled, "updated_at": row.UpdatedAt, "updated_by": row.UpdatedBy,
		}).Error; err != nil {
			return fmt.Errorf("write audit stream: %w", err)
		}
		return appendAudit(tx, actor, "audit_stream.update", "audit_stream", "", before,
			map[string]any{"url": row.URL, "enabled": row.Enabled, "new_signing_key": changed})
	})
	if err != nil {
		return AuditStream{}, fmt.Errorf("update audit stream: %w", err)
	}
	return row.stream(), nil
}

// AuditAfter returns up to limit audit events with ids above id, oldest
// first. Appends are serialized until they commit, so an event is never
// visible before one with a lower id.
func (s *Store) AuditAfter(ctx context.Context, id int64, limit int) ([]AuditEvent, error) {
	var rows []auditRow
	if err := s.db.WithContext(ctx).Where("id > ?", id).Order("id").Limit(limit).Find(&rows).Error; err != nil {
		return nil, fmt.Errorf("read audit events: %w", err)
	}
	out := make([]AuditEvent, 0, len(rows))
	for _, r := range rows {
		ev, err := r.event()
		if err != nil {
			return nil, err
		}
		out = append(out, ev)
	}
	return out, nil
}

// CountAuditAfter counts the audit events with ids above id.
func (s *Store) CountAuditAfter(ctx context.Context, id int64) (int64, error) {
	var n int64
	if err := s.db.WithContext(ctx).Model(&auditRow{}).Where("id > ?", id).Count(&n).Error; err != nil {
		return 0, fmt.Errorf("count audit events: %w", err)
	}
	return n, nil
}

// AdvanceAuditStream moves the delivery cursor from from to to, and
// clears the last error. It reports false when the cursor was not at from
// (another replica delivered meanwhile): the caller reads it again.
func (s *Store) AdvanceAuditStream(ctx context.Context, from, to int64) (bool, error) {
	now := time.Now().UTC()
	res := s.db.WithContext(ctx).Model(&auditStreamRow{}).Where("delivered_id = ?", from).
		Updates(map[string]any{"delivered_id": to, "last_error": "", "last_attempt": now})
	if res.Error != nil {
		return false, fmt.Errorf("advance audit stream: %w", res.Error)
	}
	return res.RowsAffected == 1, nil
}

// RecordAuditStreamError notes a failed delivery.
func (s *Store) RecordAuditStreamError(ctx context.Context, msg string) error {
	now := time.Now().UTC()
	if err := s.db.WithContext(ctx).Model(&auditStreamRow{}).Where("id").
		Updates(map[string]any{"last_error": cut(msg, 500), "last_attempt": now}).Error; err != nil {
		return fmt.Errorf("record audit stream error: %w", err)
	}
	return nil
}
