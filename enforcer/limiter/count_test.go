package limiter

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice/rules"
)

func count(t *testing.T, r *Redis, us ...Usage) []State {
	t.Helper()
	st, err := r.Count(context.Background(), us)
	if err != nil {
		t.Fatalf("Count: %v", err)
	}
	if len(st) != len(us) {
		t.Fatalf("Count returned %d states for %d usages", len(st), len(us))
	}
	return st
}

// Reported usage and checks share one counter, over its limit included.
func TestCountSharesTheCounter(t *testing.T) {
	t.Parallel()
	for _, alg := range []rules.Algorithm{rules.TokenBucket, rules.LeakyBucket, rules.FixedWindow, rules.SlidingWindowLog, rules.SlidingWindowCounter} {
		t.Run(string(alg), func(t *testing.T) {
			t.Parallel()
			r, _, prefix := newTestRedis(t)
			req := Request{Key: testKey(prefix, "shared"), Algorithm: alg, Limit: 10, Period: time.Hour, Hits: 4}
			if got := count(t, r, Usage{Request: req})[0]; got.Remaining != 6 || got.Limit != 10 {
				t.Fatalf("after 4 reported: %+v, want 6 of 10 remaining", got)
			}
			req.Hits = 1
			if d := take1(t, r, req); !d.Allowed || d.Remaining != 5 {
				t.Fatalf("check after the report: %+v, want allowed with 5 remaining", d)
			}
			req.Hits = 50 // more than fits: counted anyway
			if got := count(t, r, Usage{Request: req})[0]; got.Remaining != 0 {
				t.Fatalf("after 50 more reported: %+v, want 0 remaining", got)
			}
			req.Hits = 1
			if d := take1(t, r, req); d.Allowed {
				t.Fatalf("check after the counter went over: %+v, want rejected", d)
			}
			req.Hits = 0
			if got := count(t, r, Usage{Request: req})[0]; got.Remaining != 0 {
				t.Fatalf("reading: %+v, want 0 remaining", got)
			}
		})
	}
}

// A bucket is charged as of the elapsed time: hits admitted at the limit's
// rate over that time leave it where checks at that rate would have.
func TestCountCreditsElapsedRefill(t *testing.T) {
	t.Parallel()
	r, _, prefix := newTestRedis(t)
	now := time.Now().UnixMicro()
	r.now = func() int64 { return now }
	at := func(key string, hits int64, elapsed time.Duration) int64 {
		t.Helper()
		return count(t, r, Usage{Request: Request{Key: testKey(prefix, key), Limit: 10, Period: time.Minute, Hits: hits}, Elapsed: elapsed})[0].Remaining
	}
	// 10/min, a token every 6 s.
	if got := at("rate", 10, time.Minute); got != 10 {
		t.Fatalf("10 hits over the last minute: %d remaining, want 10 (the refill paid for them)", got)
	}
	if got := at("burst", 15, 30*time.Second); got != 0 {
		t.Fatalf("15 hits over 30 s: %d remaining, want 0 (capacity and refill spent)", got)
	}
	if got := at("debt", 25, 30*time.Second); got != 0 {
		t.Fatalf("25 hits over 30 s: %d remaining, want 0", got)
	}
	now += (30 * time.Second).Microseconds()
	if got := at("burst", 0, 0); got != 5 {
		t.Fatalf("30 s after 15: %d remaining, want 5", got)
	}
	now += (30 * time.Second).Microseconds()
	if got := at("debt", 0, 0); got != 0 {
		t.Fatalf("60 s after 25: %d remaining, want 0 (10 in debt repaid)", got)
	}
	now += (6 * time.Second).Microseconds()
	if got := at("debt", 0, 0); got != 1 {
		t.Fatalf("66 s after 25: %d remaining, want 1", got)
	}
}

// A sliding_window_log never logs more than its limit.
func TestCountSlidingLogBounded(t *testing.T) {
	t.Parallel()
	r, c, prefix := newTestRedis(t)
	req := Request{Key: testKey(prefix, "log"), Algorithm: rules.SlidingWindowLog, Limit: 5, Period: time.Minute, Hits: 1 << 40}
	count(t, r, Usage{Request: req})
	if n := c.ZCard(context.Background(), req.Key+":sl").Val(); n != 5 {
		t.Fatalf("log holds %d members, want 5", n)
	}
}

func TestCountInvalid(t *testing.T) {
	t.Parallel()
	r, _, prefix := newTestRedis(t)
	for _, u := range []Usage{
		{Request: Request{Key: "", Limit: 1, Period: time.Second}},
		{Request: Request{Key: testKey(prefix, "x"), Limit: 0, Period: time.Second}},
		{Request: Request{Key: testKey(prefix, "x"), Limit: 1, Period: time.Second, Hits: -1}},
		{Request: Request{Key: testKey(prefix, "x"), Limit: 1, Period: time.Second}, Elapsed: -time.Second},
	} {
		if _, err := r.Count(context.Background(), []Usage{u}); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("Count(%+v) = %v, want ErrInvalidRequest", u, err)
		}
	}
}

func TestPresence(t *testing.T) {
	t.Parallel()
	r, _, prefix := newTestRedis(t)
	ctx := context.Background()
	key := prefix + "presence"
	must := func(ns []int64, err error) int64 {
		t.Helper()
		if err != nil || len(ns) != 1 {
			t.Fatalf("presence: %v, %v", ns, err)
		}
		return ns[0]
	}
	if n := must(r.Join(ctx, []Presence{{key, "a", time.Minute}})); n != 1 {
		t.Fatalf("after a joined: %d members", n)
	}
	if n := must(r.Join(ctx, []Presence{{key, "b", time.Minute}})); n != 2 {
		t.Fatalf("after b joined: %d members", n)
	}
	if n := must(r.Join(ctx, []Presence{{key, "a", time.Minute}})); n != 2 {
		t.Fatalf("after a refreshed: %d members", n)
	}
	if n := must(r.Leave(ctx, []Presence{{Key: key, Member: "b"}})); n != 1 {
		t.Fatalf("after b left: %d members", n)
	}
	if n := must(r.Join(ctx, []Presence{{key, "c", 50 * time.Millisecond}})); n != 2 {
		t.Fatalf("after c joined: %d members", n)
	}
	deadline := time.Now().Add(5 * time.Second)
	for must(r.Members(ctx, []Presence{{Key: key}})) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("c never expired")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := r.Join(ctx, []Presence{{key, "", time.Second}}); !errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("empty member: %v, want ErrInvalidRequest", err)
	}
}
