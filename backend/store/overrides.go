package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/sluicehq/sluice/rules"
)

// Temporary overrides live in their own table, beside the domains' YAML:
// the version that publishes one and the version that removes it bound the
// versions whose snapshot carries it. A snapshot's domain keeps its own
// YAML (what staff wrote, what GET /domains and `sluice ctl rules export`
// show) and lists the overrides in effect; what nodes get, and what the
// checksum and version diffs cover, is that YAML with the overrides
// appended as its overrides section (rules.WithOverrides). So editing a
// domain keeps its overrides, and enforcers need nothing new.

// Override statuses.
const (
	OverrideActive  = "active"
	OverrideExpired = "expired" // ended by the console at expires_at
	OverrideEnded   = "ended"   // ended early by someone, or with its domain
)

// Kinds of change for overrides (see Change).
const (
	// KindOverride publishes Change.Override.
	KindOverride ChangeKind = "override"
	// KindOverrideEnd removes override Change.OverrideID, with status
	// Change.EndStatus (OverrideEnded or OverrideExpired). It never waits
	// for approval: it only returns a customer to the reviewed rules.
	KindOverrideEnd ChangeKind = "override_end"
)

// Bounds of an override.
const (
	// MaxOverrideLifetime is how far ahead an override may expire.
	MaxOverrideLifetime = 90 * 24 * time.Hour
	// MaxActiveOverrides bounds a domain's active overrides.
	MaxActiveOverrides = rules.MaxOverrides
)

// OverrideRate is an override's rate.
type OverrideRate struct {
	Unit            string `json:"unit"`
	RequestsPerUnit uint32 `json:"requests_per_unit"`
}

// OverrideSpec is an override as asked for. The caller checks its shape
// (entries, unit, message); the store checks it against the domain.
type OverrideSpec struct {
	Domain    string        `json:"domain"`
	Entries   []rules.Entry `json:"entries"`
	RateLimit OverrideRate  `json:"rate_limit"`
	ExpiresAt time.Time     `json:"expires_at"`
	Message   string        `json:"message"`
	// Urgent publishes at once although approval is required (audited
	// override.break_glass).
	Urgent bool `json:"urgent,omitempty"`
}

// Override is a temporary override and what became of it.
type Override struct {
	ID           int64         `json:"id"`
	Domain       string        `json:"domain"`
	Entries      []rules.Entry `json:"entries"`
	RateLimit    OverrideRate  `json:"rate_limit"`
	ExpiresAt    time.Time     `json:"expires_at"`
	Status       string        `json:"status"`
	Author       string        `json:"author"`
	Message      string        `json:"message"`
	Version      int64         `json:"version"`
	CreatedAt    time.Time     `json:"created_at"`
	Urgent       bool          `json:"urgent"`
	ChangeID     *int64        `json:"change_id,omitempty"`
	EndedVersion *int64        `json:"ended_version"`
	EndedAt      *time.Time    `json:"ended_at"`
	EndedBy      string        `json:"ended_by,omitempty"`
	EndMessage   string        `json:"end_message,omitempty"`
}

// ActiveOverride is an override as a snapshot carries it.
type ActiveOverride struct {
	ID        int64         `json:"id"`
	Entries   []rules.Entry `json:"entries"`
	RateLimit OverrideRate  `json:"rate_limit"`
	ExpiresAt time.Time     `json:"expires_at"`
	// note is the comment the override gets in the enforced YAML.
	note string
}

// UnprocessableError reports a well-formed request the current rules
// cannot take (an override whose entries match no limit); its message is
// safe to show.
type UnprocessableError struct{ Reason string }

func (e *UnprocessableError) Error() string { return e.Reason }

type overrideRow struct {
	ID              int64 `gorm:"primaryKey"`
	Domain          string
	Entries         []rules.Entry `gorm:"serializer:json"`
	EntriesKey      string
	Unit            string
	RequestsPerUnit int64
	ExpiresAt       time.Time
	Message         string
	Author          string
	CreatedAt       time.Time
	Version         int64
	Urgent          bool
	ChangeID        *int64
	Status          string
	EndedVersion    *int64
	EndedAt         *time.Time
	EndedBy         string
	EndMessage      string
}

func (overrideRow) TableName() string { return "overrides" }

