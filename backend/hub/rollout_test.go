package hub_test

import (
	"context"
	"testing"

	"github.com/sluicehq/sluice/backend/hub"
	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/rules/wire"
)

// TestStagedPushPerLabels: with two replicas, a staged version reaches only
// the nodes whose labels match, on either replica and also when they
// connect later; the others get nothing until the rollout ends, and then the
// rollback (never the staged version, never anything older than they run).
func TestStagedPushPerLabels(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a, b := e.startConsole(), e.startConsole()
	v1 := e.publish("api", domainYAML("api", 10))

	canaryA := e.connect(a.url, wire.Hello{NodeID: "canary-a", Labels: map[string]string{"canary": "true"}})
	plainB := e.connect(b.url, wire.Hello{NodeID: "plain-b", Labels: map[string]string{"canary": "false"}})
	for _, n := range []*node{canaryA, plainB} {
		if s := n.snapshot(); s.Version != v1 {
			t.Fatalf("first snapshot %d, want %d", s.Version, v1)
		}
		n.ack(v1)
	}

	ctx := context.Background()
	v2, err := e.st.Publish(ctx, store.Change{Domain: "api", YAML: domainYAML("api", 1), BaseVersion: v1, Message: "staged",
		Actor: store.Actor{Name: "test"}, Rollout: &store.RolloutSpec{Labels: map[string]string{"canary": "true"}}})
	if err != nil {
		t.Fatal(err)
	}
	if s := canaryA.snapshot(); s.Version != v2 {
		t.Fatalf("canary got %d, want %d", s.Version, v2)
	}
	canaryA.ack(v2)

	// Later connections: a canary on the other replica gets v2; a plain
	// node on v0 gets v1; a node already on v2 without the label gets
	// nothing (never older).
	canaryB := e.connect(b.url, wire.Hello{NodeID: "canary-b", Labels: map[string]string{"canary": "true", "zone": "x"}})
	if s := canaryB.snapshot(); s.Version != v2 {
		t.Fatalf("late canary got %d, want %d", s.Version, v2)
	}
	lateA := e.connect(a.url, wire.Hello{NodeID: "late-a"})
	if s := lateA.snapshot(); s.Version != v1 {
		t.Fatalf("late plain node got %d, want %d", s.Version, v1)
	}
	ahead := e.connect(a.url, wire.Hello{NodeID: "ahead", AppliedVersion: v2})

	// Roll the staged version back: everyone's next message is v3.
	v3, err := e.st.Publish(ctx, store.Change{Kind: store.KindRollback, RollbackTo: v1, Message: "undo", Actor: store.Actor{Name: "test"}})
	if err != nil {
		t.Fatal(err)
	}
	for name, n := range map[string]*node{"canary-a": canaryA, "plain-b": plainB, "canary-b": canaryB, "late-a": lateA, "ahead": ahead} {
		if s := n.snapshot(); s.Version != v3 {
			t.Errorf("%s: next snapshot %d, want the rollback %d", name, s.Version, v3)
		}
	}
}

func TestJudge(t *testing.T) {
	t.Parallel()
	h := store.AutoHalt{Factor: 3, MinLimitedPerS: 5, ForS: 3}
	for _, tc := range []struct {
		name        string
		canary, all store.Counts
		want        bool
	}{
		{"canary limits far more", store.Counts{Allowed: 10, Limited: 10}, store.Counts{Allowed: 100, Limited: 15}, true},
		{"rest limits nothing", store.Counts{Allowed: 10, Limited: 5}, store.Counts{Allowed: 100, Limited: 5}, true},
		{"under the floor", store.Counts{Allowed: 0, Limited: 4}, store.Counts{Allowed: 100, Limited: 4}, false},
		{"under the factor", store.Counts{Allowed: 10, Limited: 10}, store.Counts{Allowed: 60, Limited: 30}, false},
		{"no traffic on the rest", store.Counts{Allowed: 0, Limited: 50}, store.Counts{Allowed: 0, Limited: 50}, false},
		{"no canary traffic", store.Counts{}, store.Counts{Allowed: 10, Limited: 10}, false},
		{"shadow and errors are no 429s", store.Counts{Allowed: 10, ShadowLimited: 90, StoreErrors: 9}, store.Counts{Allowed: 20, ShadowLimited: 90}, false},
	} {
		if got := hub.Judge(h, tc.canary, tc.all); got.Halt != tc.want {
			t.Errorf("%s: %+v, want halt %v", tc.name, got, tc.want)
		}
	}
}
