package store

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

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
	// ApprovedBy and ChangeID are set when the version was published by
	// approving a change request.
	ApprovedBy string `json:"approved_by,omitempty"`
	ChangeID   *int64 `json:"change_id,omitempty"`
	// Domains lists the domains this version changed (filled by ListVersions
	// and FindVersion).
	Domains []string `json:"domains"`
}

// DomainRevision is a domain's YAML as of a version, with the version that
// last changed it and who made that change.
type DomainRevision struct {
	Name      string    `json:"name"`
	YAML      string    `json:"yaml"`
	Version   int64     `json:"version"`
	ChangedAt time.Time `json:"changed_at"`
	Author    string    `json:"author"`
	Message   string    `json:"message"`
	// Overrides are the temporary overrides in effect (snapshots only; see
	// overrides.go); nodes get YAML with them appended (Enforced).
	Overrides []ActiveOverride `json:"overrides,omitempty"`
	enforced  string           // YAML with Overrides, when it has some
}

// Snapshot is the whole ruleset at one version.
type Snapshot struct {
	Version  int64            `json:"version"`
	Checksum string           `json:"checksum"`
	Domains  []DomainRevision `json:"domains"`
	// RulesVersion is the latest version, at or before Version, that
	// changed a domain's own YAML: versions that only start or end
	// overrides do not move it, so GitOps tools compare it.
	RulesVersion int64 `json:"rules_version"`
}

// WireDomains returns the snapshot's domains in push-protocol form.
func (s Snapshot) WireDomains() []wire.DomainConfig {
	out := make([]wire.DomainConfig, len(s.Domains))
	for i, d := range s.Domains {
		out[i] = wire.DomainConfig{Name: d.Name, YAML: d.Enforced()}
	}
	return out
}

type versionRow struct {
	Version    int64 `gorm:"primaryKey"`
	CreatedAt  time.Time
	Author     string
	Message    string
	RollbackOf *int64
	Checksum   string
	ApprovedBy *string
	ChangeID   *int64
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
	v := Version{Version: r.Version, CreatedAt: r.CreatedAt, Author: r.Author, Message: r.Message,
		RollbackOf: r.RollbackOf, Checksum: r.Checksum, ChangeID: r.ChangeID, Domains: []string{}}
	if r.ApprovedBy != nil {
		v.ApprovedBy = *r.ApprovedBy
	}
	return v
}

func headVersion(tx *gorm.DB) (int64, error) {
	var v int64
	if err := tx.Raw("SELECT version FROM ruleset_head").Scan(&v).Error; err != nil {
		return 0, fmt.Errorf("read current version: %w", err)
	}
	return v, nil
}

// snapshotRow is a revision with the metadata of the version that wrote it.
// The metadata is empty for a version still being written.
type snapshotRow struct {
	Version   int64
	Domain    string
	YAML      string `gorm:"column:yaml"`
	Deleted   bool
	CreatedAt *time.Time
	Author    *string
	Message   *string
}

// snapshotAt reads every live domain at version v.
func snapshotAt(tx *gorm.DB, v int64) ([]DomainRevision, error) {
	var rows []snapshotRow
	err := tx.Raw(`SELECT DISTINCT ON (r.domain) r.version, r.domain, r.yaml, r.deleted, v.created_at, v.author, v.message
		FROM domain_revisions r LEFT JOIN versions v ON v.version = r.version
		WHERE r.version <= ? ORDER BY r.domain, r.version DESC`, v).Scan(&rows).Error
	if err != nil {
		return nil, fmt.Errorf("read snapshot %d: %w", v, err)
	}
	out := make([]DomainRevision, 0, len(rows))
	for _, r := range rows {
		if !r.Deleted {
			out = append(out, r.revision())
		}
	}
	if err := attachOverrides(tx, v, out); err != nil {
		return nil, err
	}
	return out, nil
}

func (r snapshotRow) revision() DomainRevision {
	d := DomainRevision{Name: r.Domain, YAML: r.YAML, Version: r.Version}
	if r.CreatedAt != nil {
		d.ChangedAt = *r.CreatedAt
	}
	if r.Author != nil {
		d.Author = *r.Author
	}
	if r.Message != nil {
		d.Message = *r.Message
	}
	return d
}

// revisionAt returns domain's newest revision at or before version v, or nil.
func revisionAt(tx *gorm.DB, domain string, v int64) (*revisionRow, error) {
	var rows []revisionRow
	err := tx.Where("domain = ? AND version <= ?", domain, v).Order("version DESC").Limit(1).Find(&rows).Error
	if err != nil {
		return nil, fmt.Errorf("read domain %q: %w", domain, err)
	}
	if len(rows) == 0 {
		return nil, nil
	}
	return &rows[0], nil
}

func checksum(domains []DomainRevision) string {
	return Snapshot{Domains: domains}.checksum()
}

func (s Snapshot) checksum() string { return wire.Checksum(s.WireDomains()) }

// CurrentVersion returns the latest published version (0 before the first).
func (s *Store) CurrentVersion(ctx context.Context) (int64, error) {
	return headVersion(s.db.WithContext(ctx))
}

