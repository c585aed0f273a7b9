package engine_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/enforcer/limiter"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/rules/wire"
)

func TestTakeStats(t *testing.T) {
	t.Parallel()
	eng := newEngine(t)
	// per-user is 2/min: u1 is limited 3 times, u2 once, u3 never.
	for _, u := range []string{"u1", "u1", "u1", "u1", "u1", "u2", "u2", "u2", "u3"} {
		check(t, eng, req(entry("user", u)))
	}
	// The shadow-mode free plan (1/min) would limit its second request.
	check(t, eng, req(entry("plan", "free")))
	check(t, eng, req(entry("plan", "free")))
	// per-key has room, but per-user rejects: per-key counts nothing.
	check(t, eng, req(entry("user", "u1"), entry("api_key", "k")))
	// Unlimited and unmatched descriptors are not rules' decisions.
	check(t, eng, req(entry("internal", "x"), entry("nothing", "x")))

	want := []wire.RuleStats{
		{Domain: "api", Rule: "free-plan", Allowed: 1, ShadowLimited: 1},
		{Domain: "api", Rule: "per-user", Allowed: 5, Limited: 5, TopLimited: []wire.ValueCount{{Value: "u1", Count: 4}, {Value: "u2", Count: 1}},
			Values: []wire.ValueCount{{Value: "u1", Count: 4}, {Value: "u2", Count: 1}}},
	}
	if diff := cmp.Diff(want, eng.TakeStats()); diff != "" {
		t.Errorf("first interval (-want +got):\n%s", diff)
	}
	if got := eng.TakeStats(); len(got) != 0 {
		t.Errorf("second interval with no checks: %+v, want none", got)
	}

	// A store outage: closed and open limits count store errors; a local
	// limit counts its local decisions as store errors too.
	dead := deadEngine(t)
	check(t, dead, req(entry("closed", "x")))
	check(t, dead, req(entry("open", "x")))
	for range 6 {
		check(t, dead, req(entry("local", "x")))
	}
	want = []wire.RuleStats{
		{Domain: "api", Rule: "closed", StoreErrors: 1},
		{Domain: "api", Rule: "local", Allowed: 5, Limited: 1, StoreErrors: 6, TopLimited: []wire.ValueCount{{Value: "x", Count: 1}},
			Values: []wire.ValueCount{{Value: "x", Count: 1}}},
		{Domain: "api", Rule: "open", StoreErrors: 1},
	}
	if diff := cmp.Diff(want, dead.TakeStats()); diff != "" {
		t.Errorf("store down (-want +got):\n%s", diff)
	}
}

func TestTakeStatsTopBounded(t *testing.T) {
	t.Parallel()
	eng := newEngine(t)
	// 200 distinct users limited once each and one limited 50 times: the
	// heavy one is reported first with its exact count, and at most
	// wire.MaxTopValues values are.
	for i := range 200 {
		u := fmt.Sprintf("user-%d", i)
		for range 3 {
			check(t, eng, req(entry("user", u)))
		}
	}
	for range 52 {
		check(t, eng, req([]rules.Entry{{Key: "user", Value: "heavy"}}))
	}
	st := eng.TakeStats()
	if len(st) != 1 {
		t.Fatalf("stats %+v, want per-user alone", st)
	}
	top := st[0].TopLimited
	if len(top) != wire.MaxTopValues || top[0].Value != "heavy" || top[0].Count < 50 {
		t.Errorf("top limited %+v, want %d values, heavy first with at least 50", top, wire.MaxTopValues)
	}
	if st[0].Limited != 250 {
		t.Errorf("limited %d, want 250", st[0].Limited)
	}
}

func TestWithoutStats(t *testing.T) {
	t.Parallel()
	client, err := limiter.NewClient(testenv.RedisURL(t), limiter.WithTimeout(2*time.Second), limiter.WithDialTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	eng := engine.New(limiter.NewRedis(client), testenv.KeyPrefix(t), engine.WithoutStats())
	if err := eng.Apply(1, compile(t, apiYAML)); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		check(t, eng, req(entry("user", "u1")))
	}
	if got := eng.TakeStats(); len(got) != 0 {
		t.Errorf("stats off, yet TakeStats = %+v", got)
	}
}
