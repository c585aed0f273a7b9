package limiter

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
)

func TestSlot(t *testing.T) {
	t.Parallel()
	// Values from the Redis Cluster specification and CLUSTER KEYSLOT.
	tests := []struct {
		key  string
		want int
	}{
		{"123456789", 12739}, // CRC16-XMODEM check value 0x31C3
		{"foo", 12182},
		{"{user1000}.following", Slot("user1000")},
		{"foo{}{bar}", Slot("foo{}{bar}")}, // empty tag: the whole key
		{"foo{{bar}}zap", Slot("{bar")},
		{"foo{bar}{zap}", Slot("bar")},
		{"", 0},
	}
	for _, tt := range tests {
		if got := Slot(tt.key); got != tt.want {
			t.Errorf("Slot(%q) = %d, want %d", tt.key, got, tt.want)
		}
	}
}

// TestCluster runs the engine against a real three-master Redis Cluster
// started for this test.
func TestCluster(t *testing.T) {
	t.Parallel()
	seeds := startCluster(t)
	c, err := NewClient(seeds, WithTimeout(2*time.Second), WithDialTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	cc, ok := c.(*redis.ClusterClient)
	if !ok {
		t.Fatalf("NewClient(%q) = %T, want a cluster client", seeds, c)
	}
	ctx := context.Background()
	// Slots are spread over the three masters: check Slot against the server.
	for _, key := range []string{"a", "sluice:{api:k=v}:tb", "{x}y", "plain"} {
		want, err := cc.ClusterKeySlot(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := Slot(key); int64(got) != want {
			t.Errorf("Slot(%q) = %d, CLUSTER KEYSLOT says %d", key, got, want)
		}
	}

	// Keys of one request on distinct slots (and so, mostly, nodes).
	key := func(name string) string { return Key("t:", "d", []rules.Entry{{Key: "k", Value: name}}) }
	spread := func(n int, tag string) []string {
		var keys []string
		seen := map[int]bool{}
		for i := 0; len(keys) < n; i++ {
			k := key(tag + strconv.Itoa(i))
			if s := Slot(k); !seen[s] {
				seen[s] = true
				keys = append(keys, k)
			}
		}
		return keys
	}

	engines := []struct {
		name string
		take func(context.Context, []Request) ([]Decision, error)
	}{
		{"direct", NewRedis(c).Take},
		// The client's timeout rather than the node's 50 ms: these test
		// accuracy, and a loaded machine misses 50 ms (a Take that timed out
		// is refunded, but only once its calls end).
		{"batcher", NewBatcher(NewRedis(c), BatchOptions{Timeout: 2 * time.Second}).Take},
		{"batcher without cache", NewBatcher(NewRedis(c), BatchOptions{OverLimitEntries: -1, Timeout: 2 * time.Second}).Take},
	}
	t.Run("flush across slots", func(t *testing.T) {
		// One flush, keys on every master: each is counted, each master's
		// clock is estimated apart.
		r := NewRedis(c)
		keys := spread(12, "flush")
		var fs []Flush
		for i, k := range keys {
			fs = append(fs, Flush{Req: Request{Key: k, Algorithm: rules.FixedWindow, Limit: 100, Period: noBoundary},
				Admitted: []Admitted{{Age: time.Millisecond, Hits: int64(i + 1)}}})
		}
		for round := 1; round <= 2; round++ {
			// Sent twice with its id (each call's marker in its keys'
			// slot), a round counts once.
			for range 2 {
				got, err := r.Flush(ctx, time.Now(), fmt.Sprintf("%s:%d", keys[0], round), fs)
				if err != nil {
					t.Fatal(err)
				}
				for i, s := range got {
					if s.Err != nil || s.Remaining != 100-int64(round*(i+1)) {
						t.Errorf("round %d, key %d: %+v, want remaining %d", round, i, s, 100-round*(i+1))
					}
				}
			}
		}
		r.clocks.mu.Lock()
		masters := len(r.clocks.by)
		r.clocks.mu.Unlock()
		if masters != 3 {
			t.Errorf("clocks of %d masters, want 3", masters)
		}
	})
	for _, eng := range engines {
		t.Run(eng.name+"/all or nothing across slots", func(t *testing.T) {
			keys := spread(3, eng.name+"aon")
			mk := func(k string, burst int64) Request {
				return Request{Key: k, Limit: 1, Period: time.Hour, Burst: burst, Hits: 1}
			}
			a, b, cr := mk(keys[0], 5), mk(keys[1], 1), mk(keys[2], 5)
			if ds, err := eng.take(ctx, []Request{b}); err != nil || !ds[0].Allowed {
				t.Fatalf("exhaust b: %v %v", ds, err)
			}
			for _, order := range [][]int{{0, 1, 2}, {1, 0, 2}, {0, 2, 1}} {
				reqs := []Request{a, b, cr}
				in := []Request{reqs[order[0]], reqs[order[1]], reqs[order[2]]}
				got, err := eng.take(ctx, in)
				if err != nil {
					t.Fatal(err)
				}
				ds := make([]Decision, 3)
				for i, o := range order {
					ds[o] = got[i]
				}
				// (A cached refusal does not ask Redis for the others.)
				if ds[1].Allowed || !ds[0].Allowed || !ds[2].Allowed || !ds[1].Cached && (ds[0].Remaining != 5 || ds[2].Remaining != 5) {
					t.Errorf("Take %v with b exhausted: %+v, want only b rejected and a, c untouched", order, ds)
				}
			}
			ds, err := eng.take(ctx, []Request{a, cr, {Key: keys[0], Algorithm: rules.FixedWindow, Limit: 10, Period: noBoundary, Hits: 2}})
			if err != nil {
				t.Fatal(err)
			}
			if !ds[0].Allowed || ds[0].Remaining != 4 || ds[1].Remaining != 4 || ds[2].Remaining != 8 {
				t.Errorf("Take across slots: %+v, want all allowed and counted", ds)
			}
		})

		t.Run(eng.name+"/a refusal gives back exactly what was reserved", func(t *testing.T) {
			// Every algorithm, reserved first and refunded when a limit on
			// another slot refuses: afterwards it is as it was, to the hit.
			keys := spread(len(allAlgorithms)+1, eng.name+"refund")
			full := Request{Key: keys[0], Algorithm: rules.FixedWindow, Limit: 1, Period: noBoundary, Hits: 1}
			if ds, err := eng.take(ctx, []Request{full}); err != nil || !ds[0].Allowed {
				t.Fatalf("exhaust: %v %v", ds, err)
			}
			for i, alg := range allAlgorithms {
				req := Request{Key: keys[i+1], Algorithm: alg, Limit: 10, Period: noBoundary, Hits: 3}
				if ds, err := eng.take(ctx, []Request{req}); err != nil || !ds[0].Allowed {
					t.Fatalf("%s: first take: %v %v", alg, ds, err)
				}
				peek := req
				peek.Hits = 0
				before, err := eng.take(ctx, []Request{peek})
				if err != nil {
					t.Fatal(err)
				}
				req.Hits = 2
				ds, err := eng.take(ctx, []Request{req, full})
				if err != nil {
					t.Fatal(err)
				}
				if !ds[0].Allowed || ds[1].Allowed {
					t.Fatalf("%s: %+v, want the limit allowing and the full one refusing", alg, ds)
				}
				if !ds[1].Cached && ds[0].Remaining != before[0].Remaining {
					t.Errorf("%s: the refused Take reports remaining %d, want the untouched %d", alg, ds[0].Remaining, before[0].Remaining)
				}
				after, err := eng.take(ctx, []Request{peek})
				if err != nil {
					t.Fatal(err)
				}
				if after[0].Remaining != 7 || before[0].Remaining != 7 {
					t.Errorf("%s: remaining %d before, %d after a refused Take, want 7 both", alg, before[0].Remaining, after[0].Remaining)
				}
				if alg == rules.SlidingWindowLog {
					if n, err := c.ZCard(ctx, req.Key+algorithms[alg].suffix).Result(); err != nil || n != 3 {
						t.Errorf("sliding log holds %d hits (%v), want the 3 admitted", n, err)
					}
				}
			}
		})

		t.Run(eng.name+"/one clock per Take", func(t *testing.T) {
			// Three keys on the three masters, logged (sliding_window_log
			// names each hit by its time): one Take, one time on all three.
			var keys []string
			seen := map[int]bool{}
			for i := 0; len(keys) < 3; i++ {
				k := key(eng.name + "clock" + strconv.Itoa(i))
				if third := Slot(k) * 3 / 16384; !seen[third] {
					seen[third] = true
					keys = append(keys, k)
				}
			}
			for round := range 5 {
				var reqs []Request
				for _, k := range keys {
					reqs = append(reqs, Request{Key: k, Algorithm: rules.SlidingWindowLog, Limit: 100, Period: time.Minute, Hits: 1})
				}
				if ds, err := eng.take(ctx, reqs); err != nil || !allowed(ds) {
					t.Fatalf("take: %v %v", ds, err)
				}
				var times []string
				for _, k := range keys {
					m, err := c.ZRange(ctx, k+algorithms[rules.SlidingWindowLog].suffix, -1, -1).Result()
					if err != nil || len(m) != 1 {
						t.Fatalf("ZRANGE: %v %v", m, err)
					}
					at, _, _ := strings.Cut(m[0], "-")
					times = append(times, at)
				}
				if times[0] != times[1] || times[0] != times[2] {
					t.Errorf("round %d: the masters logged the Take at %v µs, want one time", round, times)
				}
			}
		})

		t.Run(eng.name+"/fresh users at once", func(t *testing.T) {
			// The case that over-admitted: 48 callers, each a fresh user,
			// start at once on a global limit of 20, five rounds (the user's
			// slot first, or the global's).
			for round := range 5 {
				keys := spread(49, eng.name+"fresh"+strconv.Itoa(round))
				global := Request{Key: keys[0], Algorithm: rules.FixedWindow, Limit: 20, Period: noBoundary, Hits: 1}
				var admitted atomic.Int64
				refusedUsers := make(chan string, 48)
				var wg sync.WaitGroup
				start := make(chan struct{})
				for g := range 48 {
					wg.Go(func() {
						user := Request{Key: keys[1+g], Algorithm: rules.TokenBucket, Limit: 5, Period: time.Minute, Hits: 1}
						reqs := []Request{user, global}
						if round%2 == 1 {
							reqs = []Request{global, user}
						}
						<-start
						ds, err := eng.take(ctx, reqs)
						if err != nil {
							t.Error(err)
							return
						}
						if allowed(ds) {
							admitted.Add(1)
						} else {
							refusedUsers <- user.Key
						}
					})
				}
				close(start)
				wg.Wait()
				close(refusedUsers)
				got := admitted.Load()
				// Each user fits (5 tokens, one request), so only the global
				// refuses, and nothing it took is given back: exactly 20.
				if got != 20 {
					t.Errorf("round %d: admitted %d on a global limit of 20, want exactly 20", round, got)
				}
				if n := fwCount(t, c, global.Key); n != got {
					t.Errorf("round %d: global count %d, admitted %d", round, n, got)
				}
				for k := range refusedUsers {
					// A refused user's bucket is as if never asked: full.
					ds, err := eng.take(ctx, []Request{{Key: k, Limit: 5, Period: time.Minute}})
					if err != nil || ds[0].Remaining != 5 {
						t.Errorf("round %d: refused user has %v remaining (%v), want 5: nothing consumed", round, ds, err)
						break
					}
				}
				t.Logf("round %d: admitted %d of 48 on a global limit of 20", round, got)
			}
		})

		t.Run(eng.name+"/exact on one key", func(t *testing.T) {
			for _, alg := range []rules.Algorithm{rules.TokenBucket, rules.FixedWindow} {
				req := Request{Key: key(eng.name + "hot" + string(alg)), Algorithm: alg, Limit: 50, Period: noBoundary, Hits: 1}
				var allowed atomic.Int64
				var wg sync.WaitGroup
				for range 32 {
					wg.Go(func() {
						for range 4 {
							ds, err := eng.take(ctx, []Request{req})
							if err != nil {
								t.Error(err)
								return
							}
							if ds[0].Allowed {
								allowed.Add(1)
							}
						}
					})
				}
				wg.Wait()
				if got := allowed.Load(); got != 50 {
					t.Errorf("%s: allowed %d of 128, want exactly 50", alg, got)
				}
			}
		})

		t.Run(eng.name+"/every admission counted, no rejection counted", func(t *testing.T) {
			// A shared global limit and per-user limits on other slots: many
			// concurrent Takes across slots. Whatever the interleaving, each
			// fixed window's count must equal the admissions it took part in
			// (a rejected request consumes nothing anywhere, once returned)
			// and the global limit never admits more than it holds: each
			// slot's call decides and commits atomically, and a refund gives
			// back only what its own Take took. (It may admit fewer: a
			// reservation refunded after others were refused for it, with no
			// caller left to use it.)
			keys := spread(9, eng.name+"count")
			global := Request{Key: keys[0], Algorithm: rules.FixedWindow, Limit: 20, Period: noBoundary, Hits: 1}
			users := keys[1:]
			perUser := make([]atomic.Int64, len(users))
			var admitted atomic.Int64
			var wg sync.WaitGroup
			for g := range 48 {
				wg.Go(func() {
					u := g % len(users)
					user := Request{Key: users[u], Algorithm: rules.FixedWindow, Limit: 4, Period: noBoundary, Hits: 1}
					for range 3 {
						ds, err := eng.take(ctx, []Request{user, global})
						if err != nil {
							t.Error(err)
							return
						}
						if ds[0].Allowed && ds[1].Allowed {
							admitted.Add(1)
							perUser[u].Add(1)
						}
					}
				})
			}
			wg.Wait()
			count := func(k string) int64 { return fwCount(t, c, k) }
			if got, want := count(global.Key), admitted.Load(); got != want {
				t.Errorf("global count %d, admitted %d", got, want)
			}
			for u, k := range users {
				if got, want := count(k), perUser[u].Load(); got != want {
					t.Errorf("user %d count %d, admitted %d", u, got, want)
				}
			}
			// 8 users × 4 = 32 want in; the global 20 binds.
			got := admitted.Load()
			if got > 20 {
				t.Errorf("admitted %d on a global limit of 20, want 20 at most", got)
			}
			t.Logf("admitted %d with a global limit of 20 (over-admission %d)", got, got-20)
		})
	}
}

// fwCount returns the count of the fixed window of limit key.
func fwCount(t *testing.T, c redis.UniversalClient, key string) int64 {
	t.Helper()
	v, err := c.Get(context.Background(), key+algorithms[rules.FixedWindow].suffix).Result()
	if err != nil {
		t.Fatalf("GET %s: %v", key, err)
	}
	_, n, _ := strings.Cut(v, ":")
	i, err := strconv.ParseInt(n, 10, 64)
	if err != nil {
		t.Fatalf("GET %s: %q", key, v)
	}
	return i
}

// soak is how long TestClusterSustained runs each engine; make test keeps
// it short. The run: go test -count=1 -run TestClusterSustained
// ./enforcer/limiter/ -args -soak=10s
var soak = flag.Duration("soak", 1500*time.Millisecond, "duration of each engine's run in TestClusterSustained")

// TestClusterSustained holds a global token bucket of 100/s (burst 100)
// under 200 callers for -soak, each with a per-user limit of its own slot
// (50 users of 5/s: the users ask for more than the global allows, and
// refuse some Takes after the global reserved, so refunds happen all the
// time). What the global admits must be its burst plus 100/s of the time
// run, within 2%.
func TestClusterSustained(t *testing.T) {
	// Not parallel: it asserts latencies under load.
	if testing.Short() {
		t.Skip("seconds of load on a private Redis Cluster")
	}
	seeds := startCluster(t)
	c, err := NewClient(seeds, WithTimeout(2*time.Second), WithDialTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx := context.Background()
	for _, eng := range []struct {
		name  string
		store Store
	}{
		{"direct", NewRedis(c)},
		// The client's timeout, not the node's 50 ms: 200 callers on a
		// 2-core machine running three Redis servers queue for longer.
		{"batcher", NewBatcher(NewRedis(c), BatchOptions{Timeout: 2 * time.Second})},
	} {
		t.Run(eng.name, func(t *testing.T) {
			const rate, burst, callers, users = 100, 100, 200, 50
			global := Request{Key: Key("s:", "d", []rules.Entry{{Key: "global", Value: eng.name}}), Limit: rate, Period: time.Second, Hits: 1}
			// lastStart, last: the latest admitted Take's start and return, ns
			// after t0 (it was decided in between).
			var admitted, refused, errs, lastStart, last atomic.Int64
			var firstErr atomic.Value
			var latMu sync.Mutex
			var lat []time.Duration
			var wg sync.WaitGroup
			start := make(chan struct{})
			var stop atomic.Bool
			t0 := time.Now()
			for g := range callers {
				wg.Go(func() {
					user := Request{Key: Key("s:", "d", []rules.Entry{{Key: "user", Value: eng.name + strconv.Itoa(g%users)}}), Limit: 5, Period: time.Second, Hits: 1}
					reqs := []Request{user, global}
					if g%2 == 1 {
						reqs = []Request{global, user}
					}
					<-start
					for !stop.Load() {
						began := int64(time.Since(t0))
						ds, err := eng.store.Take(ctx, reqs)
						took := time.Duration(int64(time.Since(t0)) - began)
						latMu.Lock()
						lat = append(lat, took)
						latMu.Unlock()
						switch {
						case err != nil:
							errs.Add(1)
							firstErr.CompareAndSwap(nil, err)
						case allowed(ds):
							admitted.Add(1)
							at := int64(time.Since(t0))
							for old := last.Load(); at > old && !last.CompareAndSwap(old, at); old = last.Load() {
							}
							for old := lastStart.Load(); began > old && !lastStart.CompareAndSwap(old, began); old = lastStart.Load() {
							}
						default:
							refused.Add(1)
						}
						time.Sleep(2 * time.Millisecond) // leave the 2-core machine some air
					}
				})
			}
			close(start)
			time.Sleep(*soak)
			stop.Store(true)
			wg.Wait()
			// The bucket is empty from its first second on: what it admitted
			// until its last admission is its burst plus its rate since t0,
			// the last admission decided between that Take's start and return
			// (the two are close on a quiet machine, not on a loaded one).
			if n := errs.Load(); n > 0 {
				t.Fatalf("%d Takes failed, the first with %v", n, firstErr.Load())
			}
			lo := burst + rate*time.Duration(lastStart.Load()).Seconds()
			hi := burst + rate*time.Duration(last.Load()).Seconds()
			got := float64(admitted.Load())
			t.Logf("%v: admitted %.0f, refused %d; the global allows %.1f to %.1f (%.2f%% off the middle)", time.Duration(last.Load()).Round(time.Millisecond),
				got, refused.Load(), lo, hi, 100*(got-(lo+hi)/2)/((lo+hi)/2))
			// Below: 2%, or (a short run on a loaded machine) what the limit
			// refills in a slow Take (p99): a slot judges a Take at the time
			// the first slot read, a round trip old, which delays admissions
			// by that much. Above: 2%, never more.
			slices.Sort(lat)
			p99 := lat[len(lat)*99/100]
			slack := max(0.02*lo, rate*p99.Seconds())
			t.Logf("Take p50 %v, p99 %v", lat[len(lat)/2], p99)
			if got < lo-slack || got > hi*1.02 {
				t.Errorf("admitted %.0f, want %.1f to %.1f (-%.1f, +2%%)", got, lo, hi, slack)
			}
		})
	}
}

// TestClusterFrozenSlotWaitsOneTimeout freezes (SIGSTOP) the master of the
// second slot of a Take spanning two: each Take fails after the Batcher's
// one timeout (its reservation on the first slot and the frozen one share
// it), and what the first slot reserved is given back once the frozen
// calls end, so the limit there is untouched.
func TestClusterFrozenSlotWaitsOneTimeout(t *testing.T) {
	// Not parallel: it asserts latencies under load.
	cl := testenv.StartCluster(t, 3, 0, 2*time.Second)
	c, err := NewClient(cl.Seeds())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	key := func(v string) string { return Key("f:", "d", []rules.Entry{{Key: "k", Value: v}}) }
	first := key("first")
	var second string
	for i := 0; ; i++ {
		if second = key(strconv.Itoa(i)); cl.MasterOf(Slot(second)) != cl.MasterOf(Slot(first)) {
			break
		}
	}
	a := Request{Key: first, Algorithm: rules.FixedWindow, Limit: 1_000_000, Period: noBoundary, Hits: 1}
	b := Request{Key: second, Algorithm: rules.FixedWindow, Limit: 1_000_000, Period: noBoundary, Hits: 1}
	bt := NewBatcher(NewRedis(c), BatchOptions{Timeout: DefaultTimeout})
	ctx := context.Background()
	for range 20 { // warm: connections to both masters
		if _, err := bt.Take(ctx, []Request{a, b}); err != nil {
			t.Fatal(err)
		}
	}
	before := fwCount(t, c, a.Key)

	frozen := cl.MasterOf(Slot(second))
	frozen.Signal(syscall.SIGSTOP)
	var mu sync.Mutex
	var took []time.Duration
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for range 10 {
				t0 := time.Now()
				if _, err := bt.Take(ctx, []Request{a, b}); err == nil {
					t.Error("a Take on a frozen master succeeded")
				}
				mu.Lock()
				took = append(took, time.Since(t0))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	frozen.Signal(syscall.SIGCONT)
	slices.Sort(took)
	p99 := took[len(took)*99/100]
	t.Logf("frozen second slot: %d Takes, p50 %v, p99 %v, max %v", len(took), took[len(took)/2], p99, took[len(took)-1])
	// The median, not the tail: on a loaded 2-core machine the scheduler
	// alone adds tens of milliseconds to the slowest Takes, while a Take
	// that waited for each slot's timeout in turn would put the median
	// near two timeouts.
	if p50, bound := took[len(took)/2], DefaultTimeout+25*time.Millisecond; p50 > bound {
		t.Errorf("p50 %v with the second slot frozen, want at most one timeout + 25ms (%v)", p50, bound)
	}
	// The reservations on the first slot come back once the frozen calls
	// have ended (their 50 ms read timeout).
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := fwCount(t, c, a.Key)
		if got == before {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("first slot counts %d, %d before the freeze: reservations of failed Takes not given back", got, before)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
