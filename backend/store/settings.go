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
	RequireApproval bool      `json:"require_approval"`
	UpdatedAt       time.Time `json:"updated_at"`
	UpdatedBy       string    `json:"updated_by"`
}

type settingsRow struct {
	ID              bool `gorm:"primaryKey"`
	RequireApproval bool
	UpdatedAt       time.Time
	UpdatedBy       string
}

func (settingsRow) TableName() string { return "settings" }

func (r settingsRow) settings() Settings {
	return Settings{RequireApproval: r.RequireApproval, UpdatedAt: r.UpdatedAt, UpdatedBy: r.UpdatedBy}
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
	RequireApproval *bool
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
		row.UpdatedAt, row.UpdatedBy = time.Now().UTC(), actor.Name
		err := tx.Model(&settingsRow{}).Where("id").Updates(map[string]any{
			"require_approval": row.RequireApproval, "updated_at": row.UpdatedAt, "updated_by": row.UpdatedBy,
		}).Error
		if err != nil {
			return fmt.Errorf("write settings: %w", err)
		}
		return appendAudit(tx, actor, "settings.update", "settings", "",
			map[string]any{"require_approval": before.RequireApproval},
			map[string]any{"require_approval": row.RequireApproval})
	})
	if err != nil {
		return Settings{}, fmt.Errorf("update settings: %w", err)
	}
	return row.settings(), nil
}
