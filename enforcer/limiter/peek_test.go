package limiter

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/rules"
)

// peekAlgorithms are the limits TestPeek reads: every algorithm, at 10 per
// minute, so that nothing refills between the takes and the peeks.
var peekAlgorithms = []Request{
	{Algorithm: rules.TokenBucket, Limit: 10, Period: time.Minute},
	{Algorithm: rules.LeakyBucket, Limit: 10, Period: time.Minute},
	{Algorithm: rules.FixedWindow, Limit: 10, Period: time.Hour},
	{Algorithm: rules.FixedWindow, Limit: 10, Period: rules.Day.Period(), Calendar: true},
	{Algorithm: rules.SlidingWindowLog, Limit: 10, Period: time.Minute},
	{Algorithm: rules.SlidingWindowCounter, Limit: 10, Period: time.Hour},
}

// stateDump is what a limit's state key holds: its serialized value and
// whether it expires no later than before.
type stateDump struct {
	value string
	ttl   time.Duration
}

func dumpState(t *testing.T, c redis.UniversalClient, req Request) stateDump {
	t.Helper()
	ctx := context.Background()
	key := req.Key + algorithms[req.Algorithm].suffix
	v, err := c.Dump(ctx, key).Result()
	if err != nil {
		t.Fatalf("DUMP %s: %v", key, err)
	}
	ttl, err := c.PTTL(ctx, key).Result()
	if err != nil {
		t.Fatalf("PTTL %s: %v", key, err)
	}
	return stateDump{v, ttl}
}

func TestPeek(t *testing.T) {
	t.Parallel()
	r, c, prefix := newTestRedis(t)
	testPeek(t, r, c, prefix)
}

