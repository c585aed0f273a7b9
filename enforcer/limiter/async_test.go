package limiter

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/rules"
)

// TestFlushCountsLikeTakes checks that one Flush of hits admitted at
// several times leaves every algorithm's counter as Takes of those hits at
// those times do, across a window boundary too.
func TestFlushCountsLikeTakes(t *testing.T) {
	t.Parallel()
	r, _, prefix := newTestRedis(t)
	const sec = int64(time.Second / time.Microsecond)
	// Times in µs, the last one is the flush's; 2.9 s → 3.2 s crosses a
	// window of 1 s.
	base := (time.Now().UnixMicro()/sec + 100) * sec
	times := []int64{base + 2_900_000, base + 2_950_000, base + 3_050_000, base + 3_200_000}
	hits := []int64{3, 2, 4, 1}
	for _, alg := range []rules.Algorithm{rules.TokenBucket, rules.LeakyBucket, rules.FixedWindow, rules.SlidingWindowLog, rules.SlidingWindowCounter} {
		t.Run(string(alg), func(t *testing.T) {
			req := Request{Algorithm: alg, Limit: 20, Period: time.Second, Burst: 20}
			a, b := req, req
			a.Key, b.Key = testKey(prefix, string(alg)+"-takes"), testKey(prefix, string(alg)+"-flush")
			var adm []Admitted
			for i, at := range times {
				r.now = func() int64 { return at }
				a.Hits = hits[i]
				if d := take1(t, r, a); !d.Allowed {
					t.Fatalf("take %d not allowed", i)
				}
				adm = append(adm, Admitted{Age: time.Duration(times[len(times)-1]-at) * time.Microsecond, Hits: hits[i]})
			}
			r.now = func() int64 { return times[len(times)-1] }
			got, err := r.Flush(context.Background(), time.Time{}, "", []Flush{{Req: b, Admitted: adm}})
			if err != nil || got[0].Err != nil {
				t.Fatalf("Flush: %v %v", err, got[0].Err)
			}
			a.Hits, b.Hits = 0, 0
			st, err := r.Peek(context.Background(), []Request{a, b})
			if err != nil {
				t.Fatalf("Peek: %v", err)
			}
			if st[0].Remaining != st[1].Remaining || got[0].Remaining != st[1].Remaining {
				t.Errorf("remaining: takes %d, flush %d (reported %d)", st[0].Remaining, st[1].Remaining, got[0].Remaining)
			}
			if d := st[0].ResetAfter - got[0].ResetAfter; d < -time.Microsecond || d > time.Microsecond {
				t.Errorf("reset after: takes %v, flush reported %v", st[0].ResetAfter, got[0].ResetAfter)
			}
		})
	}
}

// TestFlushOverLimit checks that flushed hits count even past the limit
// (they were admitted), that the reply says by how much, and that Takes
// are then refused.
func TestFlushOverLimit(t *testing.T) {
	t.Parallel()
	r, _, prefix := newTestRedis(t)
	for _, alg := range []rules.Algorithm{rules.TokenBucket, rules.FixedWindow, rules.SlidingWindowCounter, rules.SlidingWindowLog} {
		req := Request{Key: testKey(prefix, "over-"+string(alg)), Algorithm: alg, Limit: 10, Period: time.Minute}
		got, err := r.Flush(context.Background(), time.Time{}, "", []Flush{{Req: req, Admitted: []Admitted{{Hits: 12}}}})
		if err != nil || got[0].Err != nil {
			t.Fatalf("%s: Flush: %v %v", alg, err, got[0].Err)
		}
		if alg != rules.SlidingWindowLog && got[0].Remaining > -1 {
			t.Errorf("%s: remaining %d after 12 hits of 10, want negative", alg, got[0].Remaining)
		}
		req.Hits = 1
		if d := take1(t, r, req); d.Allowed {
			t.Errorf("%s: a take after the limit was flushed past is allowed", alg)
		}
	}
}

