package store_test

import (
	"context"
	"errors"
	"testing"

	"github.com/sluicehq/sluice/backend/store"
)

// TestRulesetChange: a ruleset change writes every edit in one version or
// nothing, and its change request cannot be approved once one of its
// domains moved.
func TestRulesetChange(t *testing.T) {
	t.Parallel()
	st, _ := open(t)
	ctx := context.Background()
	publish(t, st, store.Change{Domain: "a", YAML: domainYAML("a", 1)}) // v1
	publish(t, st, store.Change{Domain: "b", YAML: domainYAML("b", 1)}) // v2

	// A deletion of a domain that does not exist refuses the whole change.
	_, err := st.Publish(ctx, store.Change{Kind: store.KindRuleset, BaseVersion: 2, Message: "m", Actor: actor,
		Edits: []store.DomainEdit{{Domain: "a", YAML: domainYAML("a", 9)}, {Domain: "zz", Deleted: true}}})
	if !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("ruleset change deleting an unknown domain = %v, want not found", err)
	}
	if v, _ := st.CurrentVersion(ctx); v != 2 {
		t.Fatalf("a refused ruleset change moved the head to %d", v)
	}
	if d, _ := st.FindDomain(ctx, "a"); d.YAML != domainYAML("a", 1) {
		t.Fatalf("a refused ruleset change wrote domain a: %q", d.YAML)
	}

	v := publish(t, st, store.Change{Kind: store.KindRuleset, BaseVersion: 2,
		Edits: []store.DomainEdit{{Domain: "c", YAML: domainYAML("c", 1)}, {Domain: "a", YAML: domainYAML("a", 2)}, {Domain: "b", Deleted: true}}})
	meta, err := st.FindVersion(ctx, v)
	if err != nil || v != 3 || len(meta.Domains) != 3 {
		t.Fatalf("ruleset change = version %d %+v %v, want version 3 changing a, b, c", v, meta, err)
	}
	snap, _ := st.FindSnapshot(ctx, 0)
	if len(snap.Domains) != 2 || snap.Domains[0].Name != "a" || snap.Domains[0].YAML != domainYAML("a", 2) || snap.Domains[1].Name != "c" {
		t.Fatalf("snapshot after the ruleset change: %+v", snap.Domains)
	}

	requireApproval(t, st, true)
	cr, err := st.Propose(ctx, store.Change{Kind: store.KindRuleset, BaseVersion: 3, Message: "both", Actor: actor,
		Edits: []store.DomainEdit{{Domain: "a", YAML: domainYAML("a", 3)}, {Domain: "c", YAML: domainYAML("c", 3)}}})
	if err != nil || cr.Kind != store.KindRuleset || len(cr.Edits) != 2 {
		t.Fatalf("propose = %+v %v", cr, err)
	}
	if got, _ := st.FindChange(ctx, cr.ID); len(got.Edits) != 2 || got.Edits[1].YAML != domainYAML("c", 3) {
		t.Fatalf("the stored change request lost its edits: %+v", got)
	}
	publish(t, st, store.Change{Domain: "c", YAML: domainYAML("c", 4), BaseVersion: 3, BreakGlass: "incident"}) // v4
	var ce *store.ConflictError
	if _, err := st.Approve(ctx, cr.ID, store.Actor{Name: "user:bob"}, ""); !errors.As(err, &ce) || ce.Domain != "c" || ce.ChangedIn != 4 {
		t.Fatalf("approve after c moved = %v, want a conflict on c in version 4", err)
	}
	if d, _ := st.FindDomain(ctx, "a"); d.YAML != domainYAML("a", 2) {
		t.Fatalf("a failed approval wrote domain a: %q", d.YAML)
	}
	if res, _ := st.VerifyAudit(ctx); !res.OK {
		t.Fatalf("audit chain: %+v", res)
	}
}