func (r overrideRow) override() Override {
	return Override{ID: r.ID, Domain: r.Domain, Entries: r.Entries,
		RateLimit: OverrideRate{Unit: r.Unit, RequestsPerUnit: uint32(r.RequestsPerUnit)},
		ExpiresAt: r.ExpiresAt.UTC(), Status: r.Status, Author: r.Author, Message: r.Message, Version: r.Version,
		CreatedAt: r.CreatedAt.UTC(), Urgent: r.Urgent, ChangeID: r.ChangeID, EndedVersion: r.EndedVersion,
		EndedAt: r.EndedAt, EndedBy: r.EndedBy, EndMessage: r.EndMessage}
}

func (r overrideRow) active() ActiveOverride {
	note := fmt.Sprintf("override %d by %s until %s: %s", r.ID, r.Author, r.ExpiresAt.UTC().Format(time.RFC3339), r.Message)
	return ActiveOverride{ID: r.ID, Entries: r.Entries, RateLimit: OverrideRate{Unit: r.Unit, RequestsPerUnit: uint32(r.RequestsPerUnit)},
		ExpiresAt: r.ExpiresAt.UTC(), note: note}
}

// entriesKey is entries in one canonical text, for the one-active-override
// per descriptor rule.
func entriesKey(entries []rules.Entry) string {
	b, _ := json.Marshal(entries) // plain strings: cannot fail
	return string(b)
}

// Enforced returns the YAML nodes enforce for d: its own YAML with its
// overrides appended as its overrides section (see rules.WithOverrides).
func (d DomainRevision) Enforced() string {
	if d.enforced != "" {
		return d.enforced
	}
	return d.YAML
}

// WithOverride returns d with o added to its overrides, as a version
// publishing o would carry it (for previews of pending changes).
func (d DomainRevision) WithOverride(o ActiveOverride) DomainRevision {
	d.Overrides = append(slices.Clone(d.Overrides), o)
	d.enforced = enforcedYAML(d.Name, d.YAML, d.Overrides)
	return d
}

// WithYAML returns d (named domain, in case d is the zero value of a new
// domain) with its own YAML replaced by src and its overrides kept over it,
// as a version publishing src would carry it.
func (d DomainRevision) WithYAML(domain, src string) DomainRevision {
	d.Name, d.YAML = domain, src
	d.enforced = enforcedYAML(d.Name, d.YAML, d.Overrides)
	return d
}

// enforcedYAML composes a domain's YAML with its overrides. An override
// its rules no longer take (they changed since) is left out; YAML that does
// not parse (a stricter parser since it was published) is returned as it
// is, for the nodes to refuse as they would without overrides.
func enforcedYAML(domain, src string, ovs []ActiveOverride) string {
	if len(ovs) == 0 {
		return ""
	}
	list := make([]rules.Override, len(ovs))
	notes := make([]string, len(ovs))
	for i, o := range ovs {
		list[i] = rules.Override{Entries: o.Entries, Unit: rules.Unit(o.RateLimit.Unit), RequestsPerUnit: o.RateLimit.RequestsPerUnit}
		notes[i] = o.note
	}
	out, _, err := rules.WithOverrides(domain+".yaml", []byte(src), list, notes)
	if err != nil {
		return ""
	}
	return string(out)
}

// attachOverrides adds to domains (a snapshot at version v) the overrides
// in effect at v.
func attachOverrides(tx *gorm.DB, v int64, domains []DomainRevision) error {
	var rows []overrideRow
	err := tx.Where("version <= ? AND (ended_version IS NULL OR ended_version > ?)", v, v).Order("domain, id").Find(&rows).Error
	if err != nil {
		return fmt.Errorf("read overrides of version %d: %w", v, err)
	}
	if len(rows) == 0 {
		return nil
	}
	byDomain := make(map[string][]ActiveOverride)
	for _, r := range rows {
		byDomain[r.Domain] = append(byDomain[r.Domain], r.active())
	}
	var kept []enforcedRow
	if err := tx.Where("version = ?", v).Find(&kept).Error; err != nil {
		return fmt.Errorf("read enforced domains of version %d: %w", v, err)
	}
	stored := make(map[string]string, len(kept))
	for _, k := range kept {
		stored[k.Domain] = k.YAML
	}
	for i := range domains {
		d := &domains[i]
		if ovs := byDomain[d.Name]; len(ovs) > 0 {
			d.Overrides = ovs
			if y, ok := stored[d.Name]; ok {
				d.enforced = y
			} else {
				d.enforced = enforcedYAML(d.Name, d.YAML, ovs)
			}
		}
	}
	return nil
}

// enforcedRow is the YAML a domain with overrides was sent as in a version.
type enforcedRow struct {
	Version int64  `gorm:"primaryKey"`
	Domain  string `gorm:"primaryKey"`
	YAML    string `gorm:"column:yaml"`
}

func (enforcedRow) TableName() string { return "enforced_domains" }

