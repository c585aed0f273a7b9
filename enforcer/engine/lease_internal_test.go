package engine

import (
	"context"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/enforcer/breaker"
	"github.com/sluicehq/sluice/enforcer/limiter"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
)

// leaseRules compiles one domain "api" with a leased limit "hot" (and a
// non-leased limit "cold" of 2 per hour).
func leaseRules(t testing.TB, alg rules.Algorithm, limit int, extra string) *rules.Set {
	t.Helper()
	src := fmt.Sprintf(`domain: api
descriptors:
  - key: hot
    algorithm: %s
    rate_limit: {unit: hour, requests_per_unit: %d}
    lease: true
%s  - key: cold
    rate_limit: {unit: hour, requests_per_unit: 2}
`, alg, limit, extra)
	d, err := rules.Parse("lease.yaml", []byte(src))
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	set, err := rules.Compile([]*rules.Domain{d})
	if err != nil {
		t.Fatalf("compile: %v", err)
	}
	return set
}

// leaseEngine is an engine as a node builds it (Batcher, breaker), with
// leases, on the Redis at url under prefix.
func leaseEngine(t testing.TB, url, prefix string, o LeaseOptions) *Engine {
	t.Helper()
	client, err := limiter.NewClient(url, limiter.WithTimeout(2*time.Second), limiter.WithDialTimeout(2*time.Second)) // a loaded machine must not fail open
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	r := limiter.NewRedis(client)
	if o.MinRate == 0 {
		o.MinRate = -1
	}
	if o.Timeout == 0 {
		o.Timeout = 2 * time.Second
	}
	return New(limiter.NewBatcher(r, limiter.BatchOptions{Timeout: 2 * time.Second}), prefix,
		WithBreaker(breaker.New(breaker.Config{Hard: StoreDown})), WithLeases(r, o))
}

func hot(value string) Request {
	return Request{Domain: "api", Descriptors: []Descriptor{{Entries: []rules.Entry{{Key: "hot", Value: value}}}}}
}

