package store

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

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

// ChangeKind says what a Change does.
type ChangeKind string

// Kinds of change.
const (
	// KindPublish sets one domain's YAML (creating the domain if needed).
	KindPublish ChangeKind = "publish"
	// KindDelete removes one domain.
	KindDelete ChangeKind = "delete"
	// KindDomainRollback sets one domain back to its content at RollbackTo
	// (removing it if it did not exist then).
	KindDomainRollback ChangeKind = "domain_rollback"
	// KindRollback sets the whole ruleset back to version RollbackTo.
	KindRollback ChangeKind = "rollback"
	// KindRuleset sets several domains and removes some (Edits), in one
	// version (see ruleset.go).
	KindRuleset ChangeKind = "ruleset"
)

// Change is a request to publish a new version. The YAML must have been
// validated by the caller.
type Change struct {
	Kind   ChangeKind // "" means KindPublish
	Domain string     // empty for KindRollback
	YAML   string     // KindPublish only
	// BaseVersion is the version the author looked at. For KindPublish and
	// KindDelete it is the domain's version they edited (0 for a new domain):
	// the change fails with a *ConflictError if the domain changed after it.
	// For rollbacks it is optional (0 = no check); when set, the change fails
	// if the domain (KindDomainRollback) or the ruleset (KindRollback)
	// changed after it.
	BaseVersion int64
	RollbackTo  int64 // the version to go back to, for rollbacks
	Message     string
	Actor       Actor
	// BreakGlass is an admin's reason to publish directly although approval
	// is required; it is audited. Callers check the role. Ignored when
	// approval is not required.
	BreakGlass string
	// Edits are the domains a KindRuleset change sets or removes; its
	// BaseVersion is the ruleset version the author saw, and it fails with
	// a *ConflictError if any of these domains changed after it.
	Edits []DomainEdit
	// Rollout, for KindPublish, stages the new version to the nodes it
	// selects (see rollout.go); nil sends it to every node.
	Rollout *RolloutSpec
	// Override is what a KindOverride change publishes; OverrideID and
	// EndStatus say which override a KindOverrideEnd change ends, and how
	// (see overrides.go).
	Override   *OverrideSpec
	OverrideID int64
	EndStatus  string
}

// ErrApprovalRequired is returned by Publish when the require_approval
// setting is on and the change does not break glass: propose it instead.
var ErrApprovalRequired = errors.New("approval required")

// ConflictError reports that a domain (or, with an empty Domain, the
// ruleset) changed after the author's base version.
type ConflictError struct {
	Domain    string
	Base      int64
	ChangedIn int64
}

func (e *ConflictError) Error() string {
	if e.Domain == "" {
		return fmt.Sprintf("the ruleset changed in version %d, after base version %d", e.ChangedIn, e.Base)
	}
	return fmt.Sprintf("domain %q changed in version %d, after base version %d", e.Domain, e.ChangedIn, e.Base)
}

// Unwrap makes errors.Is(err, rules.ErrConflict) true.
func (e *ConflictError) Unwrap() error { return rules.ErrConflict }

// InvalidError reports a request that can never succeed as given; its
// message is safe to show.
type InvalidError struct{ Reason string }

func (e *InvalidError) Error() string { return e.Reason }

// RefusedError reports a request that the current state forbids (disabling
// the last admin, approving a decided change); its message is safe to show.
type RefusedError struct{ Reason string }

func (e *RefusedError) Error() string { return e.Reason }

// Unwrap makes errors.Is(err, rules.ErrConflict) true.
func (e *RefusedError) Unwrap() error { return rules.ErrConflict }

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