// keepEnforced records what version v sends for each of its domains with
// overrides (domains, as snapshotAt composed them while v is written), so
// that reading v later gives the same YAML and checksum.
func keepEnforced(tx *gorm.DB, v int64, domains []DomainRevision) error {
	var rows []enforcedRow
	for _, d := range domains {
		if d.enforced != "" {
			rows = append(rows, enforcedRow{Version: v, Domain: d.Name, YAML: d.enforced})
		}
	}
	if len(rows) == 0 {
		return nil
	}
	if err := tx.Create(&rows).Error; err != nil {
		return fmt.Errorf("write enforced domains of version %d: %w", v, err)
	}
	return nil
}

// resolveOverride checks an override change against the ruleset at head.
func resolveOverride(tx *gorm.DB, c Change, p *plan, head int64) error {
	p.checkBase = false
	switch c.Kind {
	case KindOverride:
		if c.Override == nil {
			return &InvalidError{Reason: "an override change needs the override"}
		}
		spec := *c.Override
		p.override, p.domain = &spec, spec.Domain
	case KindOverrideEnd:
		if c.EndStatus != OverrideEnded && c.EndStatus != OverrideExpired {
			return &InvalidError{Reason: fmt.Sprintf("an override ends as %s or %s, not %q", OverrideEnded, OverrideExpired, c.EndStatus)}
		}
		var row overrideRow
		if err := tx.Clauses(clause.Locking{Strength: "UPDATE"}).Where("id = ?", c.OverrideID).Take(&row).Error; err != nil {
			return notFound(err, fmt.Sprintf("override %d", c.OverrideID))
		}
		if row.Status != OverrideActive {
			return &RefusedError{Reason: fmt.Sprintf("override %d is already %s", row.ID, row.Status)}
		}
		p.overrideID, p.endStatus, p.domain = row.ID, c.EndStatus, row.Domain
	}
	return nil
}

// checkOverride refuses to publish the override of p at head + 1: its
// domain must exist, its entries match a limit there, no other active
// override have the same entries, and its expiry be ahead.
func checkOverride(tx *gorm.DB, p plan, head int64) error {
	if p.kind == KindOverrideEnd {
		return nil // resolve locked and checked the row
	}
	o := p.override
	last, err := revisionAt(tx, o.Domain, head)
	if err != nil {
		return err
	}
	if last == nil || last.Deleted {
		return fmt.Errorf("domain %q: %w", o.Domain, rules.ErrNotFound)
	}
	if !o.ExpiresAt.After(time.Now()) {
		return &UnprocessableError{Reason: fmt.Sprintf("the override expires at %s, which has passed", o.ExpiresAt.UTC().Format(time.RFC3339))}
	}
	d, err := rules.Parse(o.Domain+".yaml", []byte(last.YAML))
	if err != nil {
		return fmt.Errorf("domain %q as published does not parse: %w", o.Domain, err)
	}
	d.Overrides = []rules.Override{{Entries: o.Entries, Unit: rules.Unit(o.RateLimit.Unit), RequestsPerUnit: o.RateLimit.RequestsPerUnit}}
	if _, err := rules.Compile([]*rules.Domain{d}); err != nil {
		var ve *rules.ValidationError
		if errors.As(err, &ve) && len(ve.Problems) > 0 {
			msgs := make([]string, len(ve.Problems))
			for i, pr := range ve.Problems {
				msgs[i] = pr.Message
			}
			return &UnprocessableError{Reason: strings.Join(msgs, "; ")}
		}
		return err
	}
	var rows []overrideRow
	err = tx.Where("domain = ? AND status = ?", o.Domain, OverrideActive).Find(&rows).Error
	if err != nil {
		return fmt.Errorf("read active overrides: %w", err)
	}
	key := entriesKey(o.Entries)
	for _, r := range rows {
		if r.EntriesKey == key {
			return &RefusedError{Reason: fmt.Sprintf("override %d already gives %s another rate until %s: end it first",
				r.ID, rules.FormatEntries(o.Entries), r.ExpiresAt.UTC().Format(time.RFC3339))}
		}
	}
	if len(rows) >= MaxActiveOverrides {
		return &RefusedError{Reason: fmt.Sprintf("domain %q has %d active overrides, the most it may have", o.Domain, len(rows))}
	}
	return nil
}

