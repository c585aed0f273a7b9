package store_test

import (
	"context"
	"errors"
	"testing"

	"github.com/sluicehq/sluice/backend/store"
)

func requireApproval(t *testing.T, st *store.Store, on bool) {
	t.Helper()
	if _, err := st.UpdateSettings(context.Background(), store.SettingsUpdate{RequireApproval: &on}, store.Actor{Name: "user:admin"}); err != nil {
		t.Fatal(err)
	}
}

func TestFourEyes(t *testing.T) {
	t.Parallel()
	st, _ := open(t)
	ctx := context.Background()
	v1 := publish(t, st, store.Change{Domain: "a", YAML: domainYAML("a", 1)})
	requireApproval(t, st, true)

	alice := store.Actor{Name: "user:alice"}
	aliceToken := store.Actor{Name: "token:alice-ci#7", Owner: "user:alice"}
	bob := store.Actor{Name: "user:bob"}

	change := store.Change{Domain: "a", YAML: domainYAML("a", 2), BaseVersion: v1, Message: "raise", Actor: alice}
	if _, err := st.Publish(ctx, change); !errors.Is(err, store.ErrApprovalRequired) {
		t.Fatalf("publish with approval required = %v, want ErrApprovalRequired", err)
	}
	cr, err := st.Propose(ctx, change)
	if err != nil {
		t.Fatal(err)
	}
	if cr.Status != store.ChangePending || cr.Author != "user:alice" || cr.BaseVersion != v1 {
		t.Fatalf("proposed %+v", cr)
	}
	for _, who := range []store.Actor{alice, aliceToken} {
		if _, err := st.Approve(ctx, cr.ID, who, ""); !errors.Is(err, store.ErrSelfApproval) {
			t.Fatalf("approval by %s = %v, want ErrSelfApproval", who.Name, err)
		}
	}
	approved, err := st.Approve(ctx, cr.ID, bob, "lgtm")
	if err != nil {
		t.Fatal(err)
	}
	if approved.Status != store.ChangeApproved || approved.Version == nil || *approved.Version != 2 || approved.Reviewer != "user:bob" {
		t.Fatalf("approved %+v", approved)
	}
	meta, err := st.FindVersion(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if meta.Author != "user:alice" || meta.ApprovedBy != "user:bob" || meta.ChangeID == nil || *meta.ChangeID != cr.ID || meta.Message != "raise" {
		t.Fatalf("version 2 = %+v, want authored by alice, approved by bob", meta)
	}
	if d, _ := st.FindDomain(ctx, "a"); d.YAML != domainYAML("a", 2) {
		t.Fatalf("domain a after approval = %q", d.YAML)
	}
	if _, err := st.Approve(ctx, cr.ID, bob, ""); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("second approval = %v, want a conflict", err)
	}

	// A request whose base moved cannot be approved and stays pending.
	stale, err := st.Propose(ctx, store.Change{Domain: "a", YAML: domainYAML("a", 3), BaseVersion: 2, Message: "m", Actor: alice})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Publish(ctx, store.Change{Domain: "a", YAML: domainYAML("a", 4), BaseVersion: 2, Message: "urgent",
		Actor: store.Actor{Name: "user:root"}, BreakGlass: "incident 42"}); err != nil {
		t.Fatalf("break glass: %v", err)
	}
	var ce *store.ConflictError
	if _, err := st.Approve(ctx, stale.ID, bob, ""); !errors.As(err, &ce) || ce.ChangedIn != 3 {
		t.Fatalf("approve stale = %v, want conflict naming version 3", err)
	}
	if got, _ := st.FindChange(ctx, stale.ID); got.Status != store.ChangePending {
		t.Fatalf("stale request is %s after failed approval, want pending", got.Status)
	}
	rejected, err := st.Reject(ctx, stale.ID, alice, "superseded")
	if err != nil || rejected.Status != store.ChangeRejected || rejected.ReviewMessage != "superseded" {
		t.Fatalf("author withdraws: %+v %v", rejected, err)
	}

	// Whole-ruleset rollback as a change request.
	rb, err := st.Propose(ctx, store.Change{Kind: store.KindRollback, RollbackTo: v1, Message: "back", Actor: alice})
	if err != nil {
		t.Fatal(err)
	}
	if rb.BaseVersion != 3 {
		t.Fatalf("rollback request base = %d, want the head 3", rb.BaseVersion)
	}
	done, err := st.Approve(ctx, rb.ID, bob, "")
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := st.FindDomain(ctx, "a"); d.YAML != domainYAML("a", 1) || *done.Version != 4 {
		t.Fatalf("after approved rollback: domain a %q, version %v", d.YAML, done.Version)
	}

	pending, next, err := st.ListChanges(ctx, store.ChangeFilter{Status: store.ChangePending})
	if err != nil || len(pending) != 0 || next != 0 {
		t.Fatalf("pending = %v %d %v, want none", pending, next, err)
	}
	all, _, _ := st.ListChanges(ctx, store.ChangeFilter{Domain: "a"})
	if len(all) != 2 {
		t.Fatalf("changes of domain a = %d, want 2", len(all))
	}

	events, _, err := st.ListAudit(ctx, store.AuditFilter{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, e := range events {
		seen[e.Action]++
	}
	for action, n := range map[string]int{"change.propose": 3, "change.approve": 2, "change.reject": 1,
		"change.break_glass": 1, "settings.update": 1, "domain.publish": 3, "version.rollback": 1} {
		if seen[action] != n {
			t.Errorf("audit has %d %s, want %d (all: %v)", seen[action], action, n, seen)
		}
	}
	if res, _ := st.VerifyAudit(ctx); !res.OK {
		t.Fatalf("audit chain broken: %+v", res)
	}
}

func TestProposeChecksNow(t *testing.T) {
	t.Parallel()
	st, _ := open(t)
	ctx := context.Background()
	publish(t, st, store.Change{Domain: "a", YAML: domainYAML("a", 1)})
	publish(t, st, store.Change{Domain: "a", YAML: domainYAML("a", 2), BaseVersion: 1})
	if _, err := st.Propose(ctx, store.Change{Domain: "a", YAML: "x", BaseVersion: 1, Message: "m", Actor: actor}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("propose on a stale base = %v, want conflict", err)
	}
	if _, err := st.Propose(ctx, store.Change{Kind: store.KindDelete, Domain: "zz", Message: "m", Actor: actor}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("propose deleting an unknown domain = %v, want not found", err)
	}
	if _, err := st.Approve(ctx, 999, actor, ""); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("approve unknown = %v, want not found", err)
	}
}
