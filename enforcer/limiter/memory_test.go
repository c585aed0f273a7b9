package limiter

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/sluicehq/sluice/rules"
)

var allAlgorithms = []rules.Algorithm{rules.TokenBucket, rules.LeakyBucket, rules.FixedWindow, rules.SlidingWindowLog, rules.SlidingWindowCounter}

// TestStateKeys checks, for every algorithm, that a peek creates no key, a
// take creates exactly one key with a TTL no longer than the algorithm's
// horizon, and logs its MEMORY USAGE (the figures in BENCHMARKS.md: run
// with -v).
func TestStateKeys(t *testing.T) {
	t.Parallel()
	r, c, prefix := newTestRedis(t)
	ctx := context.Background()
	// A typical descriptor key: prefix, domain, two entries.
	base := Key("sluice:", "api", []rules.Entry{{Key: "api_key", Value: "k-0123456789abcdef"}, {Key: "route", Value: "/v1/search"}})
	for _, alg := range allAlgorithms {
		t.Run(string(alg), func(t *testing.T) {
			req := Request{Key: prefix + base, Algorithm: alg, Limit: 100, Period: time.Hour}
			take1(t, r, req)
			if n := c.Exists(ctx, stateKey(req)).Val(); n != 0 {
				t.Fatalf("peek created the state key")
			}
			req.Hits = 1
			take1(t, r, req)
			ttl, err := c.PTTL(ctx, stateKey(req)).Result()
			if err != nil {
				t.Fatal(err)
			}
			// Buckets: until full/empty (36 s for one hit); windows: at most 2 periods.
			if ttl <= 0 || ttl > 2*time.Hour {
				t.Errorf("TTL %v, want in (0, 2h]", ttl)
			}
			one := c.MemoryUsage(ctx, stateKey(req), 0).Val() // SAMPLES 0: exact
			for range 99 {
				take1(t, r, req)
			}
			full := c.MemoryUsage(ctx, stateKey(req), 0).Val()
			t.Logf("%-24s key %d bytes; MEMORY USAGE after 1 hit: %d B, after 100 hits (limit 100): %d B",
				alg, len(stateKey(req)), one, full)
			if d := take1(t, r, req); d.Allowed {
				t.Errorf("101st hit allowed")
			}
			if alg == rules.SlidingWindowLog {
				// Past 128 members Redis leaves the compact listpack encoding.
				big := req
				big.Key, big.Limit, big.Hits = big.Key+"big", 1000, 1000
				take1(t, r, big)
				t.Logf("%-24s MEMORY USAGE after 1000 hits (limit 1000): %d B", alg, c.MemoryUsage(ctx, stateKey(big), 0).Val())
			}
		})
	}
}

// TestSlidingLogBounded takes far more than the limit over many windows and
// checks the sorted set never holds more members than the limit.
func TestSlidingLogBounded(t *testing.T) {
	t.Parallel()
	r, c, prefix := newTestRedis(t)
	now := int64(t0)
	r.now = func() int64 { return now }
	req := Request{Key: testKey(prefix, "log"), Algorithm: rules.SlidingWindowLog, Limit: 20, Period: time.Second}
	for i := range 400 {
		now += 37_000 // 37 ms: about 27 attempts per window
		req.Hits = 1 + int64(i%3)
		take1(t, r, req)
		if n := c.ZCard(context.Background(), stateKey(req)).Val(); n > 20 {
			t.Fatalf("after %d takes the log holds %d members, limit 20", i+1, n)
		}
	}
	// Hits within one microsecond stay distinct members.
	burst := Request{Key: testKey(prefix, "same-µs"), Algorithm: rules.SlidingWindowLog, Limit: 50, Period: time.Second, Hits: 3}
	for range 5 {
		take1(t, r, burst)
	}
	take(t, r, burst, burst) // the same key twice in one Take
	if n := c.ZCard(context.Background(), stateKey(burst)).Val(); n != 21 {
		t.Errorf("21 hits in one microsecond left %d members", n)
	}
}

// TestBucketStateText checks the number the buckets store: a whole one as
// plain digits (the script writes it with %d), a fractional one with 17
// significant digits (%.17g), each the exact double the script computed, and
// the TTL until the bucket is full (empty) again.
func TestBucketStateText(t *testing.T) {
	t.Parallel()
	r, c, prefix := newTestRedis(t)
	r.now = func() int64 { return t0 }
	ctx := context.Background()
	for _, alg := range []rules.Algorithm{rules.TokenBucket, rules.LeakyBucket} {
		for _, tc := range []struct {
			limit int64
			want  string
		}{
			{10, "1700002800200000"},  // 100 ms per token: whole
			{3, "1700002800666666.8"}, // 333333.33 µs per token: fractional
		} {
			req := Request{Key: testKey(prefix, fmt.Sprintf("%s-%d", alg, tc.limit)), Algorithm: alg, Limit: tc.limit, Period: time.Second, Hits: 2}
			take1(t, r, req)
			got, err := c.Get(ctx, stateKey(req)).Result()
			if err != nil {
				t.Fatal(err)
			}
			emission := float64(time.Second/time.Microsecond) / float64(tc.limit)
			if want := fmt.Sprintf("%.17g", float64(t0)+emission*2); got != tc.want || got != want {
				t.Errorf("%s limit %d: stored %q, want %q (%%.17g: %q)", alg, tc.limit, got, tc.want, want)
			}
			wantTTL := time.Duration(math.Ceil(emission*2/1000)) * time.Millisecond
			if ttl := c.PTTL(ctx, stateKey(req)).Val(); ttl <= 0 || ttl > wantTTL {
				t.Errorf("%s limit %d: TTL %v, want (0, %v]", alg, tc.limit, ttl, wantTTL)
			}
		}
	}
}
