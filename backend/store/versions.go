package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/rules/wire"
)

// Version is one published ruleset version.
type Version struct {
	Version    int64     `json:"version"`
	CreatedAt  time.Time `json:"created_at"`
	Author     string    `json:"author"`
	Message    string    `json:"message"`
	RollbackOf *int64    `json:"rollback_of"`
	Checksum   string    `json:"checksum"`
}

// DomainRevision is a domain's YAML as of a version, with the version that
// last changed it.
type DomainRevision struct {
	Name    string `json:"name"`
	YAML    string `json:"yaml"`
	Version int64  `json:"version"`
}

// Snapshot is the whole ruleset at one version.
type Snapshot struct {
	Version  int64            `json:"version"`
	Checksum string           `json:"checksum"`
	Domains  []DomainRevision `json:"domains"`
}

// WireDomains returns the snapshot's domains in push-protocol form.
func (s Snapshot) WireDomains() []wire.DomainConfig {
	out := make([]wire.DomainConfig, len(s.Domains))
	for i, d := range s.Domains {
		out[i] = wire.DomainConfig{Name: d.Name, YAML: d.YAML}
	}
	return out
}

// Change is a request to publish (or delete) one domain.
type Change struct {
	Domain      string
	YAML        string
	Delete      bool
	BaseVersion int64 // the version the author edited; 409 if the domain changed after it
	Message     string
	Actor       Actor
}

// ConflictError reports that a domain changed after the author's base version.
type ConflictError struct {
	Domain    string
	Base      int64
	ChangedIn int64
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("domain %q changed in version %d, after base version %d", e.Domain, e.ChangedIn, e.Base)
}

// Unwrap makes errors.Is(err, rules.ErrConflict) true.
func (e *ConflictError) Unwrap() error { return rules.ErrConflict }

type versionRow struct {
	Version    int64 `gorm:"primaryKey"`
	CreatedAt  time.Time
	Author     string
	Message    string
	RollbackOf *int64
	Checksum   string
}

func (versionRow) TableName() string { return "versions" }

type revisionRow struct {
	Version int64  `gorm:"primaryKey"`
	Domain  string `gorm:"primaryKey"`
	YAML    string `gorm:"column:yaml"`
	Deleted bool
}

func (revisionRow) TableName() string { return "domain_revisions" }

func (r versionRow) version() Version {
	return Version{Version: r.Version, CreatedAt: r.CreatedAt, Author: r.Author, Message: r.Message, RollbackOf: r.RollbackOf, Checksum: r.Checksum}
}

// nextVersion increments the head row, locking it until tx ends: publishers
// queue here, so versions are contiguous and never reused.
func nextVersion(tx *gorm.DB) (int64, error) {
	var v int64
	if err := tx.Raw("UPDATE ruleset_head SET version = version + 1 RETURNING version").Scan(&v).Error; err != nil {
		return 0, fmt.Errorf("allocate version: %w", err)
	}
	return v, nil
}

// snapshotAt reads every live domain at version v.
func snapshotAt(tx *gorm.DB, v int64) ([]DomainRevision, error) {
	var rows []revisionRow
	err := tx.Raw(`SELECT DISTINCT ON (domain) version, domain, yaml, deleted
		FROM domain_revisions WHERE version <= ? ORDER BY domain, version DESC`, v).Scan(&rows).Error
	if err != nil {
		return nil, fmt.Errorf("read snapshot %d: %w", v, err)
	}
	out := make([]DomainRevision, 0, len(rows))
	for _, r := range rows {
		if !r.Deleted {
			out = append(out, DomainRevision{Name: r.Domain, YAML: r.YAML, Version: r.Version})
		}
	}
	return out, nil
}

func checksum(domains []DomainRevision) string {
	return Snapshot{Domains: domains}.checksum()
}

func (s Snapshot) checksum() string { return wire.Checksum(s.WireDomains()) }

// Publish writes a new version that changes one domain, with its audit event,
// in one transaction. It returns the new version.
func (s *Store) Publish(ctx context.Context, c Change) (int64, error) {
	var version int64
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		v, err := nextVersion(tx)
		if err != nil {
			return err
		}
		var last revisionRow
		err = tx.Where("domain = ?", c.Domain).Order("version DESC").Limit(1).Take(&last).Error
		exists := err == nil && !last.Deleted
		switch {
		case err != nil && !errors.Is(err, gorm.ErrRecordNotFound):
			return fmt.Errorf("read domain %q: %w", c.Domain, err)
		case err == nil && last.Version > c.BaseVersion:
			return &ConflictError{Domain: c.Domain, Base: c.BaseVersion, ChangedIn: last.Version}
		case c.Delete && !exists:
			return fmt.Errorf("domain %q: %w", c.Domain, rules.ErrNotFound)
		}
		rev := revisionRow{Version: v, Domain: c.Domain, YAML: c.YAML, Deleted: c.Delete}
		if c.Delete {
			rev.YAML = ""
		}
		if err := tx.Create(&rev).Error; err != nil {
			return fmt.Errorf("write revision: %w", err)
		}
		domains, err := snapshotAt(tx, v)
		if err != nil {
			return err
		}
		row := versionRow{Version: v, CreatedAt: time.Now().UTC(), Author: c.Actor.Name, Message: c.Message, Checksum: checksum(domains)}
		if err := tx.Create(&row).Error; err != nil {
			return fmt.Errorf("write version: %w", err)
		}
		action := "domain.publish"
		var before, after any
		if exists {
			before = map[string]any{"yaml": last.YAML, "version": last.Version}
		}
		if c.Delete {
			action = "domain.delete"
		} else {
			after = map[string]any{"yaml": c.YAML, "version": v}
		}
		version = v
		return appendAudit(tx, c.Actor, action, "domain:"+c.Domain, c.Message, before, after)
	})
	if err != nil {
		return 0, fmt.Errorf("publish domain %q: %w", c.Domain, err)
	}
	return version, nil
}

