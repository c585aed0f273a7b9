package store

import (
	"context"
	"fmt"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// Settings are the console-wide options.
type Settings struct {
	// RequireApproval turns publishes into change requests that another
	// editor must approve (four-eyes).
	RequireApproval bool `json:"require_approval"`
	// SessionIdleS and SessionAbsoluteS are the session lifetimes in
	// seconds: since the last request, and since sign-in.
	SessionIdleS     int       `json:"session_idle_s"`
	SessionAbsoluteS int       `json:"session_absolute_s"`
	UpdatedAt        time.Time `json:"updated_at"`
	UpdatedBy        string    `json:"updated_by"`
}

type settingsRow struct {
	ID               bool `gorm:"primaryKey"`
	RequireApproval  bool
	SessionIdleS     int `gorm:"column:session_idle_s"`
	SessionAbsoluteS int `gorm:"column:session_absolute_s"`
	UpdatedAt        time.Time
	UpdatedBy        string
}

func (settingsRow) TableName() string { return "settings" }

func (r settingsRow) settings() Settings {
	return Settings{RequireApproval: r.RequireApproval, SessionIdleS: r.SessionIdleS, SessionAbsoluteS: r.SessionAbsoluteS,
		UpdatedAt: r.UpdatedAt, UpdatedBy: r.UpdatedBy}
}

// FindSettings returns the current settings.
func (s *Store) FindSettings(ctx context.Context) (Settings, error) {
	var row settingsRow
	if err := s.db.WithContext(ctx).Take(&row).Error; err != nil {
		return Settings{}, fmt.Errorf("read settings: %w", err)
	}
	return row.settings(), nil
}

// SettingsUpdate changes some settings; nil fields stay as they are.
type SettingsUpdate struct {
	RequireApproval  *bool
	SessionIdleS     *int
	SessionAbsoluteS *int
}

// UpdateSettings applies u and audits the change (before and after) in the
// same transaction. A publish in flight holds a share lock on the settings,
// so it completes under the old value or starts under the new one.
func (s *Store) UpdateSettings(ctx context.Context, u SettingsUpdate, actor Actor) (Settings, error) {
	var row settingsRow
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Clauses(clause.Locking{Strength: "UPDATE"}).Take(&row).Error; err != nil {
			return fmt.Errorf("read settings: %w", err)
		}
		before := row.settings()
		if u.RequireApproval != nil {
			row.RequireApproval = *u.RequireApproval
		}
		for _, v := range []*int{u.SessionIdleS, u.SessionAbsoluteS} {
			if v != nil && (time.Duration(*v)*time.Second < MinSessionLifetime || time.Duration(*v)*time.Second > SessionAbsolute) {
				return &InvalidError{Reason: fmt.Sprintf("session lifetimes are %d to %d seconds", int(MinSessionLifetime.Seconds()), int(SessionAbsolute.Seconds()))}
			}
		}
		if u.SessionIdleS != nil {
			row.SessionIdleS = *u.SessionIdleS
		}
		if u.SessionAbsoluteS != nil {
			row.SessionAbsoluteS = *u.SessionAbsoluteS
		}
		row.UpdatedAt, row.UpdatedBy = time.Now().UTC(), actor.Name
		err := tx.Model(&settingsRow{}).Where("id").Updates(map[string]any{
			"require_approval": row.RequireApproval, "session_idle_s": row.SessionIdleS, "session_absolute_s": row.SessionAbsoluteS,
			"updated_at": row.UpdatedAt, "updated_by": row.UpdatedBy,
		}).Error
		if err != nil {
			return fmt.Errorf("write settings: %w", err)
		}
		return appendAudit(tx, actor, "settings.update", "settings", "",
			map[string]any{"require_approval": before.RequireApproval, "session_idle_s": before.SessionIdleS, "session_absolute_s": before.SessionAbsoluteS},
			map[string]any{"require_approval": row.RequireApproval, "session_idle_s": row.SessionIdleS, "session_absolute_s": row.SessionAbsoluteS})
	})
	if err != nil {
		return Settings{}, fmt.Errorf("update settings: %w", err)
	}
	return row.settings(), nil
}
