package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/sluicehq/sluice/rules/wire"
)

// Rollout states.
const (
	// RolloutStaged: the version runs on the nodes whose labels match; the
	// others stay on the base version.
	RolloutStaged = "staged"
	// RolloutPromoted: the version was sent to every node.
	RolloutPromoted = "promoted"
	// RolloutRolledBack: a rollback (a new version, sent to every node)
	// ended it.
	RolloutRolledBack = "rolled_back"
	// RolloutHalted: the console rolled it back by itself (auto halt).
	RolloutHalted = "halted"
)

// SystemActor is the author of what the console does by itself (an
// automatic halt).
var SystemActor = Actor{Name: "system"}

// AutoHalt is a staged rollout's automatic halt: the console rolls the
// version back when, for ForS consecutive seconds, the canary nodes' share
// of limited decisions is over Factor times the other nodes' and the canary
// limits at least MinLimitedPerS requests a second (so that a few 429s do
// not trigger it).
type AutoHalt struct {
	Factor         float64 `json:"factor"`
	MinLimitedPerS float64 `json:"min_limited_per_s"`
	ForS           int     `json:"for_s"`
}

// Bounds of an AutoHalt.
const (
	DefaultHaltForS = 3
	MaxHaltForS     = 600
)

// Check fills in ForS and says what is wrong, if anything.
func (h *AutoHalt) Check() error {
	if h.ForS == 0 {
		h.ForS = DefaultHaltForS
	}
	switch {
	case !(h.Factor >= 1 && h.Factor <= 1e6):
		return fmt.Errorf("auto_halt.factor must be a number from 1 to 1000000 (the canary's 429 rate over this many times the others')")
	case !(h.MinLimitedPerS > 0 && h.MinLimitedPerS <= 1e9):
		return fmt.Errorf("auto_halt.min_limited_per_s must be a positive number (at most 1e9): below it the canary's 429s are noise")
	case h.ForS < 1 || h.ForS > MaxHaltForS:
		return fmt.Errorf("auto_halt.for_s must be 1..%d seconds", MaxHaltForS)
	}
	return nil
}

// RolloutSpec is how a publish is staged: to the nodes whose labels include
// every one of Labels.
type RolloutSpec struct {
	Labels   map[string]string `json:"labels"`
	AutoHalt *AutoHalt         `json:"auto_halt,omitempty"`
}

// Check says what is wrong with the spec, if anything; its message is safe
// to show.
func (r *RolloutSpec) Check() error {
	if len(r.Labels) == 0 {
		return errors.New("rollout.labels must name at least one label, like {\"canary\":\"true\"}")
	}
	if err := wire.CheckLabels(r.Labels); err != nil {
		return fmt.Errorf("rollout.labels: %w", err)
	}
	if r.AutoHalt != nil {
		if err := r.AutoHalt.Check(); err != nil {
			return fmt.Errorf("rollout.%w", err)
		}
	}
	return nil
}

// Rollout is a staged version's rollout and how it ended.
type Rollout struct {
	Version     int64             `json:"version"`
	BaseVersion int64             `json:"base_version"`
	Labels      map[string]string `json:"labels"`
	AutoHalt    *AutoHalt         `json:"auto_halt"`
	State       string            `json:"state"`
	CreatedAt   time.Time         `json:"created_at"`
	CreatedBy   string            `json:"created_by"`
	EndedAt     *time.Time        `json:"ended_at"`
	EndedBy     string            `json:"ended_by,omitempty"`
	// EndedIn is the rollback version that ended it (rolled_back, halted).
	EndedIn *int64 `json:"ended_in"`
	// Reason says why it ended: the promote's message, or why it was
	// halted.
	Reason string `json:"reason,omitempty"`
}

// Target is the version a node with labels should run while r is staged:
// the staged version if its labels match, the base version otherwise.
func (r *Rollout) Target(labels map[string]string) int64 {
	if wire.MatchLabels(r.Labels, labels) {
		return r.Version
	}
	return r.BaseVersion
}

type rolloutRow struct {
	Version     int64 `gorm:"primaryKey"`
	BaseVersion int64
	Labels      string  `gorm:"type:jsonb"`
	AutoHalt    *string `gorm:"type:jsonb"`
	State       string
	CreatedAt   time.Time
	CreatedBy   string
	EndedAt     *time.Time
	EndedBy     string
	EndedIn     *int64
	Reason      string
}

