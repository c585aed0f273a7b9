package engine_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/enforcer/limiter"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
)

// Tests of envoyproxy/ratelimit behaviour a Lyft user relies on when
// swapping Sluice in: limit overrides count on their own, and
// limits within their limit say what remains of them when another limit
// rejects the request.

const lyftYAML = `domain: lyft
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: global
    rate_limit: {unit: minute, requests_per_unit: 4}
  - key: blocked
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: sharded
    rate_limit: {unit: minute, requests_per_unit: 40}
    shards: 4
  - key: slow
    rate_limit: {unit: minute, requests_per_unit: 2, unit_multiplier: 5}
  - key: midpath
    value: /api*v1
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: tenant
    value: t*prod
    rate_limit: {unit: minute, requests_per_unit: 1}
`

// lyftEngine runs on the real test Redis through a Batcher, as a node's
// engine does, so that its over-limit cache answers too.
func lyftEngine(t *testing.T) *engine.Engine {
	t.Helper()
	client, err := limiter.NewClient(testenv.RedisURL(t), limiter.WithTimeout(2*time.Second), limiter.WithDialTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	eng := engine.New(limiter.NewBatcher(limiter.NewRedis(client), limiter.BatchOptions{Timeout: 2 * time.Second}), testenv.KeyPrefix(t))
	if err := eng.Apply(1, compile(t, lyftYAML)); err != nil {
		t.Fatal(err)
	}
	return eng
}

func overridden(entries []rules.Entry, rpu uint32, unit rules.Unit) engine.Request {
	return engine.Request{Domain: "lyft", Descriptors: []engine.Descriptor{{
		Entries:  entries,
		Override: &engine.Override{RequestsPerUnit: rpu, Unit: unit},
	}}}
}

// TestCheckOverrideCountsOnItsOwn: an override's unit has a window of its
// own. Using up a 10/DAY override leaves the descriptor's configured
// 5/SECOND limit untouched, and a 42/HOUR override after it starts afresh,
// while the 10/DAY one stays used up.
func TestCheckOverrideCountsOnItsOwn(t *testing.T) {
	t.Parallel()
	eng := lyftEngine(t)
	u := entry("user", "alice")
	for i := range 10 {
		if res := check(t, eng, overridden(u, 10, rules.Day)); res.Code != engine.OK {
			t.Fatalf("10/DAY override #%d: %v, want ok", i+1, res.Code)
		}
	}
	if res := check(t, eng, overridden(u, 10, rules.Day)); res.Code != engine.OverLimit {
		t.Fatalf("10/DAY override #11: %v, want over_limit", res.Code)
	}

	// The configured limit has its own counter: 5 a second, all there.
	res := check(t, eng, engine.Request{Domain: "lyft", Descriptors: []engine.Descriptor{{Entries: u}}})
	if s := res.Statuses[0]; res.Code != engine.OK || s.Remaining != 4 || s.Limit.RequestsPerUnit != 5 {
		t.Fatalf("configured limit after the override: %v remaining %d of %d, want ok 4 of 5", res.Code, s.Remaining, s.Limit.RequestsPerUnit)
	}

	// Another unit, another window.
	res = check(t, eng, overridden(u, 42, rules.Hour))
	if s := res.Statuses[0]; res.Code != engine.OK || s.Remaining != 41 {
		t.Fatalf("42/HOUR override after 10/DAY: %v remaining %d, want ok 41", res.Code, s.Remaining)
	}
	if res := check(t, eng, overridden(u, 10, rules.Day)); res.Code != engine.OverLimit {
		t.Fatalf("10/DAY override after 42/HOUR: %v, want still over_limit", res.Code)
	}
	// Another user's override is another counter.
	if res := check(t, eng, overridden(entry("user", "bob"), 10, rules.Day)); res.Code != engine.OK {
		t.Fatalf("bob's 10/DAY override: %v, want ok", res.Code)
	}
}

// TestCheckRemainingWhenAnotherIsOver: a request over one limit reports,
// for its other limits, what remains of them (untouched, since the request
// consumed nothing), not 0; whether a limit rejected it by counting, by the
// Batcher's over-limit cache or by blocking every request.
func TestCheckRemainingWhenAnotherIsOver(t *testing.T) {
	t.Parallel()
	eng := lyftEngine(t)
	two := func(user string) engine.Request {
		return req2("lyft", entry("user", user), entry("global", "g"))
	}
	// 4 a minute globally: use 3 of them.
	for i := range 3 {
		if res := check(t, eng, two("u"+string(rune('a'+i)))); res.Code != engine.OK {
			t.Fatalf("#%d: %v", i+1, res.Code)
		}
	}
	// Five a second per user: the sixth in a row is over, and the global
	// limit, which it did not consume, still has 1.
	for range 5 {
		check(t, eng, req2("lyft", entry("user", "hot")))
	}
	for round := range 3 { // the first decided by Redis, then by the cache
		res := check(t, eng, two("hot"))
		if res.Code != engine.OverLimit || res.Statuses[0].Code != engine.OverLimit {
			t.Fatalf("round %d: %v (%v), want over_limit by user", round, res.Code, res.Statuses[0].Code)
		}
		g := res.Statuses[1]
		if g.Code != engine.OK || !g.Limited() || g.Remaining != 1 || g.ResetAfter <= 0 {
			t.Errorf("round %d: global %v limited=%t remaining %d reset %v, want ok, 1 remaining, a reset", round, g.Code, g.Limited(), g.Remaining, g.ResetAfter)
		}
	}

	res := check(t, eng, req2("lyft", entry("blocked", "x"), entry("global", "g")))
	if res.Code != engine.OverLimit {
		t.Fatalf("blocked: %v, want over_limit", res.Code)
	}
	if g := res.Statuses[1]; g.Code != engine.OK || !g.Limited() || g.Remaining != 1 {
		t.Errorf("global next to a blocking limit: %v limited=%t remaining %d, want ok, 1 remaining", g.Code, g.Limited(), g.Remaining)
	}
	// A sharded limit reports its whole remaining, not one shard's.
	res = check(t, eng, req2("lyft", entry("blocked", "x"), entry("sharded", "s")))
	if g := res.Statuses[1]; !g.Limited() || g.Remaining != 40 {
		t.Errorf("sharded next to a blocking limit: limited=%t remaining %d, want 40", g.Limited(), g.Remaining)
	}
	// Nothing was consumed by any of the rejected requests.
	if res := check(t, eng, two("fresh")); res.Code != engine.OK || res.Statuses[1].Remaining != 0 {
		t.Errorf("fresh: %v global remaining %d, want ok 0", res.Code, res.Statuses[1].Remaining)
	}
}

func req2(domain string, descriptors ...[]rules.Entry) engine.Request {
	r := engine.Request{Domain: domain}
	for _, d := range descriptors {
		r.Descriptors = append(r.Descriptors, engine.Descriptor{Entries: d})
	}
	return r
}

// TestCheckUnitMultiplier: Lyft's unit_multiplier makes the period that
// many units: 2 per 5 minutes refills a token every 2.5 minutes.
func TestCheckUnitMultiplier(t *testing.T) {
	t.Parallel()
	eng := lyftEngine(t)
	for i := range 2 {
		if res := check(t, eng, req2("lyft", entry("slow", "s"))); res.Code != engine.OK {
			t.Fatalf("#%d: %v, want ok", i+1, res.Code)
		}
	}
	res := check(t, eng, req2("lyft", entry("slow", "s")))
	if s := res.Statuses[0]; res.Code != engine.OverLimit || s.RetryAfter < 2*time.Minute || s.RetryAfter > 150*time.Second {
		t.Errorf("#3: %v retry after %v, want over_limit for about 2.5 minutes", res.Code, s.RetryAfter)
	}
}

// TestCheckWildcardInsideValue: a wildcard inside a value matches as in
// Lyft; with share_threshold its values share one counter, without it each
// value has its own.
func TestCheckWildcardInsideValue(t *testing.T) {
	t.Parallel()
	eng := lyftEngine(t)
	for i, path := range []string{"/api/users/v1", "/api/orders/v1", "/apiv1"} {
		want := engine.OK
		if i == 2 {
			want = engine.OverLimit
		}
		if res := check(t, eng, req2("lyft", entry("midpath", path))); res.Code != want {
			t.Errorf("%s: %v, want %v (one counter of 2 for every /api*v1)", path, res.Code, want)
		}
	}
	if res := check(t, eng, req2("lyft", entry("midpath", "/api/users/v2"))); res.Statuses[0].Limit != nil {
		t.Errorf("/api/users/v2 matched %v, want no limit", res.Statuses[0].Limit.Name)
	}
	for _, tenant := range []string{"t1prod", "t2prod"} {
		if res := check(t, eng, req2("lyft", entry("tenant", tenant))); res.Code != engine.OK {
			t.Errorf("%s: %v, want ok (a counter per value)", tenant, res.Code)
		}
	}
	if res := check(t, eng, req2("lyft", entry("tenant", "t1prod"))); res.Code != engine.OverLimit {
		t.Errorf("t1prod again: %v, want over_limit", res.Code)
	}
}
