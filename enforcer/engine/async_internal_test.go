package engine

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/enforcer/breaker"
	"github.com/sluicehq/sluice/enforcer/limiter"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
)

// asyncRules compiles domain "api" with an async limit "hot" and an exact
// one "cold".
func asyncRules(t testing.TB, alg rules.Algorithm, limit int, unit, extra string) *rules.Set {
	t.Helper()
	src := fmt.Sprintf(`domain: api
descriptors:
  - key: hot
    algorithm: %s
    rate_limit: {unit: %s, requests_per_unit: %d}
    consistency: async
%s  - key: cold
    rate_limit: {unit: hour, requests_per_unit: 2}
`, alg, unit, limit, extra)
	d, err := rules.Parse("async.yaml", []byte(src))
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	set, err := rules.Compile([]*rules.Domain{d})
	if err != nil {
		t.Fatalf("compile: %v", err)
	}
	return set
}

// asyncEngine is an engine as a node builds it (Batcher, breaker), with
// async counting, on the Redis at url under prefix.
func asyncEngine(t testing.TB, url, prefix string, o AsyncOptions, set *rules.Set, nodes int) *Engine {
	t.Helper()
	client, err := limiter.NewClient(url, limiter.WithTimeout(2*time.Second), limiter.WithDialTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	r := limiter.NewRedis(client)
	e := New(limiter.NewBatcher(r, limiter.BatchOptions{Timeout: 2 * time.Second}), prefix,
		WithBreaker(breaker.New(breaker.Config{Hard: StoreDown})), WithAsync(r, o))
	if err := e.Apply(1, set); err != nil {
		t.Fatal(err)
	}
	e.SetNodeCount(nodes)
	t.Cleanup(func() { _ = e.Close(context.Background()) })
	return e
}

// drive sends checks of value to engines, each at perNode checks per
// second, for d, and returns the local times of the admitted ones.
func drive(t *testing.T, engines []*Engine, value string, perNode float64, d time.Duration) []time.Time {
	t.Helper()
	var (
		mu       sync.Mutex
		admitted []time.Time
		wg       sync.WaitGroup
		errs     atomic.Int64
	)
	start := time.Now()
	every := time.Duration(float64(time.Second) / perNode)
	for _, e := range engines {
		// Two callers per node, as concurrent requests are.
		for c := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				next := start.Add(time.Duration(c) * every)
				for n := 0; ; n++ {
					if d := time.Until(next); d > 0 {
						time.Sleep(d)
					}
					now := time.Now()
					if now.Sub(start) >= d {
						return
					}
					res, err := e.Check(context.Background(), hot(value))
					if err != nil || res.StoreErr != nil {
						errs.Add(1)
					} else if res.Code == OK {
						mu.Lock()
						admitted = append(admitted, now)
						mu.Unlock()
					}
					next = next.Add(2 * every)
				}
			}()
		}
	}
	wg.Wait()
	if n := errs.Load(); n > 0 {
		t.Fatalf("%d checks failed", n)
	}
	return admitted
}

// perWindow counts times per aligned window of p, leaving out the first
// and last (partial) windows of [start, end).
func perWindow(times []time.Time, p time.Duration, start, end time.Time) []int {
	first := start.Truncate(p).Add(p)
	var counts []int
	for w := first; !w.Add(p).After(end); w = w.Add(p) {
		n := 0
		for _, at := range times {
			if !at.Before(w) && at.Before(w.Add(p)) {
				n++
			}
		}
		counts = append(counts, n)
	}
	return counts
}