func (rolloutRow) TableName() string { return "rollouts" }

func (r rolloutRow) rollout() (Rollout, error) {
	out := Rollout{Version: r.Version, BaseVersion: r.BaseVersion, State: r.State, CreatedAt: r.CreatedAt, CreatedBy: r.CreatedBy,
		EndedAt: r.EndedAt, EndedBy: r.EndedBy, EndedIn: r.EndedIn, Reason: r.Reason}
	if err := json.Unmarshal([]byte(r.Labels), &out.Labels); err != nil {
		return Rollout{}, fmt.Errorf("rollout %d labels: %w", r.Version, err)
	}
	if r.AutoHalt != nil {
		out.AutoHalt = &AutoHalt{}
		if err := json.Unmarshal([]byte(*r.AutoHalt), out.AutoHalt); err != nil {
			return Rollout{}, fmt.Errorf("rollout %d auto_halt: %w", r.Version, err)
		}
	}
	return out, nil
}

// stagedRollout returns the staged rollout, locked until tx ends, or nil.
func stagedRollout(tx *gorm.DB) (*Rollout, error) {
	var rows []rolloutRow
	if err := tx.Clauses(clause.Locking{Strength: "UPDATE"}).Where("state = ?", RolloutStaged).Find(&rows).Error; err != nil {
		return nil, fmt.Errorf("read staged rollout: %w", err)
	}
	if len(rows) == 0 {
		return nil, nil
	}
	r, err := rows[0].rollout()
	if err != nil {
		return nil, err
	}
	return &r, nil
}

// refuseWhileStaged is the answer to a publish while r is staged: only a
// rollback (which ends it) or a promote may come next, so that what the
// canary runs is always one change away from what the others run.
func refuseWhileStaged(r *Rollout) error {
	return &RefusedError{Reason: fmt.Sprintf("version %d is staged to nodes labelled %s: promote it (POST /api/v1/versions/%d/promote) or roll it back before publishing again",
		r.Version, labelText(r.Labels), r.Version)}
}

// LabelText is the rollout's selector as k=v,k=v, in key order.
func (r *Rollout) LabelText() string { return labelText(r.Labels) }

func labelText(m map[string]string) string {
	parts := make([]string, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, k+"="+m[k])
	}
	return strings.Join(parts, ",")
}

// stage writes the rollout of version v, just published by act.
func stage(tx *gorm.DB, v int64, spec *RolloutSpec, act Actor) error {
	labels, err := json.Marshal(spec.Labels)
	if err != nil {
		return fmt.Errorf("encode rollout labels: %w", err)
	}
	row := rolloutRow{Version: v, BaseVersion: v - 1, Labels: string(labels), State: RolloutStaged,
		CreatedAt: time.Now().UTC(), CreatedBy: act.Name}
	if spec.AutoHalt != nil {
		b, err := json.Marshal(spec.AutoHalt)
		if err != nil {
			return fmt.Errorf("encode auto halt: %w", err)
		}
		s := string(b)
		row.AutoHalt = &s
	}
	if err := tx.Create(&row).Error; err != nil {
		return fmt.Errorf("write rollout: %w", err)
	}
	return appendAudit(tx, act, "version.stage", fmt.Sprintf("version:%d", v), "",
		nil, map[string]any{"version": v, "base_version": v - 1, "labels": spec.Labels, "auto_halt": spec.AutoHalt})
}

// endRollout marks rollout r ended in state by act (in rollback version in,
// if any).
func endRollout(tx *gorm.DB, r *Rollout, state string, in *int64, act Actor, reason string) error {
	res := tx.Model(&rolloutRow{}).Where("version = ? AND state = ?", r.Version, RolloutStaged).
		Updates(map[string]any{"state": state, "ended_at": time.Now().UTC(), "ended_by": act.Name, "ended_in": in, "reason": reason})
	if res.Error != nil {
		return fmt.Errorf("end rollout of version %d: %w", r.Version, res.Error)
	}
	if res.RowsAffected != 1 {
		return fmt.Errorf("end rollout of version %d: it is not staged any more: %w", r.Version, ErrConflict)
	}
	return nil
}

// findRollout returns version v's rollout, locked until tx ends;
// ErrNotFound when v was not staged.
func findRollout(tx *gorm.DB, v int64) (Rollout, error) {
	var row rolloutRow
	if err := tx.Clauses(clause.Locking{Strength: "UPDATE"}).Where("version = ?", v).Take(&row).Error; err != nil {
		return Rollout{}, notFound(err, fmt.Sprintf("rollout of version %d", v))
	}
	return row.rollout()
}