// used returns what Redis has counted on the "hot" limit of value: the
// limit minus its remaining, read with a peek from an engine without leases.
func used(t testing.TB, url, prefix string, set *rules.Set, value string) int64 {
	t.Helper()
	client, err := limiter.NewClient(url, limiter.WithTimeout(2*time.Second), limiter.WithDialTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	e := New(limiter.NewRedis(client), prefix)
	if err := e.Apply(1, set); err != nil {
		t.Fatal(err)
	}
	zero := uint64(0)
	req := hot(value)
	req.Descriptors[0].Hits = &zero
	res, err := e.Check(context.Background(), req)
	if err != nil || res.StoreErr != nil {
		t.Fatalf("peek: %v %v", err, res.StoreErr)
	}
	s := res.Statuses[0]
	return int64(s.Limit.RequestsPerUnit) - s.Remaining
}

// leaseOf returns the engine's lease on the "hot" limit, waiting (checking
// meanwhile, which may consume) until it holds units and no refill is in
// flight. It returns the checks admitted while waiting and the units held.
func leaseOf(t testing.TB, e *Engine, value string) (le *lease, admitted, units int64) {
	t.Helper()
	for range 20000 {
		res, err := e.Check(context.Background(), hot(value))
		if err != nil || res.StoreErr != nil {
			t.Fatalf("check: %v %v", err, res.StoreErr)
		}
		if res.Code == OK {
			admitted++
		}
		e.leases.mu.RLock()
		for _, l := range e.leases.m {
			if l.req.Key == limiter.Key(e.prefix, "api", []rules.Entry{{Key: "hot", Value: value}}) {
				le = l
			}
		}
		e.leases.mu.RUnlock()
		if le == nil {
			continue
		}
		le.mu.Lock()
		units, fetching, live := le.units, le.fetching, time.Now().Before(le.expires)
		le.mu.Unlock()
		if units > 0 && !fetching && live {
			return le, admitted, units
		}
		time.Sleep(time.Millisecond) // let the refill land
	}
	t.Fatal("no lease after 20,000 checks")
	return nil, 0, 0
}

// TestLeaseExactAcrossEngines runs two engines (two nodes) on one leased
// limit under concurrent load until both are refused: the limit admits
// exactly its requests_per_unit (never more, and none stranded in leases,
// since a node is refused only once its own lease is spent), most of them
// from leases.
func TestLeaseExactAcrossEngines(t *testing.T) {
	t.Parallel()
	url := testenv.RedisURL(t)
	for _, alg := range []rules.Algorithm{rules.FixedWindow, rules.SlidingWindowCounter, rules.TokenBucket} {
		t.Run(string(alg), func(t *testing.T) {
			prefix := testenv.KeyPrefix(t)
			const limit = 3000
			set := leaseRules(t, alg, limit, "")
			var engines []*Engine
			for range 2 {
				e := leaseEngine(t, url, prefix, LeaseOptions{Units: 200, MaxLifetime: time.Minute})
				e.SetNodeCount(2)
				if err := e.Apply(1, set); err != nil {
					t.Fatal(err)
				}
				engines = append(engines, e)
			}
			start := time.Now()
			var admitted atomic.Int64
			var wg sync.WaitGroup
			for _, e := range engines {
				for range 8 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for refused := 0; refused < 50; {
							res, err := e.Check(context.Background(), hot("x"))
							if err != nil || res.StoreErr != nil {
								t.Errorf("check: %v %v", err, res.StoreErr)
								return
							}
							if res.Code == OK {
								admitted.Add(1)
								refused = 0
							} else {
								refused++
							}
						}
					}()
				}
			}
			wg.Wait()
			got := admitted.Load()
			// A token bucket refills while the test runs: limit/hour.
			refill := int64(0)
			if alg == rules.TokenBucket {
				refill = int64(time.Since(start).Seconds()*limit/3600) + 1
			}
			if got > limit+refill || got < limit {
				t.Errorf("admitted %d, want %d (+%d refill)", got, limit, refill)
			}
			var fromLeases int64
			for _, e := range engines {
				a, _ := e.LeaseStats()
				fromLeases += a
				if err := e.Close(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			if fromLeases < limit/2 {
				t.Errorf("%d checks admitted from leases, want most of %d", fromLeases, limit)
			}
			if alg != rules.TokenBucket {
				if u := used(t, url, prefix, set, "x"); u != got {
					t.Errorf("Redis counted %d after Close, admitted %d", u, got)
				}
			}
		})
	}
}

// TestLeaseAllOrNothing: a request with a leased limit and a non-leased one
// that refuses consumes nothing from the lease: after Close, Redis has
// counted exactly the admitted requests on the leased limit.
func TestLeaseAllOrNothing(t *testing.T) {
	t.Parallel()
	url, prefix := testenv.RedisURL(t), testenv.KeyPrefix(t)
	set := leaseRules(t, rules.FixedWindow, 1000, "")
	e := leaseEngine(t, url, prefix, LeaseOptions{Units: 100, MaxLifetime: time.Minute})
	if err := e.Apply(1, set); err != nil {
		t.Fatal(err)
	}
	_, warm, _ := leaseOf(t, e, "x")
	both := Request{Domain: "api", Descriptors: []Descriptor{
		{Entries: []rules.Entry{{Key: "hot", Value: "x"}}},
		{Entries: []rules.Entry{{Key: "cold", Value: "c"}}},
	}}
	ok := int64(0)
	for range 20 {
		res, err := e.Check(context.Background(), both)
		if err != nil || res.StoreErr != nil {
			t.Fatalf("check: %v %v", err, res.StoreErr)
		}
		if res.Code == OK {
			ok++
		}
	}
	if ok != 2 {
		t.Errorf("admitted %d of 20 with the cold limit of 2, want 2", ok)
	}
	if a, _ := e.LeaseStats(); a < 2 {
		t.Errorf("%d checks from the lease, want the two admitted ones at least", a)
	}
	if err := e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if u := used(t, url, prefix, set, "x"); u != warm+ok {
		t.Errorf("Redis counted %d on the leased limit, want %d admitted", u, warm+ok)
	}
}

// TestLeaseReturn: the unused units of a lease go back to Redis on Close
// and when the lease expires, for every algorithm that leases.
func TestLeaseReturn(t *testing.T) {
	t.Parallel()
	url := testenv.RedisURL(t)
	for _, tc := range []struct {
		name string
		alg  rules.Algorithm
		life time.Duration
	}{
		{"close/fixed_window", rules.FixedWindow, time.Minute},
		{"close/sliding_window_counter", rules.SlidingWindowCounter, time.Minute},
		{"close/token_bucket", rules.TokenBucket, time.Minute},
		{"close/leaky_bucket", rules.LeakyBucket, time.Minute},
		{"expiry/fixed_window", rules.FixedWindow, 50 * time.Millisecond},
		{"expiry/token_bucket", rules.TokenBucket, 50 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prefix := testenv.KeyPrefix(t)
			set := leaseRules(t, tc.alg, 1000, "")
			e := leaseEngine(t, url, prefix, LeaseOptions{Units: 100, MaxLifetime: tc.life})
			if err := e.Apply(1, set); err != nil {
				t.Fatal(err)
			}
			_, admitted, units := leaseOf(t, e, "x")
			if tc.life == time.Minute {
				if u := used(t, url, prefix, set, "x"); u != admitted+units {
					t.Errorf("Redis counted %d with a lease held, want %d admitted + %d leased", u, admitted, units)
				}
				if err := e.Close(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			// On expiry the return is asynchronous: wait for it.
			deadline := time.Now().Add(10 * time.Second)
			for u := used(t, url, prefix, set, "x"); u != admitted; u = used(t, url, prefix, set, "x") {
				if time.Now().After(deadline) {
					t.Fatalf("Redis counted %d, want the %d admitted once the lease is returned", u, admitted)
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}

// TestLeaseRuleChange: a publish that changes a leased limit returns its
// lease (and checks use a new one, of the new limit); one that leaves it
// unchanged keeps it.
func TestLeaseRuleChange(t *testing.T) {
	t.Parallel()
	url, prefix := testenv.RedisURL(t), testenv.KeyPrefix(t)
	set := leaseRules(t, rules.FixedWindow, 1000, "")
	e := leaseEngine(t, url, prefix, LeaseOptions{Units: 100, MaxLifetime: time.Minute})
	if err := e.Apply(1, set); err != nil {
		t.Fatal(err)
	}
	le, admitted, _ := leaseOf(t, e, "x")

	// Version 2 adds a rule elsewhere: the lease stays.
	if err := e.Apply(2, leaseRules(t, rules.FixedWindow, 1000, "  - key: other\n    rate_limit: {unit: second, requests_per_unit: 5}\n")); err != nil {
		t.Fatal(err)
	}
	e.leases.mu.RLock()
	kept := len(e.leases.m) == 1
	e.leases.mu.RUnlock()
	if le.mu.Lock(); !kept || le.dead {
		t.Errorf("an unchanged limit's lease was dropped")
	}
	le.mu.Unlock()

	// Version 3 lowers the limit: the lease is returned.
	lower := leaseRules(t, rules.FixedWindow, 900, "")
	if err := e.Apply(3, lower); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for u := used(t, url, prefix, set, "x"); u != admitted; u = used(t, url, prefix, set, "x") {
		if time.Now().After(deadline) {
			t.Fatalf("Redis counted %d, want the %d admitted once the changed limit's lease is returned", u, admitted)
		}
		time.Sleep(10 * time.Millisecond)
	}
	res, err := e.Check(context.Background(), hot("x"))
	if err != nil || res.Code != OK || res.Statuses[0].Limit.RequestsPerUnit != 900 {
		t.Fatalf("check after the change: %+v, %v", res, err)
	}
	if le.mu.Lock(); !le.dead {
		t.Errorf("the old lease still serves")
	}
	le.mu.Unlock()
}

// TestLeaseRedisOutage: while Redis is down, an unexpired lease keeps
// serving until it is spent; then the limit's failure mode (closed here)
// answers.
func TestLeaseRedisOutage(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t)
	set := leaseRules(t, rules.FixedWindow, 1000, "    failure_mode: closed\n")
	e := leaseEngine(t, srv.URL(), testenv.KeyPrefix(t), LeaseOptions{Units: 100, MaxLifetime: time.Minute})
	if err := e.Apply(1, set); err != nil {
		t.Fatal(err)
	}
	_, _, units := leaseOf(t, e, "x")
	srv.Stop()
	for i := range units {
		res, err := e.Check(context.Background(), hot("x"))
		if err != nil || res.Code != OK || res.StoreErr != nil {
			t.Fatalf("check %d of the %d leased during the outage: %v, %+v", i+1, units, err, res)
		}
	}
	res, err := e.Check(context.Background(), hot("x"))
	if err != nil {
		t.Fatal(err)
	}
	if res.Code != OverLimit || res.StoreErr == nil || !res.Statuses[0].StoreFailed {
		t.Errorf("check after the lease is spent: %+v, want OVER_LIMIT by failure_mode closed", res)
	}
}

// TestLeaseHeat: a key's slot is hot once it has seen MinRate per second
// within one interval; a new interval starts from zero.
func TestLeaseHeat(t *testing.T) {
	t.Parallel()
	h := heat{seed: maphash.MakeSeed()}
	t0 := time.Unix(1000, 0)
	const rate = 100 // 10 per 100 ms interval
	for i := range 9 {
		if h.hot("k", 1, t0, rate) {
			t.Fatalf("hot after %d hits, want 10", i+1)
		}
	}
	if !h.hot("k", 1, t0.Add(50*time.Millisecond), rate) {
		t.Errorf("not hot after 10 hits in an interval")
	}
	if h.hot("k", 1, t0.Add(rateInterval), rate) {
		t.Errorf("hot at the first hit of a new interval")
	}
}