// applyOverride writes the override of p and version v with its audit
// event (override.create), or ends override p.overrideID in v
// (override.end, or override.expire when the console ends it at its
// expiry).
func applyOverride(tx *gorm.DB, p plan, v int64, meta versionMeta, act Actor) error {
	if p.kind == KindOverrideEnd {
		return endOverride(tx, p, v, meta, act)
	}
	o := p.override
	row := overrideRow{Domain: o.Domain, Entries: o.Entries, EntriesKey: entriesKey(o.Entries), Unit: o.RateLimit.Unit,
		RequestsPerUnit: int64(o.RateLimit.RequestsPerUnit), ExpiresAt: o.ExpiresAt.UTC(), Message: o.Message,
		Author: meta.author, CreatedAt: time.Now().UTC(), Version: v, Urgent: o.Urgent && meta.breakGlass,
		ChangeID: meta.changeID, Status: OverrideActive}
	if err := tx.Create(&row).Error; err != nil {
		return fmt.Errorf("write override: %w", err)
	}
	if err := writeVersion(tx, v, p, meta); err != nil {
		return err
	}
	after := map[string]any{"id": row.ID, "version": v, "entries": row.Entries, "rate_limit": o.RateLimit,
		"expires_at": row.ExpiresAt.Format(time.RFC3339)}
	addMeta(after, p, meta)
	return appendAudit(tx, act, "override.create", "domain:"+o.Domain, o.Message, nil, after)
}

func endOverride(tx *gorm.DB, p plan, v int64, meta versionMeta, act Actor) error {
	now := time.Now().UTC()
	// The status guard makes ending happen once, whoever tries: a second
	// replica expiring the same override waits on the row lock taken in
	// resolve, then finds it ended and writes nothing.
	res := tx.Model(&overrideRow{}).Where("id = ? AND status = ?", p.overrideID, OverrideActive).Updates(map[string]any{
		"status": p.endStatus, "ended_version": v, "ended_at": now, "ended_by": act.Name, "end_message": meta.message,
	})
	if res.Error != nil {
		return fmt.Errorf("end override %d: %w", p.overrideID, res.Error)
	}
	if res.RowsAffected != 1 {
		return &RefusedError{Reason: fmt.Sprintf("override %d is no longer active", p.overrideID)}
	}
	if err := writeVersion(tx, v, p, meta); err != nil {
		return err
	}
	action := "override.end"
	if p.endStatus == OverrideExpired {
		action = "override.expire"
	}
	return appendAudit(tx, act, action, "domain:"+p.domain, meta.message,
		map[string]any{"id": p.overrideID, "status": OverrideActive},
		map[string]any{"id": p.overrideID, "status": p.endStatus, "version": v})
}

// endOverridesOfDeleted ends, in version v, the active overrides of the
// domains v deletes: an override does not outlive its domain (and come
// back if a domain of that name is made again).
func endOverridesOfDeleted(tx *gorm.DB, v int64, meta versionMeta) error {
	var rows []overrideRow
	err := tx.Where("status = ? AND domain IN (SELECT domain FROM domain_revisions WHERE version = ? AND deleted)", OverrideActive, v).
		Find(&rows).Error
	if err != nil {
		return fmt.Errorf("read overrides of deleted domains: %w", err)
	}
	for _, r := range rows {
		err := tx.Model(&overrideRow{}).Where("id = ?", r.ID).Updates(map[string]any{
			"status": OverrideEnded, "ended_version": v, "ended_at": time.Now().UTC(), "ended_by": meta.author,
			"end_message": "its domain was deleted: " + meta.message,
		}).Error
		if err != nil {
			return fmt.Errorf("end override %d: %w", r.ID, err)
		}
		err = appendAudit(tx, Actor{Name: meta.author}, "override.end", "domain:"+r.Domain, "its domain was deleted",
			map[string]any{"id": r.ID, "status": OverrideActive}, map[string]any{"id": r.ID, "status": OverrideEnded, "version": v})
		if err != nil {
			return err
		}
	}
	return nil
}

// FindOverride returns one override.
func (s *Store) FindOverride(ctx context.Context, id int64) (Override, error) {
	var row overrideRow
	if err := s.db.WithContext(ctx).Where("id = ?", id).Take(&row).Error; err != nil {
		return Override{}, notFound(err, fmt.Sprintf("override %d", id))
	}
	return row.override(), nil
}

// OverrideFilter narrows ListOverrides. Zero fields do not filter.
type OverrideFilter struct {
	Domain string
	Status string
	Before int64 // cursor: only overrides with ID < Before
	Limit  int   // page size, 1..1000 (default 100)
}