// nextVersion increments the head row, locking it until tx ends: publishers
// queue here, so versions are contiguous and never reused.
func nextVersion(tx *gorm.DB) (int64, error) {
	var v int64
	if err := tx.Raw("UPDATE ruleset_head SET version = version + 1 RETURNING version").Scan(&v).Error; err != nil {
		return 0, fmt.Errorf("allocate version: %w", err)
	}
	return v, nil
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

// plan is a change resolved against the database: what to write and what to
// check before writing it.
type plan struct {
	kind       ChangeKind
	domain     string
	yaml       string
	deleted    bool
	base       int64
	checkBase  bool
	rollbackOf *int64
	edits      []DomainEdit // KindRuleset only
	// KindOverride and KindOverrideEnd only.
	override   *OverrideSpec
	overrideID int64
	endStatus  string
}

// resolve checks c against the ruleset at head and works out its content.
func resolve(tx *gorm.DB, c Change, head int64) (plan, error) {
	if c.Kind == "" {
		c.Kind = KindPublish
	}
	if c.BaseVersion < 0 || c.BaseVersion > head {
		return plan{}, &InvalidError{Reason: fmt.Sprintf("base_version %d is not a published version (latest is %d)", c.BaseVersion, head)}
	}
	p := plan{kind: c.Kind, domain: c.Domain, base: c.BaseVersion, checkBase: true}
	switch c.Kind {
	case KindPublish:
		if c.Domain == "" {
			return plan{}, &InvalidError{Reason: "a domain is required"}
		}
		p.yaml = c.YAML
	case KindDelete:
		if c.Domain == "" {
			return plan{}, &InvalidError{Reason: "a domain is required"}
		}
		p.deleted = true
	case KindRuleset:
		if c.Domain != "" {
			return plan{}, &InvalidError{Reason: "a ruleset change takes no domain: its edits name them"}
		}
		edits, err := normalEdits(c.Edits)
		if err != nil {
			return plan{}, err
		}
		p.edits = edits
	case KindOverride, KindOverrideEnd:
		if err := resolveOverride(tx, c, &p, head); err != nil {
			return plan{}, err
		}
	case KindDomainRollback, KindRollback:
		if c.RollbackTo <= 0 || c.RollbackTo > head {
			return plan{}, fmt.Errorf("version %d: %w", c.RollbackTo, rules.ErrNotFound)
		}
		to := c.RollbackTo
		p.rollbackOf = &to
		if c.BaseVersion == 0 {
			p.checkBase = false
		}
		if c.Kind == KindRollback {
			if c.Domain != "" {
				return plan{}, &InvalidError{Reason: "a ruleset rollback takes no domain"}
			}
			if !p.checkBase {
				p.base = head
			}
			break
		}
		if c.Domain == "" {
			return plan{}, &InvalidError{Reason: "a domain is required"}
		}
		target, err := revisionAt(tx, c.Domain, to)
		if err != nil {
			return plan{}, err
		}
		if target == nil || target.Deleted {
			p.deleted = true
		} else {
			p.yaml = target.YAML
		}
		if !p.checkBase {
			last, err := revisionAt(tx, c.Domain, head)
			if err != nil {
				return plan{}, err
			}
			if last != nil {
				p.base = last.Version
			}
		}
	default:
		return plan{}, &InvalidError{Reason: fmt.Sprintf("unknown change kind %q", c.Kind)}
	}
	if err := check(tx, p, head); err != nil {
		return plan{}, err
	}
	return p, nil
}

// check refuses p if its base moved or its domain cannot take it.
func check(tx *gorm.DB, p plan, head int64) error {
	if p.kind == KindRuleset {
		return checkEdits(tx, p, head)
	}
	if p.kind == KindOverride || p.kind == KindOverrideEnd {
		return checkOverride(tx, p, head)
	}
	if p.kind == KindRollback {
		if p.checkBase && head > p.base {
			return &ConflictError{Base: p.base, ChangedIn: head}
		}
		return nil
	}
	last, err := revisionAt(tx, p.domain, head)
	if err != nil {
		return err
	}
	if p.checkBase && last != nil && last.Version > p.base {
		return &ConflictError{Domain: p.domain, Base: p.base, ChangedIn: last.Version}
	}
	if p.deleted && (last == nil || last.Deleted) {
		if p.kind == KindDomainRollback {
			return fmt.Errorf("domain %q exists neither in version %d nor now: %w", p.domain, *p.rollbackOf, rules.ErrNotFound)
		}
		return fmt.Errorf("domain %q: %w", p.domain, rules.ErrNotFound)
	}
	return nil
}

// versionMeta describes the version a plan becomes.
type versionMeta struct {
	author     string
	message    string
	approvedBy *string
	changeID   *int64
	breakGlass bool // published although approval is required
}

// apply writes p as version v, with its audit event by act. While a
// rollout is staged only a ruleset rollback may be written, and it ends the
// rollout (a *RefusedError otherwise).
func apply(tx *gorm.DB, p plan, v int64, meta versionMeta, act Actor) error {
	staged, err := stagedRollout(tx)
	if err != nil {
		return err
	}
	if staged != nil && p.kind != KindRollback {
		return refuseWhileStaged(staged)
	}
	if err := applyPlan(tx, p, v, meta, act); err != nil {
		return err
	}
	if staged != nil {
		return endRollout(tx, staged, RolloutRolledBack, &v, act, meta.message)
	}
	return nil
}

func applyPlan(tx *gorm.DB, p plan, v int64, meta versionMeta, act Actor) error {
	switch p.kind {
	case KindRollback:
		return applyRollback(tx, p, v, meta, act)
	case KindRuleset:
		return applyEdits(tx, p, v, meta, act)
	case KindOverride, KindOverrideEnd:
		return applyOverride(tx, p, v, meta, act)
	}
	before, err := revisionAt(tx, p.domain, v-1)
	if err != nil {
		return err
	}
	rev := revisionRow{Version: v, Domain: p.domain, YAML: p.yaml, Deleted: p.deleted}
	if err := tx.Create(&rev).Error; err != nil {
		return fmt.Errorf("write revision: %w", err)
	}
	if err := writeVersion(tx, v, p, meta); err != nil {
		return err
	}
	action := map[ChangeKind]string{KindPublish: "domain.publish", KindDelete: "domain.delete", KindDomainRollback: "domain.rollback"}[p.kind]
	return auditRevision(tx, act, action, before, rev, p, meta)
}

// auditRevision appends the audit event of one domain's revision rev of a
// version, with the domain's content before it.
func auditRevision(tx *gorm.DB, act Actor, action string, before *revisionRow, rev revisionRow, p plan, meta versionMeta) error {
	var b any
	if before != nil && !before.Deleted {
		b = map[string]any{"yaml": before.YAML, "version": before.Version}
	}
	after := map[string]any{"version": rev.Version, "deleted": rev.Deleted}
	if !rev.Deleted {
		after["yaml"] = rev.YAML
	}
	addMeta(after, p, meta)
	return appendAudit(tx, act, action, "domain:"+rev.Domain, meta.message, b, after)
}

func addMeta(after map[string]any, p plan, meta versionMeta) {
	if p.rollbackOf != nil {
		after["rollback_of"] = *p.rollbackOf
	}
	if meta.changeID != nil {
		after["change_id"] = *meta.changeID
		after["author"] = meta.author
	}
}

// applyRollback writes version v with the content of version p.rollbackOf,
// as revisions for just the domains that differ.
func applyRollback(tx *gorm.DB, p plan, v int64, meta versionMeta, act Actor) error {
	to := *p.rollbackOf
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
	have := make(map[string]bool, len(current))
	var writes []revisionRow
	for _, d := range current {
		have[d.Name] = true
		if y, ok := want[d.Name]; !ok {
			writes = append(writes, revisionRow{Version: v, Domain: d.Name, Deleted: true})
		} else if y != d.YAML {
			writes = append(writes, revisionRow{Version: v, Domain: d.Name, YAML: y})
		}
	}
	for _, d := range target {
		if !have[d.Name] {
			writes = append(writes, revisionRow{Version: v, Domain: d.Name, YAML: d.YAML})
		}
	}
	for i := range writes {
		if err := tx.Create(&writes[i]).Error; err != nil {
			return fmt.Errorf("write revision: %w", err)
		}
	}
	if err := writeVersion(tx, v, p, meta); err != nil {
		return err
	}
	after := map[string]any{"version": v}
	addMeta(after, p, meta)
	return appendAudit(tx, act, "version.rollback", fmt.Sprintf("version:%d", to), meta.message,
		map[string]any{"version": v - 1}, after)
}

// writeVersion writes the versions row of v, once its revisions are
// written. Every path that creates a version goes through it, so it is where
// a version too large for the nodes is refused (SnapshotTooLargeError).
func writeVersion(tx *gorm.DB, v int64, p plan, meta versionMeta) error {
	if err := endOverridesOfDeleted(tx, v, meta); err != nil {
		return err
	}
	domains, err := snapshotAt(tx, v)
	if err != nil {
		return err
	}
	if err := checkSnapshotSize(v, domains); err != nil {
		return err
	}
	if err := keepEnforced(tx, v, domains); err != nil {
		return err
	}
	row := versionRow{Version: v, CreatedAt: time.Now().UTC(), Author: meta.author, Message: meta.message,
		RollbackOf: p.rollbackOf, Checksum: checksum(domains), ApprovedBy: meta.approvedBy, ChangeID: meta.changeID}
	if err := tx.Create(&row).Error; err != nil {
		return fmt.Errorf("write version: %w", err)
	}
	return nil
}

// SnapshotTooLargeError reports a change whose version would not fit the
// snapshot message nodes accept (wire.MaxSnapshotBytes); its message is safe
// to show.
type SnapshotTooLargeError struct {
	Version int64
	Bytes   int
	Max     int
}

func (e *SnapshotTooLargeError) Error() string {
	return fmt.Sprintf("version %d would be a %d-byte snapshot, over the %d bytes enforcer nodes accept: make domains smaller or remove some",
		e.Version, e.Bytes, e.Max)
}

// checkSnapshotSize refuses version v if its snapshot, encoded as the hub
// sends it, would exceed wire.MaxSnapshotBytes.
func checkSnapshotSize(v int64, domains []DomainRevision) error {
	snap := Snapshot{Version: v, Domains: domains}
	data, err := json.Marshal(wire.Snapshot{Type: wire.TypeSnapshot, Version: v, Checksum: snap.checksum(), Domains: snap.WireDomains()})
	if err != nil {
		return fmt.Errorf("encode snapshot %d: %w", v, err)
	}
	if len(data) > wire.MaxSnapshotBytes {
		return &SnapshotTooLargeError{Version: v, Bytes: len(data), Max: wire.MaxSnapshotBytes}
	}
	return nil
}

// requireApproval reads the four-eyes setting, holding a share lock so that
// the setting cannot change before tx commits.
func requireApproval(tx *gorm.DB) (bool, error) {
	var on bool
	if err := tx.Raw("SELECT require_approval FROM settings FOR SHARE").Scan(&on).Error; err != nil {
		return false, fmt.Errorf("read settings: %w", err)
	}
	return on, nil
}

// Publish writes a new version from c, with its audit event, in one
// transaction, and returns the new version. When approval is required and c
// does not break glass it returns ErrApprovalRequired and writes nothing.
func (s *Store) Publish(ctx context.Context, c Change) (int64, error) {
	var version int64
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		required, err := requireApproval(tx)
		if err != nil {
			return err
		}
		// Ending an override only returns to reviewed rules: it never
		// waits. An urgent override breaks glass with its message.
		urgent := c.Kind == KindOverride && c.Override != nil && c.Override.Urgent
		required = required && c.Kind != KindOverrideEnd
		if required && c.BreakGlass == "" && !urgent {
			return ErrApprovalRequired
		}
		if c.Rollout != nil && c.Kind != KindPublish && c.Kind != "" {
			return &InvalidError{Reason: "only a domain publish can be staged"}
		}
		v, err := nextVersion(tx)
		if err != nil {
			return err
		}
		p, err := resolve(tx, c, v-1)
		if err != nil {
			return err
		}
		if err := apply(tx, p, v, versionMeta{author: c.Actor.Name, message: c.Message, breakGlass: required}, c.Actor); err != nil {
			return err
		}
		if c.Rollout != nil {
			if err := stage(tx, v, c.Rollout, c.Actor); err != nil {
				return err
			}
		}
		version = v
		if required && c.Kind == KindOverride {
			return appendAudit(tx, c.Actor, "override.break_glass", changeTarget(p), cmp.Or(c.BreakGlass, c.Message), nil,
				map[string]any{"version": v, "kind": string(p.kind), "message": c.Message})
		}
		if required {
			return appendAudit(tx, c.Actor, "change.break_glass", changeTarget(p), c.BreakGlass, nil,
				map[string]any{"version": v, "kind": string(p.kind), "message": c.Message})
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("publish %s: %w", describeChange(c), err)
	}
	return version, nil
}

func changeTarget(p plan) string {
	if p.kind == KindRollback || p.kind == KindRuleset {
		return "ruleset"
	}
	return "domain:" + p.domain
}

func describeChange(c Change) string {
	switch c.Kind {
	case KindRollback:
		return fmt.Sprintf("rollback to version %d", c.RollbackTo)
	case KindDomainRollback:
		return fmt.Sprintf("rollback of domain %q to version %d", c.Domain, c.RollbackTo)
	case KindDelete:
		return fmt.Sprintf("deletion of domain %q", c.Domain)
	case KindRuleset:
		return fmt.Sprintf("change of %d domains", len(c.Edits))
	case KindOverride:
		if c.Override != nil {
			return fmt.Sprintf("override of %s in domain %q", rules.FormatEntries(c.Override.Entries), c.Override.Domain)
		}
	case KindOverrideEnd:
		return fmt.Sprintf("end of override %d", c.OverrideID)
	}
	return fmt.Sprintf("domain %q", c.Domain)
}

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
		return DomainRevision{}, fmt.Errorf("domain %q: %w", name, rules.ErrNotFound)
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