// TestFlushRetriedWithID sends one flush three times with its id, as a
// node retries a flush whose answer never came: its hits count once, every
// answer reports the remaining after them, and another id counts again.
func TestFlushRetriedWithID(t *testing.T) {
	t.Parallel()
	r, _, prefix := newTestRedis(t)
	for _, alg := range []rules.Algorithm{rules.TokenBucket, rules.LeakyBucket, rules.FixedWindow, rules.SlidingWindowCounter, rules.SlidingWindowLog} {
		var fs []Flush
		// More keys than one call holds: the retry must name each call's
		// marker as the first send did.
		for i := range maxFlushKeys + 3 {
			req := Request{Key: testKey(prefix, fmt.Sprintf("retry-%s-%d", alg, i)), Algorithm: alg, Limit: 100, Period: time.Hour}
			fs = append(fs, Flush{Req: req, Admitted: []Admitted{{Age: 2 * time.Millisecond, Hits: 3}, {Age: time.Millisecond, Hits: 2}}})
		}
		for try := range 3 {
			got, err := r.Flush(context.Background(), time.Time{}, "node-a:1", fs)
			if err != nil {
				t.Fatal(err)
			}
			for i, s := range got {
				if s.Err != nil || s.Remaining != 95 {
					t.Fatalf("%s, send %d, key %d: %+v, want remaining 95", alg, try+1, i, s)
				}
			}
		}
		got, err := r.Flush(context.Background(), time.Time{}, "node-a:2", fs[:1])
		if err != nil || got[0].Err != nil || got[0].Remaining != 90 {
			t.Fatalf("%s: another flush: %+v %v, want remaining 90", alg, got, err)
		}
	}
}

// TestFlushManyKeys flushes more keys than one script call holds.
func TestFlushManyKeys(t *testing.T) {
	t.Parallel()
	r, _, prefix := newTestRedis(t)
	fs := make([]Flush, 600)
	for i := range fs {
		fs[i] = Flush{Req: Request{Key: testKey(prefix, fmt.Sprint("k", i)), Algorithm: rules.FixedWindow, Limit: 100, Period: time.Minute},
			Admitted: []Admitted{{Hits: int64(i%7 + 1)}}}
	}
	got, err := r.Flush(context.Background(), time.Time{}, "", fs)
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range got {
		if s.Err != nil || s.Remaining != 100-int64(i%7+1) {
			t.Fatalf("key %d: %+v", i, s)
		}
	}
	if _, err := r.Flush(context.Background(), time.Time{}, "", []Flush{{Req: Request{Key: "x", Algorithm: rules.LeakyBucket, Limit: 1, Period: time.Second, MaxDelay: time.Second}}}); err == nil {
		t.Error("a shaping leaky bucket was flushed")
	}
}

// TestFlushClock checks the estimate of Redis's clock that Flush times
// hits with: after a few flushes it is never later than Redis's time, and
// behind it by no more than a round trip and the time to read it.
func TestFlushClock(t *testing.T) {
	t.Parallel()
	r, c, prefix := newTestRedis(t)
	ctx := context.Background()
	req := Request{Key: testKey(prefix, "clock"), Algorithm: rules.FixedWindow, Limit: 1000, Period: time.Minute}
	for range 10 {
		if got, err := r.Flush(ctx, time.Time{}, "", []Flush{{Req: req, Admitted: []Admitted{{Hits: 1}}}}); err != nil || got[0].Err != nil {
			t.Fatalf("Flush: %v %+v", err, got)
		}
	}
	clock := &r.clocks.one
	for range 20 {
		s := time.Now()
		est, ok := clock.at(s)
		x, err := c.Time(ctx).Result()
		e := time.Now()
		if err != nil || !ok {
			t.Fatalf("TIME: %v; estimate known %v", err, ok)
		}
		clock.mu.Lock()
		rtt := clock.rtt
		clock.mu.Unlock()
		// Redis read x at or after s: the estimate of its time at s is
		// at most x, and at least x less (e − s) less the estimate's error.
		if est > x.UnixMicro() {
			t.Errorf("estimate %d µs is later than Redis's time %d µs", est, x.UnixMicro())
		}
		if lag := time.Duration(x.UnixMicro()-est) * time.Microsecond; lag > e.Sub(s)+rtt+time.Millisecond {
			t.Errorf("estimate %v behind Redis, more than the read (%v) and the round trip (%v)", lag, e.Sub(s), rtt)
		}
	}
}