func notStaged(r Rollout) error {
	switch r.State {
	case RolloutPromoted:
		return &RefusedError{Reason: fmt.Sprintf("version %d was promoted already (by %s)", r.Version, r.EndedBy)}
	case RolloutRolledBack, RolloutHalted:
		return &RefusedError{Reason: fmt.Sprintf("version %d's rollout ended: it was rolled back in version %d", r.Version, deref(r.EndedIn))}
	}
	return nil
}

// deref returns *p, or the zero value when p is nil.
func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// Promote sends staged version v to every node: it ends v's rollout with
// its audit event, in one transaction. It fails with ErrNotFound when
// v does not exist and with a *RefusedError (409) when v is not staged
// (never staged, promoted already, or rolled back).
func (s *Store) Promote(ctx context.Context, v int64, message string, act Actor) error {
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var n int64
		if err := tx.Model(&versionRow{}).Where("version = ?", v).Count(&n).Error; err != nil {
			return fmt.Errorf("read version: %w", err)
		}
		if n == 0 {
			return fmt.Errorf("version %d: %w", v, ErrNotFound)
		}
		r, err := findRollout(tx, v)
		if errors.Is(err, ErrNotFound) {
			return &RefusedError{Reason: fmt.Sprintf("version %d was not staged: it went to every node when it was published", v)}
		}
		if err != nil {
			return err
		}
		if err := notStaged(r); err != nil {
			return err
		}
		if err := endRollout(tx, &r, RolloutPromoted, nil, act, message); err != nil {
			return err
		}
		return appendAudit(tx, act, "version.promote", fmt.Sprintf("version:%d", v), message,
			map[string]any{"state": RolloutStaged, "labels": r.Labels, "base_version": r.BaseVersion},
			map[string]any{"state": RolloutPromoted, "version": v})
	})
	if err != nil {
		return fmt.Errorf("promote version %d: %w", v, err)
	}
	return nil
}

// Halt rolls staged version v back by itself (the automatic halt): it
// publishes a new version with the base version's content, sent to every
// node, authored by SystemActor with reason as its message, marks the
// rollout halted and audits why, in one transaction. It does not wait for
// approval: a halt only restores what was running. It returns the new
// version, or a *RefusedError when v is no longer staged.
func (s *Store) Halt(ctx context.Context, v int64, reason string) (int64, error) {
	reason = wire.Cut(reason, maxMessageBytes)
	var version int64
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		nv, err := nextVersion(tx) // first, as every publisher does: one lock order
		if err != nil {
			return err
		}
		r, err := findRollout(tx, v)
		if err != nil {
			return err
		}
		if err := notStaged(r); err != nil {
			return err
		}
		p, err := resolve(tx, Change{Kind: KindRollback, RollbackTo: r.BaseVersion}, nv-1)
		if err != nil {
			return err
		}
		if err := apply(tx, p, nv, versionMeta{author: SystemActor.Name, message: reason}, SystemActor); err != nil {
			return err
		}
		if err := tx.Model(&rolloutRow{}).Where("version = ?", v).Updates(map[string]any{"state": RolloutHalted, "reason": reason}).Error; err != nil {
			return fmt.Errorf("mark rollout halted: %w", err)
		}
		version = nv
		return appendAudit(tx, SystemActor, "version.halt", fmt.Sprintf("version:%d", v), reason,
			map[string]any{"state": RolloutStaged, "labels": r.Labels},
			map[string]any{"state": RolloutHalted, "rollback_version": nv, "rollback_of": r.BaseVersion})
	})
	if err != nil {
		return 0, fmt.Errorf("halt version %d: %w", v, err)
	}
	return version, nil
}

// maxMessageBytes bounds a message the console writes itself.
const maxMessageBytes = 2000

// PushState is what the nodes should run: the latest version, or, while a
// rollout is staged, its version on the nodes it selects and its base
// version on the others.
type PushState struct {
	Head   int64
	Staged *Rollout
	// Last is the newest rollout, staged or ended (nil if none): its nodes
	// stay the canary cohort in stats for a moment after it ends, while
	// they move to the next version.
	Last *Rollout
}

