package store_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/rules/wire"
)

// bigDomainYAML is a valid domain of about size bytes (a long comment).
func bigDomainYAML(name string, size int) string {
	y := domainYAML(name, 1) + "# "
	return y + strings.Repeat("x", size-len(y)-1) + "\n"
}

// bigDomain is the size of the domains TestSnapshotSizeRefused publishes: 16
// of them fit in wire.MaxSnapshotBytes, 17 do not.
const bigDomain = wire.MaxSnapshotBytes / 16 * 99 / 100

// TestSnapshotSizeRefused: every path that creates a version
// refuses one whose snapshot would exceed what nodes accept, and writes
// nothing.
func TestSnapshotSizeRefused(t *testing.T) {
	t.Parallel()
	st, _ := open(t)
	ctx := context.Background()
	for i := range 16 {
		publish(t, st, store.Change{Domain: fmt.Sprintf("d%02d", i), YAML: bigDomainYAML(fmt.Sprintf("d%02d", i), bigDomain)})
	}
	head := int64(16)
	tooLarge := func(t *testing.T, what string, err error) {
		t.Helper()
		var te *store.SnapshotTooLargeError
		if !errors.As(err, &te) || te.Max != wire.MaxSnapshotBytes || te.Bytes <= te.Max {
			t.Fatalf("%s: %v, want a *store.SnapshotTooLargeError", what, err)
		}
		if v, err := st.CurrentVersion(ctx); err != nil || v != head {
			t.Fatalf("%s: current version %d (%v), want %d: nothing written", what, v, err, head)
		}
	}

	// Publishing a 17th domain, or growing one.
	_, err := st.Publish(ctx, store.Change{Domain: "d16", YAML: bigDomainYAML("d16", bigDomain), Message: "m", Actor: actor})
	tooLarge(t, "publish a 17th domain", err)
	_, err = st.Publish(ctx, store.Change{Domain: "d00", YAML: bigDomainYAML("d00", 2*bigDomain), BaseVersion: 1, Message: "m", Actor: actor})
	tooLarge(t, "grow a domain", err)

	// A domain rollback that brings a deleted domain back.
	publish(t, st, store.Change{Kind: store.KindDelete, Domain: "d00", BaseVersion: 1}) // v17
	publish(t, st, store.Change{Domain: "d16", YAML: bigDomainYAML("d16", bigDomain)})  // v18
	_, err = st.Publish(ctx, store.Change{Kind: store.KindDomainRollback, Domain: "d00", RollbackTo: 1, Message: "m", Actor: actor})
	head = 18
	tooLarge(t, "domain rollback", err)

	// Approving a change request proposed while it still fit.
	publish(t, st, store.Change{Kind: store.KindDelete, Domain: "d16", BaseVersion: 18}) // v19
	requireApproval(t, st, true)
	cr, err := st.Propose(ctx, store.Change{Domain: "d17", YAML: bigDomainYAML("d17", bigDomain), Message: "m", Actor: actor})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Publish(ctx, store.Change{Domain: "d16", YAML: bigDomainYAML("d16", bigDomain), BaseVersion: 19, Message: "m", Actor: actor, BreakGlass: "test"}); err != nil {
		t.Fatal(err) // v20: 16 domains again
	}
	head = 20
	_, err = st.Approve(ctx, cr.ID, store.Actor{Name: "user:bob"}, "ok")
	tooLarge(t, "approve", err)
	if got, err := st.FindChange(ctx, cr.ID); err != nil || got.Status != store.ChangePending {
		t.Errorf("change request after a refused approval: %+v %v, want still pending", got, err)
	}

	// Deleting, which only shrinks the snapshot, still works.
	requireApproval(t, st, false)
	publish(t, st, store.Change{Kind: store.KindDelete, Domain: "d16", BaseVersion: 20})
}
