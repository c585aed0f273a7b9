package store

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	"gorm.io/gorm"
)

// AuditEvent is one entry of the append-only audit trail.
type AuditEvent struct {
	ID        int64           `json:"id"`
	At        time.Time       `json:"at"`
	Actor     string          `json:"actor"`
	Action    string          `json:"action"`
	Target    string          `json:"target"`
	Before    json.RawMessage `json:"before"`
	After     json.RawMessage `json:"after"`
	Message   string          `json:"message"`
	IP        string          `json:"ip"`
	UserAgent string          `json:"user_agent"`
	RequestID string          `json:"request_id"`
	PrevHash  string          `json:"prev_hash"`
	Hash      string          `json:"hash"`
}

// Actor says who makes a change and from where; every write carries one so
// that its audit row can be written in the same transaction.
type Actor struct {
	Name string // "user:alice" or "token:ci-deploy#3"
	// Owner is the person who answers for the actor: the user itself, or
	// whoever created the token. Empty means Name. Four-eyes compares owners,
	// so nobody approves their own change through a token of theirs.
	Owner     string
	IP        string
	UserAgent string
	RequestID string
}

func (a Actor) owner() string {
	if a.Owner != "" {
		return a.Owner
	}
	return a.Name
}

type auditRow struct {
	ID        int64 `gorm:"primaryKey"`
	At        time.Time
	Actor     string
	Action    string
	Target    string
	Before    *string `gorm:"type:jsonb"`
	After     *string `gorm:"type:jsonb"`
	Message   string
	IP        string
	UserAgent string
	RequestID string
	PrevHash  string
	Hash      string
}

func (auditRow) TableName() string { return "audit_events" }

// auditLockKey serializes appends so the hash chain stays linear.
const auditLockKey = 0x51_0ce_a0d17

// appendAudit writes one audit event inside tx, chained to the previous one.
func appendAudit(tx *gorm.DB, actor Actor, action, target, message string, before, after any) error {
	if err := tx.Exec("SELECT pg_advisory_xact_lock(?)", auditLockKey).Error; err != nil {
		return fmt.Errorf("lock audit chain: %w", err)
	}
	var prev string
	err := tx.Raw("SELECT hash FROM audit_events ORDER BY id DESC LIMIT 1").Scan(&prev).Error
	if err != nil {
		return fmt.Errorf("read audit chain head: %w", err)
	}
	b, err := canonicalJSON(before)
	if err != nil {
		return err
	}
	a, err := canonicalJSON(after)
	if err != nil {
		return err
	}
	ev := AuditEvent{
		At:        time.Now().UTC().Truncate(time.Microsecond),
		Actor:     actor.Name,
		Action:    action,
		Target:    target,
		Before:    b,
		After:     a,
		Message:   message,
		IP:        actor.IP,
		UserAgent: actor.UserAgent,
		RequestID: actor.RequestID,
		PrevHash:  prev,
	}
	ev.Hash = eventHash(ev)
	row := auditRow{
		At: ev.At, Actor: ev.Actor, Action: ev.Action, Target: ev.Target,
		Before: rawPtr(ev.Before), After: rawPtr(ev.After), Message: ev.Message,
		IP: ev.IP, UserAgent: ev.UserAgent, RequestID: ev.RequestID,
		PrevHash: ev.PrevHash, Hash: ev.Hash,
	}
	if err := tx.Create(&row).Error; err != nil {
		return fmt.Errorf("append audit event: %w", err)
	}
	return nil
}

func rawPtr(b json.RawMessage) *string {
	if b == nil {
		return nil
	}
	s := string(b)
	return &s
}