func TestPeekCluster(t *testing.T) {
	t.Parallel()
	seeds := startCluster(t)
	c, err := NewClient(seeds, WithTimeout(2*time.Second), WithDialTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, ok := c.(*redis.ClusterClient); !ok {
		t.Fatalf("NewClient(%q) = %T, want a cluster client", seeds, c)
	}
	testPeek(t, NewRedis(c), c, "peek:")
}

// testPeek: three takes, then Peek reports 3 used, twice alike, the store
// is byte for byte the same, and a fourth take decides as it does for a
// twin limit that was never peeked at. Reset then empties one value's
// counter and leaves the twin's alone.
func testPeek(t *testing.T, r *Redis, c redis.UniversalClient, prefix string) {
	ctx := context.Background()
	for _, base := range peekAlgorithms {
		name := string(base.Algorithm)
		if base.Calendar {
			name += "_calendar"
		}
		t.Run(name, func(t *testing.T) {
			a, b := base, base
			a.Key, b.Key = testKey(prefix, name+"-a"), testKey(prefix, name+"-b")
			a.Hits, b.Hits = 1, 1
			for range 3 {
				take(t, r, a, b)
			}
			before := dumpState(t, c, a)
			var first []State
			for i := range 2 {
				// Several slots in one call, and a key twice.
				got, err := r.Peek(ctx, []Request{a, b, a})
				if err != nil {
					t.Fatalf("Peek: %v", err)
				}
				for j, s := range got {
					if s.Used() != 3 || s.Remaining != 7 || s.Limit != 10 {
						t.Fatalf("peek %d, state %d = %+v (used %d), want 3 used of 10", i, j, s, s.Used())
					}
					// A sliding window counter's current window weighs in
					// until one period after it ends.
					if s.ResetAfter <= 0 || s.ResetAfter > 2*base.Period {
						t.Errorf("peek %d, state %d: reset after %v, want within (0, %v]", i, j, s.ResetAfter, 2*base.Period)
					}
					if time.Since(s.At).Abs() > time.Minute {
						t.Errorf("peek %d: At = %v, want the store's time (about now)", i, s.At)
					}
				}
				if first == nil {
					first = got
				} else if got[0].Remaining != first[0].Remaining || got[0].ResetAfter > first[0].ResetAfter {
					t.Errorf("second peek %+v, first %+v: want the same counter", got[0], first[0])
				}
			}
			after := dumpState(t, c, a)
			if after.value != before.value {
				t.Errorf("state after peeking = %q, before %q: Peek wrote", after.value, before.value)
			}
			if after.ttl > before.ttl {
				t.Errorf("TTL after peeking %v > before %v: Peek refreshed the key", after.ttl, before.ttl)
			}
			da, db := take(t, r, a)[0], take(t, r, b)[0]
			if da.Allowed != db.Allowed || da.Remaining != db.Remaining || da.Remaining != 6 {
				t.Errorf("fourth take: peeked %+v, never peeked %+v; want both allowed with 6 remaining", da, db)
			}

			n, err := r.Reset(ctx, []string{a.Key})
			if err != nil || n != 1 {
				t.Fatalf("Reset = %d, %v; want 1 state key deleted", n, err)
			}
			got, err := r.Peek(ctx, []Request{a, b})
			if err != nil {
				t.Fatal(err)
			}
			if got[0].Used() != 0 || got[0].Remaining != 10 {
				t.Errorf("after Reset: %+v, want a fresh counter", got[0])
			}
			if got[1].Used() != 4 {
				t.Errorf("the twin after Reset: %+v, want its 4 used untouched", got[1])
			}
		})
	}
}

func TestPeekRefusesInvalid(t *testing.T) {
	t.Parallel()
	r, _, prefix := newTestRedis(t)
	ctx := context.Background()
	if _, err := r.Peek(ctx, []Request{{Key: testKey(prefix, "x"), Limit: 0, Period: time.Second}}); err == nil {
		t.Error("Peek of a limit of 0: no error")
	}
	if _, err := r.Peek(ctx, []Request{{Key: testKey(prefix, "x"), Algorithm: "nope", Limit: 1, Period: time.Second}}); err == nil {
		t.Error("Peek of an unknown algorithm: no error")
	}
	if got, err := r.Peek(ctx, nil); err != nil || len(got) != 0 {
		t.Errorf("Peek(nil) = %v, %v", got, err)
	}
	if _, err := r.Reset(ctx, []string{""}); err == nil {
		t.Error("Reset of an empty key: no error")
	}
}

// TestPeekStoresAgree: after random Takes on both, Peek of Redis and of
// Local reads the same counters, also after both Reset a limit.
func TestPeekStoresAgree(t *testing.T) {
	t.Parallel()
	stores, prefix := clockStores(t)
	r, l := stores[0].store.(*Redis), stores[1].store.(*Local)
	rng := rand.New(rand.NewPCG(7, 8))
	var limits []Request
	for _, base := range peekAlgorithms {
		for k := range 2 {
			req := base
			req.Key = fmt.Sprintf("%s.%t.%d", base.Algorithm, base.Calendar, k)
			req.Limit = 3 + rng.Int64N(8)
			if base.Algorithm == rules.TokenBucket || base.Algorithm == rules.LeakyBucket {
				req.Burst = 1 + rng.Int64N(10)
			}
			if !base.Calendar {
				req.Period = time.Duration(1+rng.Int64N(5)) * s
			}
			limits = append(limits, req)
		}
	}
	keyed := func(name string, reqs []Request) []Request {
		out := make([]Request, len(reqs))
		for i, req := range reqs {
			req.Key = testKey(prefix, name+req.Key)
			out[i] = req
		}
		return out
	}
	at := int64(t0)
	for step := range 300 {
		at += rng.Int64N(300_000)
		req := limits[rng.IntN(len(limits))]
		req.Hits = []int64{1, 1, 2, 3, 20}[rng.IntN(5)]
		var got [2][]State
		for i, cs := range stores {
			cs.at = at
			cs.take(t, keyed(cs.name, []Request{req})...)
			var err error
			if i == 0 {
				got[i], err = r.Peek(context.Background(), keyed(cs.name, limits))
			} else {
				got[i], err = l.Peek(context.Background(), keyed(cs.name, limits))
			}
			if err != nil {
				t.Fatalf("%s: Peek: %v", cs.name, err)
			}
		}
		for j := range limits {
			// Redis expires a key on the real clock, at most its state's
			// reset away when it was written: on a loaded machine a key
			// within a second of its reset may be gone from Redis while
			// the test's clock has not got there yet.
			expired := got[0][j].Remaining == got[0][j].Limit && got[1][j].ResetAfter < time.Second
			if got[0][j] != got[1][j] && !expired {
				t.Fatalf("step %d, limit %d (%+v):\nredis %+v\nlocal %+v", step, j, limits[j], got[0][j], got[1][j])
			}
		}
		if step%50 == 49 {
			// Both forget the limit; the next step's peeks compare what
			// is left. (How many keys each held differs: Redis expires
			// keys on the real clock, Local on the test's.)
			k := limits[rng.IntN(len(limits))].Key
			if _, err := r.Reset(context.Background(), []string{testKey(prefix, "redis"+k)}); err != nil {
				t.Fatal(err)
			}
			if _, err := l.Reset(context.Background(), []string{testKey(prefix, "local"+k)}); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// BenchmarkPeek measures Peek of one limit with three counted hits, per
// algorithm, with concurrent callers (the console's inspect is one Peek of
// the limits of a request):
//
//	go test -run '^$' -bench BenchmarkPeek -benchtime 5000x ./enforcer/limiter/
func BenchmarkPeek(b *testing.B) {
	r, _, prefix := newTestRedis(b)
	for _, base := range peekAlgorithms {
		name := string(base.Algorithm)
		if base.Calendar {
			name += "_calendar"
		}
		b.Run(name, func(b *testing.B) {
			req := base
			req.Key, req.Hits = testKey(prefix, "bench-"+name), 1
			for range 3 {
				take(b, r, req)
			}
			b.SetParallelism(2)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := r.Peek(context.Background(), []Request{req}); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