// ListOverrides returns a page of overrides, newest first, and the cursor
// of the next page (0 when this is the last).
func (s *Store) ListOverrides(ctx context.Context, f OverrideFilter) ([]Override, int64, error) {
	q := s.db.WithContext(ctx).Order("id DESC")
	if f.Domain != "" {
		q = q.Where("domain = ?", f.Domain)
	}
	if f.Status != "" {
		q = q.Where("status = ?", f.Status)
	}
	if f.Before > 0 {
		q = q.Where("id < ?", f.Before)
	}
	limit := pageSize(f.Limit)
	var rows []overrideRow
	if err := q.Limit(limit + 1).Find(&rows).Error; err != nil {
		return nil, 0, fmt.Errorf("list overrides: %w", err)
	}
	var next int64
	if len(rows) > limit {
		rows = rows[:limit]
		next = rows[limit-1].ID
	}
	out := make([]Override, len(rows))
	for i, r := range rows {
		out[i] = r.override()
	}
	return out, next, nil
}

// CreateOverride publishes spec as a new version and returns the
// override's id and the version. When approval is required and spec is not
// urgent it returns ErrApprovalRequired and writes nothing (propose a
// Change of KindOverride instead).
func (s *Store) CreateOverride(ctx context.Context, spec OverrideSpec, act Actor) (id, version int64, err error) {
	v, err := s.Publish(ctx, Change{Kind: KindOverride, Domain: spec.Domain, Override: &spec, Message: spec.Message, Actor: act})
	if err != nil {
		return 0, 0, err
	}
	err = s.db.WithContext(ctx).Model(&overrideRow{}).Select("id").Where("version = ?", v).Scan(&id).Error
	if err != nil {
		return 0, 0, fmt.Errorf("read override of version %d: %w", v, err)
	}
	return id, v, nil
}

// EndOverride publishes a version without active override id, with status
// (OverrideEnded, or OverrideExpired when the console ends it at its
// expiry), and returns the version.
func (s *Store) EndOverride(ctx context.Context, id int64, status, message string, act Actor) (int64, error) {
	return s.Publish(ctx, Change{Kind: KindOverrideEnd, OverrideID: id, EndStatus: status, Message: message, Actor: act})
}

// ExpireOverrides ends, each in its own version authored by SystemActor
// (audited override.expire), every active override whose expiry is at or
// before now, and returns the versions it published. Any number of
// replicas may call it at once: each override is expired exactly once.
func (s *Store) ExpireOverrides(ctx context.Context, now time.Time) ([]int64, error) {
	var due []overrideRow
	err := s.db.WithContext(ctx).Where("status = ? AND expires_at <= ?", OverrideActive, now.UTC()).
		Order("expires_at, id").Limit(100).Find(&due).Error
	if err != nil {
		return nil, fmt.Errorf("find expired overrides: %w", err)
	}
	var versions []int64
	var errs []error
	for _, r := range due {
		msg := fmt.Sprintf("override %d expired at %s (%s)", r.ID, r.ExpiresAt.UTC().Format(time.RFC3339), r.Message)
		v, err := s.EndOverride(ctx, r.ID, OverrideExpired, msg, SystemActor)
		var re *RefusedError
		switch {
		case errors.As(err, &re):
			// Another replica expired it first, or a rollout is staged:
			// the next round tries again if it is still active.
		case err != nil:
			errs = append(errs, err)
		default:
			versions = append(versions, v)
		}
	}
	return versions, errors.Join(errs...)
}

// NextOverrideExpiry returns the earliest expiry of an active override, or
// the zero time when none is active.
func (s *Store) NextOverrideExpiry(ctx context.Context) (time.Time, error) {
	var at *time.Time
	err := s.db.WithContext(ctx).Model(&overrideRow{}).Select("min(expires_at)").Where("status = ?", OverrideActive).Scan(&at).Error
	if err != nil {
		return time.Time{}, fmt.Errorf("read next override expiry: %w", err)
	}
	if at == nil {
		return time.Time{}, nil
	}
	return at.UTC(), nil
}

// overrideDomainsOf adds to changed (version → domains) the domains whose
// overrides the versions started or ended.
func overrideDomainsOf(db *gorm.DB, ids []int64, changed map[int64][]string) error {
	var rows []struct {
		Version int64
		Domain  string
	}
	err := db.Raw(`SELECT version, domain FROM overrides WHERE version IN ?
		UNION SELECT ended_version, domain FROM overrides WHERE ended_version IN ?`, ids, ids).Scan(&rows).Error
	if err != nil {
		return fmt.Errorf("list domains of overrides: %w", err)
	}
	for _, r := range rows {
		if !slices.Contains(changed[r.Version], r.Domain) {
			changed[r.Version] = append(changed[r.Version], r.Domain)
		}
	}
	return nil
}
