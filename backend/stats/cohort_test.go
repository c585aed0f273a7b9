package stats

import (
	"context"
	"fmt"
	"slices"
	"strings"
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
	t.Parallel()
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

// TestPromoteMarkers: a promote is a marker in the live window and reaches
// the streams of every replica (each polls Postgres).
func TestPromoteMarkers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := newStore(t)
	clk := &fakeClock{t: time.Now()}
	a := newAggregator(t, st, "a", clk)
	sub := a.Subscribe("api", false)
	defer sub.Close()
	head, err := st.CurrentVersion(ctx)
	if err != nil {
		t.Fatal(err)
	}
	d, err := st.FindDomain(ctx, "api")
	if err != nil {
		t.Fatal(err)
	}
	act := store.Actor{Name: "user:alice"}
	v, err := st.Publish(ctx, store.Change{Domain: "api", YAML: "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
		BaseVersion: d.Version, Message: "staged", Actor: act, Rollout: &store.RolloutSpec{Labels: map[string]string{"canary": "true"}}})
	if err != nil || v != head+1 {
		t.Fatalf("publish: %d, %v", v, err)
	}
	if err := st.Promote(ctx, v, "ship it", act); err != nil {
		t.Fatal(err)
	}
	clk.set(time.Now())
	a.pollPromotions(ctx)
	select {
	case m := <-sub.Messages():
		if s := string(m); !strings.Contains(s, `"kind":"promote"`) || !strings.Contains(s, `"message":"ship it"`) || !strings.Contains(s, `"author":"user:alice"`) {
			t.Errorf("marker message %s", s)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no marker on the stream")
	}
	a.pollPromotions(ctx) // seen: not sent again
	select {
	case m := <-sub.Messages():
		t.Errorf("second poll sent %s", m)
	default:
	}
	view, err := a.Live(ctx, "api", false)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, m := range view.Markers {
		kinds = append(kinds, fmt.Sprintf("%s:%d", m.Kind, m.Version))
	}
	if !slices.Contains(kinds, fmt.Sprintf("promote:%d", v)) || !slices.Contains(kinds, fmt.Sprintf("publish:%d", v)) {
		t.Errorf("live markers %v, want publish and promote of %d", kinds, v)
	}
}
