package stats

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/rules/wire"
)

// TestCohortsFleetWide: canary reports on one replica and plain ones on
// both; after the exchange every replica knows each second's canary share
// and the rest, for the domains asked, and keeps no canary ring for rules
// no canary reported.
func TestCohortsFleetWide(t *testing.T) {
	ctx := context.Background()
	st := newStore(t)
	t0 := time.Now().Truncate(time.Second).Add(-time.Minute)
	clk := &fakeClock{t: t0}
	a, b := newAggregator(t, st, "a", clk), newAggregator(t, st, "b", clk)
	const seconds = 5
	for s := range seconds {
		at := t0.Add(time.Duration(s)*time.Second + 200*time.Millisecond)
		clk.set(at)
		steps := []struct {
			agg    *Aggregator
			canary bool
			r      wire.RuleStats
		}{
			{a, true, wire.RuleStats{Domain: "api", Rule: "per-key", Allowed: 2, Limited: 8, ShadowLimited: 4}},
			{a, false, wire.RuleStats{Domain: "api", Rule: "per-key", Allowed: 5, Limited: 1}},
			{b, false, wire.RuleStats{Domain: "api", Rule: "per-key", Allowed: 10}},
			{b, false, wire.RuleStats{Domain: "api", Rule: "global", Allowed: 3, Limited: 1}},
			{b, true, wire.RuleStats{Domain: "web", Rule: "per-key", Allowed: 100, Limited: 100}},
		}
		for _, x := range steps {
			ingest := x.agg.Ingest
			if x.canary {
				ingest = x.agg.IngestCanary
			}
			if err := ingest(report(x.r), at); err != nil {
				t.Fatal(err)
			}
		}
		clk.set(at.Add(time.Second))
		for _, x := range []*Aggregator{a, b} {
			if err := x.exchange(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, x := range []*Aggregator{a, b} {
		if err := x.exchange(ctx); err != nil {
			t.Fatal(err)
		}
	}
	wantCanary := store.Counts{Allowed: 2, Limited: 8}
	wantAll := store.Counts{Allowed: 2 + 5 + 10 + 3, Limited: 8 + 1 + 1}
	for _, x := range []*Aggregator{a, b} {
		for s := range seconds {
			sec := t0.Unix() + int64(s)
			canary, all := x.Cohort([]string{"api"}, sec)
			if canary != wantCanary || all != wantAll {
				t.Errorf("replica %s second %d: canary %+v all %+v, want %+v and %+v", x.replica, s, canary, all, wantCanary, wantAll)
			}
		}
		points := x.Cohorts([]string{"api"}, t0.Unix(), clk.now().Unix())
		if len(points) != seconds {
			t.Fatalf("replica %s: %d points, want %d: %+v", x.replica, len(points), seconds, points)
		}
		want := CohortPoint{T: t0.Unix(), CanaryAllowed: 2, CanaryLimited: 8, RestAllowed: 18, RestLimited: 2}
		if points[0] != want {
			t.Errorf("replica %s: first point %+v, want %+v", x.replica, points[0], want)
		}
		// Only the rules a canary reported hold a canary ring.
		x.mu.Lock()
		_, global := x.canary[store.RuleKey{Domain: "api", Rule: "global"}]
		n := len(x.canary)
		x.mu.Unlock()
		if global || n != 2 {
			t.Errorf("replica %s holds %d canary rings (global: %v), want 2", x.replica, n, global)
		}
	}
	// Out of the window: nothing.
	if c, all := a.Cohort([]string{"api"}, t0.Unix()-WindowSeconds); !c.Zero() || !all.Zero() {
		t.Errorf("a second outside the window has counts %+v %+v", c, all)
	}
}
