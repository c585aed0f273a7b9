package store

import (
	"cmp"
	"fmt"
	"slices"

	"gorm.io/gorm"
)

// MaxEdits bounds how many domains one KindRuleset change sets or removes.
const MaxEdits = 1000

// DomainEdit is one domain of a KindRuleset change: its new YAML (validated
// by the caller), or its removal.
type DomainEdit struct {
	Domain  string `json:"domain"`
	YAML    string `json:"yaml,omitempty"`
	Deleted bool   `json:"deleted,omitempty"`
}

// normalEdits checks a ruleset change's edits and returns them sorted by
// domain: at least one, at most MaxEdits, each domain once.
func normalEdits(edits []DomainEdit) ([]DomainEdit, error) {
	switch {
	case len(edits) == 0:
		return nil, &InvalidError{Reason: "nothing to change: a ruleset change sets or removes at least one domain"}
	case len(edits) > MaxEdits:
		return nil, &InvalidError{Reason: fmt.Sprintf("a ruleset change touches at most %d domains, not %d", MaxEdits, len(edits))}
	}
	out := slices.Clone(edits)
	slices.SortFunc(out, func(a, b DomainEdit) int { return cmp.Compare(a.Domain, b.Domain) })
	for i, e := range out {
		switch {
		case e.Domain == "":
			return nil, &InvalidError{Reason: "every edit names a domain"}
		case i > 0 && out[i-1].Domain == e.Domain:
			return nil, &InvalidError{Reason: fmt.Sprintf("domain %q is set or removed twice", e.Domain)}
		case e.Deleted && e.YAML != "":
			return nil, &InvalidError{Reason: fmt.Sprintf("domain %q is both removed and given YAML", e.Domain)}
		}
	}
	return out, nil
}

// checkEdits refuses a ruleset change if any of its domains changed after
// its base, or it removes a domain that does not exist.
func checkEdits(tx *gorm.DB, p plan, head int64) error {
	for _, e := range p.edits {
		last, err := revisionAt(tx, e.Domain, head)
		if err != nil {
			return err
		}
		if p.checkBase && last != nil && last.Version > p.base {
			return &ConflictError{Domain: e.Domain, Base: p.base, ChangedIn: last.Version}
		}
		if e.Deleted && (last == nil || last.Deleted) {
			return fmt.Errorf("domain %q: %w", e.Domain, ErrNotFound)
		}
	}
	return nil
}

// applyEdits writes a ruleset change as version v: one revision per edit,
// the version, and one audit event per domain (domain.publish or
// domain.delete, as a single-domain change writes), all in tx.
func applyEdits(tx *gorm.DB, p plan, v int64, meta versionMeta, act Actor) error {
	befores := make([]*revisionRow, len(p.edits))
	revs := make([]revisionRow, len(p.edits))
	for i, e := range p.edits {
		var err error
		if befores[i], err = revisionAt(tx, e.Domain, v-1); err != nil {
			return err
		}
		revs[i] = revisionRow{Version: v, Domain: e.Domain, YAML: e.YAML, Deleted: e.Deleted}
	}
	if err := tx.Create(&revs).Error; err != nil {
		return fmt.Errorf("write revisions: %w", err)
	}
	if err := writeVersion(tx, v, p, meta); err != nil {
		return err
	}
	for i, rev := range revs {
		action := "domain.publish"
		if rev.Deleted {
			action = "domain.delete"
		}
		if err := auditRevision(tx, act, action, befores[i], rev, p, meta); err != nil {
			return err
		}
	}
	return nil
}