// canonicalJSON renders v as JSON with sorted object keys and no
// insignificant space, so the same value always hashes the same, including
// after a round trip through a jsonb column.
func canonicalJSON(v any) (json.RawMessage, error) {
	if v == nil {
		return nil, nil
	}
	var raw []byte
	switch t := v.(type) {
	case json.RawMessage:
		raw = t
	case []byte:
		raw = t
	case string:
		raw = []byte(t)
	default:
		var err error
		if raw, err = json.Marshal(v); err != nil {
			return nil, fmt.Errorf("encode audit value: %w", err)
		}
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var generic any
	if err := dec.Decode(&generic); err != nil {
		return nil, fmt.Errorf("decode audit value: %w", err)
	}
	out, err := json.Marshal(generic) // maps marshal with sorted keys
	if err != nil {
		return nil, fmt.Errorf("encode audit value: %w", err)
	}
	return out, nil
}

// eventHash is SHA-256 over the previous hash and the event's canonical JSON.
func eventHash(ev AuditEvent) string {
	body := struct {
		At        string          `json:"at"`
		Actor     string          `json:"actor"`
		Action    string          `json:"action"`
		Target    string          `json:"target"`
		Before    json.RawMessage `json:"before"`
		After     json.RawMessage `json:"after"`
		Message   string          `json:"message"`
		IP        string          `json:"ip"`
		UserAgent string          `json:"user_agent"`
		RequestID string          `json:"request_id"`
		PrevHash  string          `json:"prev_hash"`
	}{
		ev.At.UTC().Format(time.RFC3339Nano), ev.Actor, ev.Action, ev.Target,
		nullIfEmpty(ev.Before), nullIfEmpty(ev.After), ev.Message, ev.IP, ev.UserAgent, ev.RequestID, ev.PrevHash,
	}
	b, _ := json.Marshal(body) // cannot fail: strings and valid raw JSON only
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func nullIfEmpty(b json.RawMessage) json.RawMessage {
	if len(b) == 0 {
		return json.RawMessage("null")
	}
	return b
}

func (r auditRow) event() (AuditEvent, error) {
	ev := AuditEvent{
		ID: r.ID, At: r.At, Actor: r.Actor, Action: r.Action, Target: r.Target, Message: r.Message,
		IP: r.IP, UserAgent: r.UserAgent, RequestID: r.RequestID, PrevHash: r.PrevHash, Hash: r.Hash,
	}
	var err error
	if r.Before != nil {
		if ev.Before, err = canonicalJSON(*r.Before); err != nil {
			return ev, err
		}
	}
	if r.After != nil {
		if ev.After, err = canonicalJSON(*r.After); err != nil {
			return ev, err
		}
	}
	return ev, nil
}

// AuditFilter narrows ListAudit. Zero fields do not filter.
type AuditFilter struct {
	Actor  string // exact actor, like "user:alice"
	Action string // exact action, like "domain.publish"
	Target string // exact target, like "domain:api"
	Domain string // events about this domain (target "domain:NAME")
	Since  time.Time
	Until  time.Time
	Before int64 // cursor: only events with ID < Before
	Limit  int   // page size, 1..1000 (default 100)
}

// ListAudit returns a page of audit events, newest first, and the cursor of
// the next page (0 when this is the last).
func (s *Store) ListAudit(ctx context.Context, f AuditFilter) ([]AuditEvent, int64, error) {
	q := s.db.WithContext(ctx).Model(&auditRow{}).Order("id DESC")
	if f.Actor != "" {
		q = q.Where("actor = ?", f.Actor)
	}
	if f.Action != "" {
		q = q.Where("action = ?", f.Action)
	}
	if f.Target != "" {
		q = q.Where("target = ?", f.Target)
	}
	if f.Domain != "" {
		q = q.Where("target = ?", "domain:"+f.Domain)
	}
	if !f.Since.IsZero() {
		q = q.Where("at >= ?", f.Since)
	}
	if !f.Until.IsZero() {
		q = q.Where("at < ?", f.Until)
	}
	if f.Before > 0 {
		q = q.Where("id < ?", f.Before)
	}
	limit := pageSize(f.Limit)
	var rows []auditRow
	if err := q.Limit(limit + 1).Find(&rows).Error; err != nil {
		return nil, 0, fmt.Errorf("list audit events: %w", err)
	}
	var next int64
	if len(rows) > limit {
		rows = rows[:limit]
		next = rows[limit-1].ID
	}
	out := make([]AuditEvent, 0, len(rows))
	for _, r := range rows {
		ev, err := r.event()
		if err != nil {
			return nil, 0, err
		}
		out = append(out, ev)
	}
	return out, next, nil
}

// AuditVerification is the result of checking the audit hash chain.
type AuditVerification struct {
	OK       bool   `json:"ok"`
	Events   int64  `json:"events"`
	BrokenID int64  `json:"broken_id,omitempty"`
	Reason   string `json:"reason,omitempty"`
}

// VerifyAudit walks the whole chain in order and names the first row whose
// hash or link does not match.
func (s *Store) VerifyAudit(ctx context.Context) (AuditVerification, error) {
	var res AuditVerification
	prev := ""
	var lastID int64
	for {
		var rows []auditRow
		err := s.db.WithContext(ctx).Where("id > ?", lastID).Order("id").Limit(1000).Find(&rows).Error
		if err != nil {
			return res, fmt.Errorf("verify audit chain: %w", err)
		}
		if len(rows) == 0 {
			res.OK = true
			return res, nil
		}
		for _, r := range rows {
			ev, err := r.event()
			if err != nil {
				return AuditVerification{Events: res.Events, BrokenID: r.ID, Reason: "unreadable row"}, nil
			}
			if ev.PrevHash != prev {
				return AuditVerification{Events: res.Events, BrokenID: r.ID, Reason: "previous-hash link broken"}, nil
			}
			if eventHash(ev) != ev.Hash {
				return AuditVerification{Events: res.Events, BrokenID: r.ID, Reason: "row content does not match its hash"}, nil
			}
			prev = ev.Hash
			lastID = r.ID
			res.Events++
		}
	}
}
