package engine_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/enforcer/limiter"
	"github.com/sluicehq/sluice/internal/testenv"
)

// Tests of the limit settings the engine reads from rules.Limit: calendar
// windows, leaky-bucket shaping, requests_per_unit 0, share_threshold.

const settingsYAML = `domain: api
descriptors:
  - key: weekly
    rate_limit: {unit: week, requests_per_unit: 5}
    algorithm: fixed_window
    calendar: true
  - key: rolling
    rate_limit: {unit: week, requests_per_unit: 5}
    algorithm: fixed_window
  - key: leaky
    rate_limit: {unit: second, requests_per_unit: 2}
    algorithm: leaky_bucket
    burst: 10
    on_limit: {action: delay, max_delay: 2s, status: 503}
  - key: blocked
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: blocked_shadow
    rate_limit: {unit: second, requests_per_unit: 0}
    shadow_mode: true
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: route
    value: /files/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: page
    value: /docs/*
    rate_limit: {unit: minute, requests_per_unit: 2}
`

func settingsEngine(t *testing.T) *engine.Engine {
	t.Helper()
	client, err := limiter.NewClient(testenv.RedisURL(t), limiter.WithTimeout(2*time.Second), limiter.WithDialTimeout(2*time.Second)) // a loaded machine must not fail open
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	eng := engine.New(limiter.NewRedis(client), testenv.KeyPrefix(t))
	if err := eng.Apply(1, compile(t, settingsYAML)); err != nil {
		t.Fatal(err)
	}
	return eng
}

func TestCheckCalendarWindow(t *testing.T) {
	t.Parallel()
	eng := settingsEngine(t)
	now := time.Now().UTC()
	midnight := time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, time.UTC)
	nextMonday := midnight.AddDate(0, 0, (8-int(midnight.Weekday()))%7)
	if !nextMonday.After(now) {
		nextMonday = nextMonday.AddDate(0, 0, 7)
	}
	// Weeks counted from the epoch start on Thursdays: the calendar week
	// must end on Monday 00:00 UTC instead.
	tests := []struct {
		key  string
		want time.Duration
	}{
		{"weekly", nextMonday.Sub(now)},
		{"rolling", time.Duration(7*24*time.Hour - time.Duration(now.UnixNano())%(7*24*time.Hour))},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			res := check(t, eng, req(entry(tt.key, "x")))
			s := res.Statuses[0]
			if res.Code != engine.OK || s.Remaining != 4 {
				t.Fatalf("%v remaining %d, want ok with 4 left", res.Code, s.Remaining)
			}
			if d := s.ResetAfter - tt.want; d < -time.Minute || d > time.Minute {
				t.Errorf("reset after %v, want the window's end in %v", s.ResetAfter, tt.want)
			}
		})
	}
}

func TestCheckLeakyBucketShaping(t *testing.T) {
	// Not parallel: it measures the shaping delays it asserts.
	eng := settingsEngine(t)
	shaped := func(v string) engine.Result {
		r := req(entry("leaky", v))
		r.Shape = true
		return check(t, eng, r)
	}
	// Shaping: 2/s drains one request every 500 ms, so 2 s of queue holds
	// the first request plus four waiting ones.
	var last time.Duration
	admitted := 0
	for i := range 8 {
		res := shaped("a")
		if res.Code == engine.OverLimit {
			if res.Delay != 0 || res.Statuses[0].RetryAfter <= 0 {
				t.Errorf("request %d rejected with delay %v retry %v, want no delay and a retry-after", i+1, res.Delay, res.Statuses[0].RetryAfter)
			}
			if st := res.Statuses[0].Limit.OnLimit.Status; st != 503 {
				t.Errorf("rejecting limit's on_limit status %d, want 503", st)
			}
			continue
		}
		admitted++
		if res.Delay > 2*time.Second || (i > 0 && res.Delay <= last) || res.Delay != res.Statuses[0].Delay {
			t.Errorf("request %d: delay %v (status %v), want growing, at most 2s", i+1, res.Delay, res.Statuses[0].Delay)
		}
		last = res.Delay
	}
	if admitted != 5 {
		t.Errorf("admitted %d shaped requests, want 5 (2 s of queue at 500 ms each, plus the first)", admitted)
	}
	// Without Shape the bucket polices: its burst of 10 passes at once.
	for i := range 12 {
		res := check(t, eng, req(entry("leaky", "b")))
		if want := i < 10; (res.Code == engine.OK) != want || res.Delay != 0 {
			t.Errorf("unshaped request %d: %v delay %v, want allowed=%v without delay", i+1, res.Code, res.Delay, want)
		}
	}
}

func TestCheckBlocksAll(t *testing.T) {
	t.Parallel()
	t.Run("store down", func(t *testing.T) {
		// The store refuses connections: a blocking limit still answers,
		// with no store error since the store was never asked.
		eng := deadEngine(t)
		if err := eng.Apply(2, compile(t, settingsYAML)); err != nil {
			t.Fatal(err)
		}
		res := check(t, eng, req(entry("blocked", "x")))
		if res.Code != engine.OverLimit || res.StoreErr != nil || res.Statuses[0].StoreFailed {
			t.Fatalf("%v store err %v, want over_limit without asking the store", res.Code, res.StoreErr)
		}
		if res.Statuses[0].RetryAfter != time.Second {
			t.Errorf("retry after %v, want one unit (1s)", res.Statuses[0].RetryAfter)
		}
	})
	t.Run("others not charged", func(t *testing.T) {
		eng := settingsEngine(t)
		for range 5 {
			if res := check(t, eng, req(entry("blocked", "x"), entry("user", "u"))); res.Code != engine.OverLimit {
				t.Fatalf("blocked+user: %v, want over_limit", res.Code)
			}
		}
		if res := check(t, eng, req(entry("user", "u"))); res.Code != engine.OK || res.Statuses[0].Remaining != 2 {
			t.Errorf("user after blocked requests: %v remaining %d, want ok with 2 left (nothing consumed before)", res.Code, res.Statuses[0].Remaining)
		}
	})
	t.Run("shadow", func(t *testing.T) {
		eng := settingsEngine(t)
		res := check(t, eng, req(entry("blocked_shadow", "x"), entry("user", "v")))
		if res.Code != engine.OK || !res.Statuses[0].Shadowed || res.Statuses[1].Remaining != 2 {
			t.Errorf("shadow block: %v shadowed=%v user remaining %d, want ok, shadowed, user counted (2 left)", res.Code, res.Statuses[0].Shadowed, res.Statuses[1].Remaining)
		}
	})
}

func TestCheckShareThreshold(t *testing.T) {
	t.Parallel()
	eng := settingsEngine(t)
	// share_threshold: every /files/ path counts on one counter of 2.
	for i, path := range []string{"/files/a", "/files/b", "/files/c"} {
		want := engine.OK
		if i == 2 {
			want = engine.OverLimit
		}
		if res := check(t, eng, req(entry("route", path))); res.Code != want {
			t.Errorf("%s: %v, want %v", path, res.Code, want)
		}
	}
	// Without it each value has its own counter.
	for _, path := range []string{"/docs/a", "/docs/b", "/docs/c"} {
		if res := check(t, eng, req(entry("page", path))); res.Code != engine.OK {
			t.Errorf("%s: %v, want ok (a counter per value)", path, res.Code)
		}
	}
}