// TestAsyncBoundHotKey drives one hot value on 2 and 4 nodes at 1,000
// checks/s in all, for a fixed_window limit of 400 per second: every full
// window admits at least the limit (async never under-admits) and at most
// 5% over it. Serial (paced traffic).
func TestAsyncBoundHotKey(t *testing.T) {
	for _, nodes := range []int{2, 4} {
		t.Run(fmt.Sprint(nodes, "nodes"), func(t *testing.T) {
			url := testenv.RedisURL(t)
			prefix := testenv.KeyPrefix(t)
			set := asyncRules(t, rules.FixedWindow, 400, "second", "")
			var engines []*Engine
			for range nodes {
				engines = append(engines, asyncEngine(t, url, prefix, AsyncOptions{Interval: 50 * time.Millisecond}, set, nodes))
			}
			start := time.Now()
			times := drive(t, engines, "v", 1000/float64(nodes), 3200*time.Millisecond)
			counts := perWindow(times, time.Second, start, time.Now())
			var local int64
			for _, e := range engines {
				local += e.AsyncStats().Local
			}
			t.Logf("admitted per window %v (limit 400), %d of %d admitted locally", counts, local, len(times))
			if len(counts) < 2 {
				t.Fatalf("only %d full windows", len(counts))
			}
			for _, n := range counts {
				// 1% slack: a window here is the node's clock, Redis counts
				// on its own (a check or two at a boundary).
				if n < 400-4 || n > 420 {
					t.Errorf("a window admitted %d, want [400, 420]", n)
				}
			}
			if local == 0 {
				t.Error("nothing was admitted locally")
			}
		})
	}
}

// TestAsyncAlgorithms runs a hot key over its limit on two nodes for every
// algorithm and checks what the fleet admitted against what the limit
// allows over the run (within 5%), and that exact checks took over near
// the limit.
func TestAsyncAlgorithms(t *testing.T) {
	for _, alg := range []rules.Algorithm{rules.TokenBucket, rules.LeakyBucket, rules.FixedWindow, rules.SlidingWindowLog, rules.SlidingWindowCounter} {
		t.Run(string(alg), func(t *testing.T) {
			url := testenv.RedisURL(t)
			prefix := testenv.KeyPrefix(t)
			set := asyncRules(t, alg, 300, "second", "")
			a := asyncEngine(t, url, prefix, AsyncOptions{Interval: 50 * time.Millisecond}, set, 2)
			b := asyncEngine(t, url, prefix, AsyncOptions{Interval: 50 * time.Millisecond}, set, 2)
			start := time.Now()
			times := drive(t, []*Engine{a, b}, "v", 400, 2*time.Second)
			el := time.Since(start)
			sa, sb := a.AsyncStats(), b.AsyncStats()
			// Over el, every algorithm admits the limit's worth per second,
			// plus one burst (buckets) or the window the run starts in.
			most := 300 * (el.Seconds() + 1)
			least := 300 * (el.Seconds() - 1)
			if alg == rules.FixedWindow {
				least = 300 * float64(int(el.Seconds()))
			}
			t.Logf("%d admitted in %v (most %0.f), local %d, exact %d", len(times), el, most, sa.Local+sb.Local, sa.Exact+sb.Exact)
			if n := float64(len(times)); n > most*1.05 || n < least {
				t.Errorf("admitted %d, want [%.0f, %.0f]", len(times), least, most*1.05)
			}
			if sa.Local+sb.Local == 0 || sa.Exact+sb.Exact == 0 {
				t.Errorf("local %d, exact %d: want both", sa.Local+sb.Local, sa.Exact+sb.Exact)
			}
		})
	}
}

// asyncKey returns the async entry of value's hot limit.
func asyncKey(t testing.TB, e *Engine, value string) *akey {
	t.Helper()
	e.async.mu.RLock()
	defer e.async.mu.RUnlock()
	for _, k := range e.async.m {
		if len(k.entries) == 1 && k.entries[0].Value == value {
			return k
		}
	}
	t.Fatalf("no async key for %q", value)
	return nil
}

// warm makes value's view known (its first check goes exact).
func warm(t testing.TB, e *Engine, value string) {
	t.Helper()
	if res, err := e.Check(context.Background(), hot(value)); err != nil || res.Code != OK {
		t.Fatalf("first check: %+v %v", res, err)
	}
}