// Target is the version a node with labels should run.
func (p PushState) Target(labels map[string]string) int64 {
	if p.Staged != nil && p.Staged.Version == p.Head {
		return p.Staged.Target(labels)
	}
	return p.Head
}

// FindPushState reads the latest version and the newest rollout, if any,
// in one statement (one consistent snapshot, one round trip: every node
// connection reads it). At most one rollout is staged, and it is the
// newest: a publish while one is staged is refused.
func (s *Store) FindPushState(ctx context.Context) (PushState, error) {
	var rows []struct {
		Head        int64
		Version     *int64
		BaseVersion *int64
		Labels      *string
		AutoHalt    *string
		State       *string
		CreatedAt   *time.Time
		CreatedBy   *string
		EndedAt     *time.Time
		EndedBy     *string
		EndedIn     *int64
		Reason      *string
	}
	err := s.db.WithContext(ctx).Raw(`SELECT h.version AS head, r.version, r.base_version, r.labels, r.auto_halt,
			r.state, r.created_at, r.created_by, r.ended_at, r.ended_by, r.ended_in, r.reason
		FROM ruleset_head h LEFT JOIN LATERAL (SELECT * FROM rollouts ORDER BY version DESC LIMIT 1) r ON true`).Scan(&rows).Error
	if err != nil {
		return PushState{}, fmt.Errorf("read push state: %w", err)
	}
	if len(rows) != 1 {
		return PushState{}, fmt.Errorf("read push state: %d head rows", len(rows))
	}
	x := rows[0]
	ps := PushState{Head: x.Head}
	if x.Version != nil {
		row := rolloutRow{Version: *x.Version, BaseVersion: deref(x.BaseVersion), Labels: deref(x.Labels), AutoHalt: x.AutoHalt,
			State: deref(x.State), CreatedAt: deref(x.CreatedAt), CreatedBy: deref(x.CreatedBy), EndedAt: x.EndedAt,
			EndedBy: deref(x.EndedBy), EndedIn: x.EndedIn, Reason: deref(x.Reason)}
		r, err := row.rollout()
		if err != nil {
			return PushState{}, err
		}
		ps.Last = &r
		if r.State == RolloutStaged {
			ps.Staged = &r
		}
	}
	return ps, nil
}

// FindRollouts returns the rollouts of the given versions that were staged.
func (s *Store) FindRollouts(ctx context.Context, versions ...int64) (map[int64]Rollout, error) {
	out := make(map[int64]Rollout)
	if len(versions) == 0 {
		return out, nil
	}
	var rows []rolloutRow
	if err := s.db.WithContext(ctx).Where("version IN ?", versions).Find(&rows).Error; err != nil {
		return nil, fmt.Errorf("read rollouts: %w", err)
	}
	for _, row := range rows {
		r, err := row.rollout()
		if err != nil {
			return nil, err
		}
		out[r.Version] = r
	}
	return out, nil
}

// Promotion is a promote on the time axis.
type Promotion struct {
	Version int64
	At      time.Time
	By      string
	Message string
	Domains []string
}

// ListPromotions returns the promotes in [from, to) of versions that changed
// domain ("" for any), oldest first, at most 1000.
func (s *Store) ListPromotions(ctx context.Context, domain string, from, to time.Time) ([]Promotion, error) {
	var rows []struct {
		Version int64
		EndedAt time.Time
		EndedBy string
		Reason  string
	}
	q := s.db.WithContext(ctx).Model(&rolloutRow{}).Select("version", "ended_at", "ended_by", "reason").
		Where("state = ? AND ended_at >= ? AND ended_at < ?", RolloutPromoted, from.UTC(), to.UTC())
	if domain != "" {
		q = q.Where("EXISTS (SELECT 1 FROM domain_revisions r WHERE r.version = rollouts.version AND r.domain = ?)", domain)
	}
	if err := q.Order("ended_at").Limit(1000).Scan(&rows).Error; err != nil {
		return nil, fmt.Errorf("list promotions: %w", err)
	}
	out := make([]Promotion, len(rows))
	vs := make([]Version, len(rows))
	for i, r := range rows {
		out[i] = Promotion{Version: r.Version, At: r.EndedAt, By: r.EndedBy, Message: r.Reason}
		vs[i] = Version{Version: r.Version}
	}
	if err := s.fillDomains(ctx, vs); err != nil {
		return nil, err
	}
	for i := range out {
		out[i].Domains = vs[i].Domains
	}
	return out, nil
}
