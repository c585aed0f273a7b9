package store_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/sluicehq/sluice/backend/store"
)

// TestOneStagedRollout: concurrent staged publishes and plain publishes
// while one is staged — exactly one is staged, every other publish is
// refused whole (no version written for it), and the push state says who
// gets what.
func TestOneStagedRollout(t *testing.T) {
	t.Parallel()
	st, _ := open(t)
	ctx := context.Background()
	act := store.Actor{Name: "test"}
	v1, err := st.Publish(ctx, store.Change{Domain: "api", YAML: domainYAML("api", 1), Message: "m", Actor: act})
	if err != nil {
		t.Fatal(err)
	}
	const n = 8
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			d := fmt.Sprintf("d%d", i)
			c := store.Change{Domain: d, YAML: domainYAML(d, 1), Message: "m", Actor: act}
			if i%2 == 0 {
				c.Rollout = &store.RolloutSpec{Labels: map[string]string{"canary": "true"}}
			}
			_, errs[i] = st.Publish(ctx, c)
		})
	}
	wg.Wait()
	ps, err := st.FindPushState(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ok, staged int
	for i, err := range errs {
		var re *store.RefusedError
		switch {
		case err == nil:
			ok++
		case errors.As(err, &re) && errors.Is(err, store.ErrConflict):
		default:
			t.Errorf("publish %d: %v", i, err)
		}
	}
	if ps.Staged != nil {
		staged = 1
	}
	if staged != 1 || ps.Head != v1+int64(ok) {
		t.Fatalf("%d publishes went through, head %d, staged %+v", ok, ps.Head, ps.Staged)
	}
	// Everything published before the staged one went through; nothing after.
	if ps.Staged.Version != ps.Head || ps.Staged.BaseVersion != ps.Head-1 {
		t.Errorf("staged %+v is not the head %d", ps.Staged, ps.Head)
	}
	if got := ps.Target(map[string]string{"canary": "true", "x": "y"}); got != ps.Head {
		t.Errorf("canary target %d, want %d", got, ps.Head)
	}
	if got := ps.Target(map[string]string{"canary": "false"}); got != ps.Head-1 {
		t.Errorf("other target %d, want %d", got, ps.Head-1)
	}

	// Promote ends it; promoting twice or halting after is refused.
	if err := st.Promote(ctx, ps.Head, "go", act); err != nil {
		t.Fatal(err)
	}
	if err := st.Promote(ctx, ps.Head, "go", act); !errors.Is(err, store.ErrConflict) {
		t.Errorf("second promote: %v", err)
	}
	if _, err := st.Halt(ctx, ps.Head, "late"); !errors.Is(err, store.ErrConflict) {
		t.Errorf("halt after promote: %v", err)
	}
	if err := st.Promote(ctx, ps.Head+5, "go", act); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("promote of a missing version: %v", err)
	}
	after, err := st.FindPushState(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after.Staged != nil || after.Last == nil || after.Last.State != store.RolloutPromoted || after.Target(nil) != ps.Head {
		t.Errorf("after promote: %+v", after)
	}
}