// FindSnapshot returns the ruleset at version v; v = 0 means the latest.
func (s *Store) FindSnapshot(ctx context.Context, v int64) (Snapshot, error) {
	var snap Snapshot
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if v == 0 {
			var err error
			if v, err = headVersion(tx); err != nil {
				return err
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
		return tx.Raw("SELECT coalesce(max(version), 0) FROM domain_revisions WHERE version <= ?", v).Scan(&snap.RulesVersion).Error
	}, readOnly)
	return snap, err
}

// readOnly runs a multi-statement read against one consistent snapshot.
var readOnly = &sql.TxOptions{ReadOnly: true, Isolation: sql.LevelRepeatableRead}

// FindVersion returns one version's metadata.
func (s *Store) FindVersion(ctx context.Context, v int64) (Version, error) {
	var row versionRow
	if err := s.db.WithContext(ctx).Where("version = ?", v).Take(&row).Error; err != nil {
		return Version{}, notFound(err, fmt.Sprintf("version %d", v))
	}
	out := []Version{row.version()}
	if err := s.fillDomains(ctx, out); err != nil {
		return Version{}, err
	}
	return out[0], nil
}

// FindDomain returns a domain as of the latest version.
func (s *Store) FindDomain(ctx context.Context, name string) (DomainRevision, error) {
	var rows []snapshotRow
	err := s.db.WithContext(ctx).Raw(`SELECT r.version, r.domain, r.yaml, r.deleted, v.created_at, v.author, v.message
		FROM domain_revisions r JOIN versions v ON v.version = r.version
		WHERE r.domain = ? ORDER BY r.version DESC LIMIT 1`, name).Scan(&rows).Error
	if err != nil {
		return DomainRevision{}, fmt.Errorf("read domain %q: %w", name, err)
	}
	if len(rows) == 0 || rows[0].Deleted {
		return DomainRevision{}, fmt.Errorf("domain %q: %w", name, ErrNotFound)
	}
	return rows[0].revision(), nil
}

// VersionFilter narrows ListVersions. Zero fields do not filter.
type VersionFilter struct {
	Domain string    // versions that changed this domain
	Author string    // exact author, like "user:alice"
	Since  time.Time // created at or after
	Until  time.Time // created before
	Before int64     // cursor: only versions < Before
	Limit  int       // page size, 1..1000 (default 100)
}

// ListVersions returns a page of versions, newest first, and the cursor of
// the next page (0 when this is the last).
func (s *Store) ListVersions(ctx context.Context, f VersionFilter) ([]Version, int64, error) {
	q := s.db.WithContext(ctx).Model(&versionRow{}).Order("version DESC")
	if f.Domain != "" {
		q = q.Where(`EXISTS (SELECT 1 FROM domain_revisions r WHERE r.version = versions.version AND r.domain = ?)
			OR EXISTS (SELECT 1 FROM overrides o WHERE o.domain = ? AND versions.version IN (o.version, o.ended_version))`, f.Domain, f.Domain)
	}
	if f.Author != "" {
		q = q.Where("author = ?", f.Author)
	}
	if !f.Since.IsZero() {
		q = q.Where("created_at >= ?", f.Since)
	}
	if !f.Until.IsZero() {
		q = q.Where("created_at < ?", f.Until)
	}
	if f.Before > 0 {
		q = q.Where("version < ?", f.Before)
	}
	limit := pageSize(f.Limit)
	var rows []versionRow
	if err := q.Limit(limit + 1).Find(&rows).Error; err != nil {
		return nil, 0, fmt.Errorf("list versions: %w", err)
	}
	var next int64
	if len(rows) > limit {
		rows = rows[:limit]
		next = rows[limit-1].Version
	}
	out := make([]Version, len(rows))
	for i, r := range rows {
		out[i] = r.version()
	}
	if err := s.fillDomains(ctx, out); err != nil {
		return nil, 0, err
	}
	return out, next, nil
}

// fillDomains sets the Domains each version changed.
func (s *Store) fillDomains(ctx context.Context, vs []Version) error {
	if len(vs) == 0 {
		return nil
	}
	ids := make([]int64, len(vs))
	at := make(map[int64]int, len(vs))
	for i, v := range vs {
		ids[i] = v.Version
		at[v.Version] = i
	}
	var rows []revisionRow
	err := s.db.WithContext(ctx).Select("version", "domain").Where("version IN ?", ids).
		Order(clause.OrderByColumn{Column: clause.Column{Name: "domain"}}).Find(&rows).Error
	if err != nil {
		return fmt.Errorf("list changed domains: %w", err)
	}
	changed := make(map[int64][]string, len(vs))
	for _, r := range rows {
		changed[r.Version] = append(changed[r.Version], r.Domain)
	}
	if err := overrideDomainsOf(s.db.WithContext(ctx), ids, changed); err != nil {
		return err
	}
	for v, ds := range changed {
		slices.Sort(ds)
		vs[at[v]].Domains = ds
	}
	return nil
}

// pageSize bounds a requested page size.
func pageSize(n int) int {
	if n <= 0 {
		return 100
	}
	return min(n, 1000)
}