// Rollback publishes a new version whose content is version to's.
func (s *Store) Rollback(ctx context.Context, to int64, message string, actor Actor) (int64, error) {
	var version int64
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		v, err := nextVersion(tx)
		if err != nil {
			return err
		}
		if to <= 0 || to >= v {
			return fmt.Errorf("version %d: %w", to, rules.ErrNotFound)
		}
		target, err := snapshotAt(tx, to)
		if err != nil {
			return err
		}
		current, err := snapshotAt(tx, v-1)
		if err != nil {
			return err
		}
		want := make(map[string]string, len(target))
		for _, d := range target {
			want[d.Name] = d.YAML
		}
		have := make(map[string]string, len(current))
		for _, d := range current {
			have[d.Name] = d.YAML
			if y, ok := want[d.Name]; !ok {
				if err := tx.Create(&revisionRow{Version: v, Domain: d.Name, Deleted: true}).Error; err != nil {
					return fmt.Errorf("write revision: %w", err)
				}
			} else if y != d.YAML {
				if err := tx.Create(&revisionRow{Version: v, Domain: d.Name, YAML: y}).Error; err != nil {
					return fmt.Errorf("write revision: %w", err)
				}
			}
		}
		for _, d := range target {
			if _, ok := have[d.Name]; !ok {
				if err := tx.Create(&revisionRow{Version: v, Domain: d.Name, YAML: d.YAML}).Error; err != nil {
					return fmt.Errorf("write revision: %w", err)
				}
			}
		}
		row := versionRow{Version: v, CreatedAt: time.Now().UTC(), Author: actor.Name, Message: message, RollbackOf: &to, Checksum: checksum(target)}
		if err := tx.Create(&row).Error; err != nil {
			return fmt.Errorf("write version: %w", err)
		}
		version = v
		return appendAudit(tx, actor, "version.rollback", fmt.Sprintf("version:%d", to), message,
			map[string]any{"version": v - 1}, map[string]any{"version": v, "rollback_of": to})
	})
	if err != nil {
		return 0, fmt.Errorf("roll back to version %d: %w", to, err)
	}
	return version, nil
}

// CurrentVersion returns the latest published version (0 before the first).
func (s *Store) CurrentVersion(ctx context.Context) (int64, error) {
	var v int64
	if err := s.db.WithContext(ctx).Raw("SELECT version FROM ruleset_head").Scan(&v).Error; err != nil {
		return 0, fmt.Errorf("read current version: %w", err)
	}
	return v, nil
}

// FindSnapshot returns the ruleset at version v; v = 0 means the latest.
func (s *Store) FindSnapshot(ctx context.Context, v int64) (Snapshot, error) {
	var snap Snapshot
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if v == 0 {
			if err := tx.Raw("SELECT version FROM ruleset_head").Scan(&v).Error; err != nil {
				return fmt.Errorf("read current version: %w", err)
			}
			if v == 0 {
				snap = Snapshot{Checksum: checksum(nil), Domains: []DomainRevision{}}
				return nil
			}
		}
		var row versionRow
		if err := tx.Where("version = ?", v).Take(&row).Error; err != nil {
			return notFound(err, fmt.Sprintf("version %d", v))
		}
		domains, err := snapshotAt(tx, v)
		if err != nil {
			return err
		}
		snap = Snapshot{Version: v, Checksum: row.Checksum, Domains: domains}
		return nil
	})
	return snap, err
}

// FindVersion returns one version's metadata.
func (s *Store) FindVersion(ctx context.Context, v int64) (Version, error) {
	var row versionRow
	if err := s.db.WithContext(ctx).Where("version = ?", v).Take(&row).Error; err != nil {
		return Version{}, notFound(err, fmt.Sprintf("version %d", v))
	}
	return row.version(), nil
}

// FindDomain returns a domain as of the latest version.
func (s *Store) FindDomain(ctx context.Context, name string) (DomainRevision, error) {
	var row revisionRow
	err := s.db.WithContext(ctx).Where("domain = ?", name).Order("version DESC").Limit(1).Take(&row).Error
	if err != nil {
		return DomainRevision{}, notFound(err, fmt.Sprintf("domain %q", name))
	}
	if row.Deleted {
		return DomainRevision{}, fmt.Errorf("domain %q: %w", name, rules.ErrNotFound)
	}
	return DomainRevision{Name: row.Domain, YAML: row.YAML, Version: row.Version}, nil
}

// VersionFilter narrows ListVersions.
type VersionFilter struct {
	Before int64 // only versions < Before (pagination); 0 = newest
	Limit  int
}

// ListVersions returns versions, newest first.
func (s *Store) ListVersions(ctx context.Context, f VersionFilter) ([]Version, error) {
	q := s.db.WithContext(ctx).Order("version DESC")
	if f.Before > 0 {
		q = q.Where("version < ?", f.Before)
	}
	if f.Limit <= 0 || f.Limit > 1000 {
		f.Limit = 100
	}
	var rows []versionRow
	if err := q.Limit(f.Limit).Find(&rows).Error; err != nil {
		return nil, fmt.Errorf("list versions: %w", err)
	}
	out := make([]Version, len(rows))
	for i, r := range rows {
		out[i] = r.version()
	}
	return out, nil
}