// TestAsyncNodeKilled stops a node's flushing mid-interval (as a kill
// does): what it admitted but never flushed is missing from Redis, and no
// more than the key's share (kept unflushed while far from the limit) plus
// its rate times one interval.
func TestAsyncNodeKilled(t *testing.T) {
	t.Parallel()
	url := testenv.RedisURL(t)
	prefix := testenv.KeyPrefix(t)
	const limit = 5000 // a share of 50
	set := asyncRules(t, rules.FixedWindow, limit, "hour", "")
	o := AsyncOptions{Interval: 100 * time.Millisecond}
	e := asyncEngine(t, url, prefix, o, set, 1)
	warm(t, e, "k")
	var admitted int64 = 1
	start := time.Now()
	for time.Since(start) < 450*time.Millisecond {
		if res, err := e.Check(context.Background(), hot("k")); err == nil && res.Code == OK {
			admitted++
		}
		time.Sleep(time.Millisecond)
	}
	// Kill: the flush loop stops and nothing more is sent. It stops first,
	// with running left true so no check starts it again, and the node
	// admits a few more checks before it dies: on a loaded machine the
	// loop's last flush may otherwise send everything just before the kill.
	as := e.async
	as.qmu.Lock()
	close(as.stop)
	as.qmu.Unlock()
	as.loopWG.Wait()
	for range 5 {
		if res, err := e.Check(context.Background(), hot("k")); err == nil && res.Code == OK {
			admitted++
		}
	}
	rate := float64(admitted) / time.Since(start).Seconds()
	as.closed.Store(true)
	as.qmu.Lock()
	as.running = false
	as.qmu.Unlock()
	k := asyncKey(t, e, "k")
	k.mu.Lock()
	lost := k.npending + k.inflight
	k.mu.Unlock()
	got := used(t, url, prefix, set, "k")
	t.Logf("admitted %d at %.0f/s, Redis counted %d, lost %d", admitted, rate, got, lost)
	if got+lost != admitted {
		t.Errorf("Redis %d + pending %d != admitted %d", got, lost, admitted)
	}
	share := float64(limit / asyncShare)
	if bound := share + rate*(o.Interval.Seconds()+0.05) + 5; float64(lost) > bound {
		t.Errorf("lost %d, more than share + rate × (interval + 50 ms) = %.0f", lost, bound)
	}
	if lost == 0 {
		t.Error("nothing was pending: the test killed nothing")
	}
	// Don't let Cleanup's Close flush what a killed node lost.
	k.mu.Lock()
	k.pending, k.npending = nil, 0
	k.mu.Unlock()
}

// TestAsyncHold checks when a key far from its limit is flushed: its first
// checks fit in its share and are admitted with no view, held until they
// are Hold old (Redis does not count them before), then counted; once the
// hits held reach the share, they go at the next interval.
func TestAsyncHold(t *testing.T) {
	t.Parallel()
	url := testenv.RedisURL(t)
	prefix := testenv.KeyPrefix(t)
	set := asyncRules(t, rules.FixedWindow, 10000, "hour", "") // a share of 100
	o := AsyncOptions{Interval: 20 * time.Millisecond, Hold: 400 * time.Millisecond}
	e := asyncEngine(t, url, prefix, o, set, 1)
	start := time.Now()
	for range 10 {
		if res, err := e.Check(context.Background(), hot("held")); err != nil || res.Code != OK {
			t.Fatalf("check: %+v %v", res, err)
		}
	}
	got := used(t, url, prefix, set, "held")
	if el := time.Since(start); el < o.Hold/2 && got != 0 {
		t.Errorf("Redis counted %d of the hits held %v, want none before %v", got, el, o.Hold)
	}
	if st := e.AsyncStats(); st.Local != 10 || st.Exact != 0 {
		t.Errorf("local %d, exact %d; want every check local (no view, within the share)", st.Local, st.Exact)
	}
	waitUsed := func(key string, want int64) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for used(t, url, prefix, set, key) != want {
			if time.Now().After(deadline) {
				t.Fatalf("Redis counts %d of %q, want %d", used(t, url, prefix, set, key), key, want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitUsed("held", 10)
	if el := time.Since(start); el < o.Hold-o.Interval {
		// (Sent at the last interval before the hold ends.)
		t.Errorf("counted after %v, an interval before the hold of %v ends", el, o.Hold)
	}
	// The share (100) held: flushed at the next interval, not after Hold.
	start = time.Now()
	req := hot("full")
	req.Hits = 100
	if res, err := e.Check(context.Background(), req); err != nil || res.Code != OK {
		t.Fatalf("check: %+v %v", res, err)
	}
	waitUsed("full", 100)
	if el := time.Since(start); el >= o.Hold {
		t.Errorf("the share held was counted after %v, want at the next interval", el)
	}
}

// privateAsync runs an engine on a private redis-server with 100 ms
// timeouts and flushes every 50 ms (o sets the rest, opts adds options
// before WithAsync), with a fixed_window limit of limit an hour whose
// failure mode is closed, applied.
func privateAsync(t *testing.T, limit int, o AsyncOptions, opts ...Option) (*testenv.RedisServer, *Engine, string, *rules.Set) {
	t.Helper()
	srv := testenv.StartRedis(t)
	prefix := testenv.KeyPrefix(t)
	set := asyncRules(t, rules.FixedWindow, limit, "hour", "    failure_mode: closed\n")
	client, err := limiter.NewClient(srv.URL(), limiter.WithTimeout(100*time.Millisecond), limiter.WithDialTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	r := limiter.NewRedis(client)
	o.Interval, o.Timeout = 50*time.Millisecond, 100*time.Millisecond
	e := New(limiter.NewBatcher(r, limiter.BatchOptions{Timeout: 100 * time.Millisecond}), prefix, append(opts, WithAsync(r, o))...)
	if err := e.Apply(1, set); err != nil {
		t.Fatal(err)
	}
	return srv, e, prefix, set
}

// TestAsyncRedisDownDuringFlush freezes Redis with hits pending: the flush
// fails, the key's checks go exact and its failure mode (closed) answers;
// when Redis is back, the kept hits are flushed and counted.
func TestAsyncRedisDownDuringFlush(t *testing.T) {
	t.Parallel()
	srv, e, prefix, set := privateAsync(t, 100000, AsyncOptions{MaxAge: 300 * time.Millisecond, Hold: 300 * time.Millisecond},
		WithBreaker(breaker.New(breaker.Config{Hard: StoreDown})))
	warm(t, e, "k")
	admitted := int64(1)
	for range 20 {
		if res, _ := e.Check(context.Background(), hot("k")); res.Code == OK && res.StoreErr == nil {
			admitted++
		}
	}
	srv.Signal(syscall.SIGSTOP)
	thawed := false
	defer func() {
		if !thawed {
			srv.Signal(syscall.SIGCONT)
		}
	}()
	deadline := time.Now().Add(5 * time.Second)
	for e.AsyncStats().FlushErrors == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no flush failed with Redis frozen")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// A frozen Redis times out: the key decides locally on its ageing view
	// for at most MaxAge (here 300 ms), then its checks go exact and the
	// closed failure mode answers.
	for {
		res, err := e.Check(context.Background(), hot("k"))
		if err != nil {
			t.Fatal(err)
		}
		if res.Code == OverLimit && res.Statuses[0].StoreFailed {
			break
		}
		if res.StoreErr == nil && res.Code == OK {
			admitted++
		}
		if time.Now().After(deadline) {
			t.Fatalf("with the flush failed: %+v, want the closed failure mode", res)
		}
		time.Sleep(5 * time.Millisecond)
	}
	srv.Signal(syscall.SIGCONT)
	thawed = true
	k := asyncKey(t, e, "k")
	deadline = time.Now().Add(5 * time.Second)
	for {
		k.mu.Lock()
		left, failed := k.npending+k.inflight, k.failed
		k.mu.Unlock()
		if left == 0 && !failed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pending %d (failed %v) five seconds after Redis came back", left, failed)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The check that timed out and answered with the failure mode was sent
	// to the frozen Redis all the same: Redis runs it once it thaws (a
	// timed-out call's effect is unknown to the caller, in exact mode too),
	// so it may be counted once more than was admitted, never less.
	if got := used(t, srv.URL(), prefix, set, "k"); got != admitted && got != admitted+1 {
		t.Errorf("Redis counted %d, admitted %d (want it or one more)", got, admitted)
	}
	if res, _ := e.Check(context.Background(), hot("k")); res.Code != OK || res.StoreErr != nil {
		t.Errorf("after Redis came back: %+v", res)
	}
}

// TestAsyncFlushTimedOutCountsOnce freezes Redis while a flush is on its
// way: the flush times out, Redis counts it once it thaws, and the node,
// which cannot know that, sends it again. The retry must not count the
// same hits twice (which would refuse the fleet early): Redis counts
// exactly what the node admitted.
func TestAsyncFlushTimedOutCountsOnce(t *testing.T) {
	t.Parallel()
	srv, e, prefix, set := privateAsync(t, 1000, AsyncOptions{MaxAge: 5 * time.Second, Hold: 200 * time.Millisecond})
	warm(t, e, "k")
	admitted := int64(1)
	check := func() {
		t.Helper()
		res, err := e.Check(context.Background(), hot("k"))
		if err != nil || res.Code != OK || res.StoreErr != nil {
			t.Fatalf("check: %+v %v", res, err)
		}
		admitted++
	}
	for range 5 {
		check()
	}
	k := asyncKey(t, e, "k")
	settled := func(what string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			k.mu.Lock()
			left, stale := k.npending+k.inflight, k.stale
			k.mu.Unlock()
			if left == 0 && !stale {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d hits pending (stale %v) five seconds %s", left, stale, what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	settled("after the first checks")
	srv.Signal(syscall.SIGSTOP)
	thawed := false
	defer func() {
		if !thawed {
			srv.Signal(syscall.SIGCONT)
		}
	}()
	// Decided from the node's view (MaxAge 5 s): no check waits on Redis.
	// 30 hits are more than the key's share (10): flushed at the next
	// interval, into the frozen server's socket.
	for range 30 {
		check()
	}
	deadline := time.Now().Add(5 * time.Second)
	for e.AsyncStats().FlushErrors < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("flushes failed %d times in 5 s with Redis frozen", e.AsyncStats().FlushErrors)
		}
		time.Sleep(10 * time.Millisecond)
	}
	srv.Signal(syscall.SIGCONT)
	thawed = true
	settled("after Redis thawed")
	st := e.AsyncStats()
	if got := used(t, srv.URL(), prefix, set, "k"); got != admitted {
		t.Errorf("Redis counted %d, the node admitted %d (%d flushes, %d failed)", got, admitted, st.Flushes, st.FlushErrors)
	}
	if st.Dropped != 0 {
		t.Errorf("%d hits given up", st.Dropped)
	}
}

// TestAsyncFlushGivenUp: a flush that keeps failing is given up after
// GiveUp, its hits counted as dropped, and the key flushes what it admits
// next once Redis is back.
func TestAsyncFlushGivenUp(t *testing.T) {
	t.Parallel()
	srv, e, prefix, set := privateAsync(t, 1000, AsyncOptions{MaxAge: 5 * time.Second, Hold: 200 * time.Millisecond, GiveUp: 500 * time.Millisecond})
	warm(t, e, "k")
	check := func() {
		t.Helper()
		if res, err := e.Check(context.Background(), hot("k")); err != nil || res.Code != OK || res.StoreErr != nil {
			t.Fatalf("check: %+v %v", res, err)
		}
	}
	k := asyncKey(t, e, "k")
	left := func() int64 {
		k.mu.Lock()
		defer k.mu.Unlock()
		return k.npending + k.inflight
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("not %s within 5 s: stats %+v, %d hits pending", what, e.AsyncStats(), left())
			}
		}
	}
	waitFor("settled", func() bool { return left() == 0 })
	before := used(t, srv.URL(), prefix, set, "k")
	srv.Signal(syscall.SIGSTOP)
	for range 30 {
		check()
	}
	// Frozen past GiveUp: the 30 hits are given up.
	waitFor("given up", func() bool { return e.AsyncStats().Dropped == 30 && left() == 0 })
	srv.Stop() // the flushes in its socket buffers go with it
	srv.Restart()
	for range 20 {
		check()
	}
	waitFor("flushed after Redis came back", func() bool { return left() == 0 && e.AsyncStats().Dropped == 30 })
	if got := used(t, srv.URL(), prefix, set, "k"); got != 20 {
		t.Errorf("Redis counted %d after it restarted (%d before it froze), want the 20 hits admitted since", got, before)
	}
}

// TestAsyncRuleChange changes the limit while hits are pending: they are
// flushed under the old limit's key and counted, and checks follow the
// new limit.
func TestAsyncRuleChange(t *testing.T) {
	t.Parallel()
	url := testenv.RedisURL(t)
	prefix := testenv.KeyPrefix(t)
	set := asyncRules(t, rules.FixedWindow, 100000, "hour", "")
	e := asyncEngine(t, url, prefix, AsyncOptions{Interval: time.Second}, set, 1)
	warm(t, e, "k")
	for range 50 {
		if res, _ := e.Check(context.Background(), hot("k")); res.Code != OK {
			t.Fatal("refused")
		}
	}
	old := asyncKey(t, e, "k")
	old.mu.Lock()
	pending := old.npending
	old.mu.Unlock()
	if pending != 51 {
		// The first check too: it fits in the key's share (1,000).
		t.Fatalf("pending %d, want 51 (the interval is a second)", pending)
	}
	next := asyncRules(t, rules.FixedWindow, 60, "hour", "")
	if err := e.Apply(2, next); err != nil {
		t.Fatal(err)
	}
	// 51 counted under the old limit, the same key: 9 of 60 left.
	deadline := time.Now().Add(3 * time.Second)
	for used(t, url, prefix, next, "k") != 51 {
		if time.Now().After(deadline) {
			t.Fatalf("Redis counts %d, want 51", used(t, url, prefix, next, "k"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	n := 0
	for range 20 {
		if res, _ := e.Check(context.Background(), hot("k")); res.Code == OK {
			n++
		}
	}
	if n != 9 {
		t.Errorf("admitted %d under the new limit, want 9", n)
	}
}

// TestAsyncMatchesExact sends the same random traffic, far from the
// limits, over 10,000 cold keys to two async nodes and to one exact node:
// every decision is the same, and once flushed every counter in Redis is
// the same too. With limits of 50–99 an hour (a share of 0: a key's first
// check is exact) and of 100,000–199,999 (a share of 500 or more per node:
// every check, the first too, is decided locally).
func TestAsyncMatchesExact(t *testing.T) {
	t.Parallel()
	t.Run("small", func(t *testing.T) {
		t.Parallel()
		local, checks, keys := matchExact(t, 50, 50)
		if local < int64(checks-keys)/2 {
			t.Errorf("only %d of %d checks decided locally", local, checks)
		}
	})
	t.Run("large", func(t *testing.T) {
		t.Parallel()
		local, checks, keys := matchExact(t, 100_000, 100_000)
		// A flush that times out on a loaded machine sends its keys' next
		// checks to Redis; the first checks of most keys are local.
		if local < int64(checks-keys/10) {
			t.Errorf("only %d of %d checks decided locally", local, checks)
		}
	})
}

// matchExact runs TestAsyncMatchesExact's traffic with limits in
// [least, least+spread) and returns how many checks were decided locally,
// of how many, over how many keys.
func matchExact(t *testing.T, least, spread int) (local int64, checks, nkeys int) {
	t.Helper()
	url := testenv.RedisURL(t)
	pa, pe := testenv.KeyPrefix(t)+"a:", testenv.KeyPrefix(t)+"e:"
	src := `domain: api
descriptors:
  - key: hot
    algorithm: %s
    rate_limit: {unit: hour, requests_per_unit: %d}
    consistency: %s
`
	parse := func(consistency string, alg rules.Algorithm, limit int) *rules.Set {
		d, err := rules.Parse("p.yaml", fmt.Appendf(nil, src, alg, limit, consistency))
		if err != nil {
			t.Fatal(err)
		}
		set, err := rules.Compile([]*rules.Domain{d})
		if err != nil {
			t.Fatal(err)
		}
		return set
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 2))
	algs := []rules.Algorithm{rules.FixedWindow, rules.SlidingWindowCounter, rules.TokenBucket, rules.LeakyBucket, rules.SlidingWindowLog}
	if least+spread > rules.MaxSlidingLogRequests {
		algs = algs[:4] // sliding_window_log refuses limits this large
	}
	alg := algs[rng.IntN(len(algs))]
	limit := least + rng.IntN(spread)
	o := AsyncOptions{Interval: 20 * time.Millisecond}
	as := []*Engine{asyncEngine(t, url, pa, o, parse("async", alg, limit), 2), asyncEngine(t, url, pa, o, parse("async", alg, limit), 2)}
	ex := asyncEngine(t, url, pe, o, parse("exact", alg, limit), 1)
	const keys, block = 10_000, 500
	type op struct {
		key  int
		hits uint64
		node int
	}
	var ops []op
	for b := 0; b < keys; b += block {
		// The checks of a block of keys, in random order: at most 3
		// checks of at most 3 hits per key, far below the limit.
		var bops []op
		for k := b; k < b+block; k++ {
			for range 1 + rng.IntN(3) {
				bops = append(bops, op{k, uint64(1 + rng.IntN(3)), rng.IntN(2)})
			}
		}
		rng.Shuffle(len(bops), func(i, j int) { bops[i], bops[j] = bops[j], bops[i] })
		ops = append(ops, bops...)
	}
	var diff atomic.Int64
	var wg sync.WaitGroup
	const workers = 16
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < len(ops); i += workers {
				o := ops[i]
				req := hot(fmt.Sprint("k", o.key))
				req.Hits = o.hits
				ra, err1 := as[o.node].Check(context.Background(), req)
				re, err2 := ex.Check(context.Background(), req)
				if err1 != nil || err2 != nil || ra.StoreErr != nil || re.StoreErr != nil || ra.Code != re.Code {
					diff.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	for _, e := range as {
		local += e.AsyncStats().Local
		if err := e.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%s limit %d: %d checks, %d admitted locally", alg, limit, len(ops), local)
	if n := diff.Load(); n > 0 {
		t.Errorf("%d of %d decisions differ", n, len(ops))
	}
	if alg == rules.TokenBucket || alg == rules.LeakyBucket {
		return local, len(ops), keys // their counters depend on when the hits came
	}
	setA := parse("async", alg, limit)
	for k := 0; k < keys; k += 97 {
		v := fmt.Sprint("k", k)
		if a, e := used(t, url, pa, setA, v), used(t, url, pe, setA, v); a != e {
			t.Errorf("key %s: async counted %d, exact %d", v, a, e)
		}
	}
	return local, len(ops), keys
}
