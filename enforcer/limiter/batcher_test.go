package limiter

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
)

// accuracyTimeout is the Batcher timeout of the tests that count decisions
// under concurrency: the client's, not the node's 50 ms, which a 2-core
// machine running other packages' tests beside misses now and then.
const accuracyTimeout = 2 * time.Second

// randomTakes returns n random Takes over a handful of hot keys of every
// algorithm, keyed under prefix: repeated keys, several keys per Take,
// peeks, large hits.
func randomTakes(rng *rand.Rand, prefix string, n int) [][]Request {
	algs := []rules.Algorithm{rules.TokenBucket, rules.LeakyBucket, rules.FixedWindow, rules.SlidingWindowLog, rules.SlidingWindowCounter}
	var limits []Request
	for i, alg := range algs {
		for j := range 2 {
			req := Request{Key: testKey(prefix, fmt.Sprintf("%d.%d", i, j)), Algorithm: alg, Limit: 5 + rng.Int64N(20), Period: time.Hour}
			if alg == rules.LeakyBucket && j == 1 {
				req.MaxDelay = time.Duration(rng.Int64N(600)) * time.Second
			}
			limits = append(limits, req)
		}
	}
	takes := make([][]Request, n)
	for i := range takes {
		for range 1 + rng.IntN(3) {
			req := limits[rng.IntN(len(limits))]
			req.Hits = []int64{0, 1, 1, 1, 2, 4, 30}[rng.IntN(7)]
			takes[i] = append(takes[i], req)
		}
	}
	return takes
}

// TestCoalescedEqualsSerial decides the same Takes twice at the same
// instant: one Take per call in order, then all in coalesced script calls
// (one per 256 Takes), and wants identical decisions.
func TestCoalescedEqualsSerial(t *testing.T) {
	t.Parallel()
	r, _, prefix := newTestRedis(t)
	r.now = func() int64 { return t0 }
	rng := rand.New(rand.NewPCG(7, 8))
	takes := randomTakes(rng, prefix+"serial:", 600)

	serial := make([][]Decision, len(takes))
	for i, reqs := range takes {
		serial[i] = take(t, r, reqs...)
	}

	for _, reqs := range takes {
		for j := range reqs {
			reqs[j].Key = prefix + "packed:" + reqs[j].Key[len(prefix+"serial:"):]
		}
	}
	calls := takeCalls(t, r, takes...)
	r.exec(context.Background(), calls, true)

	rejected := 0
	for i, c := range calls {
		if c.err != nil {
			t.Fatalf("take %d: %v", i, c.err)
		}
		for j := range c.ds {
			if c.ds[j] != serial[i][j] {
				t.Fatalf("take %d request %d (%+v):\n  serial %+v\ncoalesced %+v", i, j, takes[i][j], serial[i][j], c.ds[j])
			}
			if !c.ds[j].Allowed {
				rejected++
			}
		}
	}
	if rejected < 100 {
		t.Errorf("only %d rejections: the scenario does not exercise limits", rejected)
	}
}

// takeAll runs clients × goroutines × perG single-request Takes of req
// concurrently and returns how many were allowed.
func takeAll(t *testing.T, stores []Store, goroutines, perG int, req Request) int64 {
	t.Helper()
	var allowed atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for _, s := range stores {
		for range goroutines {
			wg.Go(func() {
				<-start
				for range perG {
					ds, err := s.Take(context.Background(), []Request{req})
					if err != nil {
						t.Errorf("Take: %v", err)
						return
					}
					if ds[0].Allowed {
						allowed.Add(1)
					}
				}
			})
		}
	}
	close(start)
	wg.Wait()
	return allowed.Load()
}

// Store is the engine's view of a limiter, for tests that run several.
type Store interface {
	Take(context.Context, []Request) ([]Decision, error)
}

// TestBatcherConcurrentExact: 3 nodes × 64 goroutines on one key, through
// batchers (coalescing on and off): exactly the limit is admitted for the
// algorithms without refill during the test.
func TestBatcherConcurrentExact(t *testing.T) {
	t.Parallel()
	url := testenv.RedisURL(t)
	var cleanup redis.UniversalClient
	for _, coalesce := range []bool{true, false} {
		var stores []Store
		for range 3 {
			c, err := NewClient(url, WithTimeout(5*time.Second), WithDialTimeout(5*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			cleanup = c
			stores = append(stores, NewBatcher(NewRedis(c), BatchOptions{NoCoalescing: !coalesce, OverLimitEntries: -1, Timeout: accuracyTimeout}))
		}
		prefix := testPrefix(t, cleanup)
		for _, alg := range []rules.Algorithm{rules.TokenBucket, rules.FixedWindow, rules.SlidingWindowLog, rules.LeakyBucket} {
			req := Request{Key: testKey(prefix, string(alg)), Algorithm: alg, Limit: 100, Period: noBoundary, Hits: 1}
			if got := takeAll(t, stores, 64, 3, req); got != 100 {
				t.Errorf("coalesce=%v %s: allowed %d of %d, want exactly 100", coalesce, alg, got, 3*64*3)
			}
		}
	}
}

func TestBatcherAllOrNothing(t *testing.T) {
	t.Parallel()
	r, _, prefix := newTestRedis(t)
	b := NewBatcher(r, BatchOptions{Timeout: accuracyTimeout})
	ctx := context.Background()
	// One request per algorithm, and a global limit that is exhausted.
	var reqs []Request
	for _, alg := range []rules.Algorithm{rules.TokenBucket, rules.LeakyBucket, rules.FixedWindow, rules.SlidingWindowLog, rules.SlidingWindowCounter} {
		reqs = append(reqs, Request{Key: testKey(prefix, string(alg)), Algorithm: alg, Limit: 10, Period: noBoundary, Hits: 1})
	}
	global := Request{Key: testKey(prefix, "global"), Algorithm: rules.FixedWindow, Limit: 3, Period: noBoundary, Hits: 1}
	admitted := 0
	for range 6 {
		ds, err := b.Take(ctx, append(reqs, global))
		if err != nil {
			t.Fatal(err)
		}
		if ds[len(ds)-1].Allowed {
			admitted++
		}
	}
	if admitted != 3 {
		t.Fatalf("admitted %d, want 3", admitted)
	}
	for _, req := range reqs {
		req.Hits = 0
		ds, err := r.Take(ctx, []Request{req})
		if err != nil {
			t.Fatal(err)
		}
		if ds[0].Remaining != 7 {
			t.Errorf("%s: Remaining %d after 3 admitted and 3 rejected Takes, want 7", req.Algorithm, ds[0].Remaining)
		}
	}
}

// privateRedis starts a redis-server of the test's own, for tests that
// disturb the whole server (script flushes, restarts).
func privateRedis(t *testing.T) (*testenv.RedisServer, *Redis, redis.UniversalClient) {
	t.Helper()
	p := testenv.StartRedis(t)
	c, err := NewClient("redis://"+p.Addr()+"/0", WithTimeout(5*time.Second), WithDialTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return p, NewRedis(c), c
}

// TestScriptFlushMidRun flushes the script cache again and again while 64
// goroutines take: every Take recovers (EVALSHA → NOSCRIPT → EVAL) and the
// count stays exact. On a private server: a flush blocks the whole server.
func TestScriptFlushMidRun(t *testing.T) {
	t.Parallel()
	_, r, c := privateRedis(t)
	prefix := "flush:"
	for _, s := range []struct {
		name  string
		store Store
	}{{"direct", r}, {"batcher", NewBatcher(r, BatchOptions{OverLimitEntries: -1, Timeout: accuracyTimeout})}} {
		t.Run(s.name, func(t *testing.T) {
			req := Request{Key: testKey(prefix, "flush"+s.name), Limit: 300, Period: noBoundary, Hits: 1}
			stop := make(chan struct{})
			var flushes atomic.Int64
			var wg sync.WaitGroup
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					if err := c.ScriptFlush(context.Background()).Err(); err != nil {
						t.Errorf("SCRIPT FLUSH: %v", err)
						return
					}
					flushes.Add(1)
					time.Sleep(time.Millisecond)
				}
			})
			got := takeAll(t, []Store{s.store}, 64, 8, req)
			close(stop)
			wg.Wait()
			if got != 300 {
				t.Errorf("allowed %d of %d with %d script flushes, want exactly 300", got, 64*8, flushes.Load())
			}
			t.Logf("%d SCRIPT FLUSH during the run", flushes.Load())
		})
	}
}

func TestOverLimitCache(t *testing.T) {
	t.Parallel()
	r, c, prefix := newTestRedis(t)
	b := NewBatcher(r, BatchOptions{})
	ctx := context.Background()
	bt := func(reqs ...Request) []Decision {
		t.Helper()
		ds, err := b.Take(ctx, reqs)
		if err != nil {
			t.Fatal(err)
		}
		return ds
	}

	// 1 per hour, burst 2: once rejected, the key stays over for an hour.
	hot := Request{Key: testKey(prefix, "hot"), Limit: 1, Period: time.Hour, Burst: 2, Hits: 1}
	other := Request{Key: testKey(prefix, "other"), Limit: 100, Period: time.Hour, Hits: 1}
	bt(hot)
	bt(hot)
	first := bt(hot)[0]
	if first.Allowed || first.Cached {
		t.Fatalf("third take: %+v, want rejected by Redis", first)
	}
	// Redis is not asked any more: even with its state gone, the cache rejects.
	if err := c.Del(ctx, stateKey(hot)).Err(); err != nil {
		t.Fatal(err)
	}
	d := bt(hot)[0]
	if d.Allowed || !d.Cached || d.RetryAfter <= 0 || d.RetryAfter > first.RetryAfter || d.Limit != 2 {
		t.Errorf("cached rejection: %+v (first %+v)", d, first)
	}
	// A Take including the over-limit key consumes nothing from the others.
	ds := bt(other, hot)
	if ds[1].Allowed || !ds[0].Allowed || !ds[0].Cached {
		t.Errorf("Take with a cached over-limit key: %+v", ds)
	}
	if d := take1(t, r, Request{Key: other.Key, Limit: 100, Period: time.Hour}); d.Remaining != 100 {
		t.Errorf("other: Remaining %d, want 100 (untouched)", d.Remaining)
	}
	// Fewer hits, a peek, or other parameters are not known to be rejected.
	if d := bt(Request{Key: hot.Key, Limit: 1, Period: time.Hour, Burst: 2}); d[0].Cached || !d[0].Allowed {
		t.Errorf("peek: %+v, want asked to Redis", d[0])
	}
	if d := bt(Request{Key: hot.Key, Limit: 1, Period: time.Hour, Burst: 5, Hits: 1}); d[0].Cached || !d[0].Allowed {
		t.Errorf("other burst: %+v, want asked to Redis (and allowed)", d[0])
	}

	// A reset (the state deleted) is seen within OverLimitRecheck, though
	// the rejection's RetryAfter is an hour away.
	reset := Request{Key: testKey(prefix, "reset"), Limit: 1, Period: time.Hour, Burst: 1, Hits: 1}
	bt(reset)
	if d := bt(reset)[0]; d.Allowed || d.RetryAfter < time.Minute {
		t.Fatalf("reset: second take %+v, want rejected for most of an hour", d)
	}
	if err := c.Del(ctx, stateKey(reset)).Err(); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	for {
		d := bt(reset)[0]
		if d.Allowed {
			t.Logf("allowed %v after the reset (OverLimitRecheck %v)", time.Since(deleted), OverLimitRecheck)
			break
		}
		if time.Since(deleted) > 5*OverLimitRecheck {
			t.Fatalf("still rejected %v after the reset: %+v", time.Since(deleted), d)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// An entry expires with its RetryAfter.
	fast := Request{Key: testKey(prefix, "fast"), Limit: 20, Period: time.Second, Burst: 1, Hits: 1}
	bt(fast)
	rej := bt(fast)[0]
	if rej.Allowed {
		t.Fatal("fast: second take allowed")
	}
	time.Sleep(rej.RetryAfter + 5*time.Millisecond)
	if d := bt(fast)[0]; !d.Allowed || d.Cached {
		t.Errorf("after RetryAfter: %+v, want allowed by Redis", d)
	}

	// A rejection caused by the same key earlier in the Take is not cached.
	dup := Request{Key: testKey(prefix, "dup"), Limit: 1, Period: time.Hour, Burst: 1, Hits: 1}
	if ds := bt(dup, dup); ds[1].Allowed {
		t.Fatalf("same key twice with burst 1: %+v", ds)
	}
	if d := bt(dup)[0]; !d.Allowed || d.Cached {
		t.Errorf("after a self-rejected Take: %+v, want allowed by Redis", d)
	}
}

func TestOverLimitCacheBounded(t *testing.T) {
	t.Parallel()
	c := newOverLimitCache(50)
	now := time.Now()
	for i := range 500 {
		s := []spec{{key: fmt.Sprint(i), hits: 1}}
		c.learn(s, []Decision{{RetryAfter: time.Duration(i+1) * time.Second}}, now)
	}
	if n := len(c.m); n > 50 {
		t.Errorf("cache holds %d entries, want at most 50", n)
	}
	later := now.Add(time.Hour)
	c.learn([]spec{{key: "x", hits: 1}}, []Decision{{RetryAfter: time.Second}}, later)
	if _, ok := c.answer([]spec{{key: "x", hits: 1}}, later); !ok {
		t.Error("fresh entry not answered")
	}
	if _, ok := c.answer([]spec{{key: "x", hits: 1}}, later.Add(time.Second)); ok {
		t.Error("expired entry answered")
	}
}

func TestBatcherContextDone(t *testing.T) {
	t.Parallel()
	addr := hungServer(t)
	c, err := NewClient("redis://"+addr+"/0", WithTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b := NewBatcher(NewRedis(c), BatchOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err = b.Take(ctx, []Request{{Key: "k", Limit: 1, Period: time.Second, Hits: 1}})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Take with a hung Redis and a 20ms deadline: %v, want DeadlineExceeded", err)
	}
}

func TestBatcherDeadRedis(t *testing.T) {
	t.Parallel()
	c, err := NewClient("redis://127.0.0.1:1/0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b := NewBatcher(NewRedis(c), BatchOptions{})
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			if _, err := b.Take(context.Background(), []Request{{Key: "k", Limit: 1, Period: time.Second, Hits: 1}}); err == nil {
				t.Error("Take against a dead Redis: no error")
			}
		})
	}
	wg.Wait()
}

// TestRedisRestartedMidRun kills a private redis-server while 32 goroutines
// take, starts it again on the same port, and wants the takes to fail while
// it is down and to succeed again by themselves, through batcher and
// direct engine alike.
func TestRedisRestartedMidRun(t *testing.T) {
	t.Parallel()
	p := testenv.StartRedis(t)
	c, err := NewClient("redis://" + p.Addr() + "/0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := NewRedis(c)
	stores := []Store{r, NewBatcher(r, BatchOptions{})}
	req := Request{Key: testKey("restart:", "k"), Limit: 1 << 40, Period: time.Second, Hits: 1}

	var okCount, errCount atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Go(func() {
			s := stores[g%2]
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := s.Take(context.Background(), []Request{req}); err != nil {
					errCount.Add(1)
					time.Sleep(time.Millisecond)
				} else {
					okCount.Add(1)
				}
			}
		})
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				close(stop)
				wg.Wait()
				t.Fatalf("timed out waiting for %s (ok %d, errors %d)", what, okCount.Load(), errCount.Load())
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitFor("takes before the crash", func() bool { return okCount.Load() > 100 })
	p.Stop()
	errs := errCount.Load()
	waitFor("errors while down", func() bool { return errCount.Load() > errs+100 })
	down := time.Now()
	p.Restart() // same port, empty script cache
	back := time.Now()
	oks := okCount.Load()
	waitFor("takes after the restart", func() bool { return okCount.Load() > oks+100 })
	close(stop)
	wg.Wait()
	t.Logf("down for %v; takes succeeded again %v after restart; %d ok, %d errors in all",
		back.Sub(down), time.Since(back), okCount.Load(), errCount.Load())
	// Both stores work again.
	for i, s := range stores {
		if _, err := s.Take(context.Background(), []Request{req}); err != nil {
			t.Errorf("store %d after restart: %v", i, err)
		}
	}
}

// TestPackedCallError: a Take that fails in Redis (its key holds another
// type) fails alone; the Takes coalesced with it are decided, once.
func TestPackedCallError(t *testing.T) {
	t.Parallel()
	r, c, prefix := newTestRedis(t)
	bad := Request{Key: testKey(prefix, "bad"), Algorithm: rules.SlidingWindowLog, Limit: 5, Period: time.Hour, Hits: 1}
	if err := c.Set(context.Background(), stateKey(bad), "not a sorted set", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	good := Request{Key: testKey(prefix, "good"), Algorithm: rules.FixedWindow, Limit: 5, Period: noBoundary, Hits: 1}
	calls := takeCalls(t, r, []Request{good}, []Request{bad}, []Request{good})
	r.exec(context.Background(), calls, true)
	if calls[1].err == nil {
		t.Errorf("Take of a key holding a string: no error")
	}
	for _, i := range []int{0, 2} {
		if calls[i].err != nil || !calls[i].ds[0].Allowed || calls[i].ds[0].Remaining != int64(4-i/2) {
			t.Errorf("good Take %d: %+v %v", i, calls[i].ds, calls[i].err)
		}
	}
	if d := take1(t, r, Request{Key: good.Key, Algorithm: rules.FixedWindow, Limit: 5, Period: noBoundary}); d.Remaining != 3 {
		t.Errorf("good: Remaining %d, want 3 (counted once each)", d.Remaining)
	}
}

// takeCalls makes one call of each Take (its requests on one hash slot),
// ready for r.exec to pack into one script call.
func takeCalls(t *testing.T, r *Redis, takes ...[]Request) []*takeCall {
	t.Helper()
	calls := make([]*takeCall, 0, len(takes))
	for _, reqs := range takes {
		specs, err := specsOf(reqs)
		if err != nil {
			t.Fatal(err)
		}
		c := r.group(specs)[0]
		c.mode = modeTake
		calls = append(calls, c)
	}
	return calls
}

// TestBatcherNoLostWaiter: 64 goroutines take on one key, a third of them
// with contexts that end while they wait (cancelled, or deadlines of up to
// 2 ms), through a Batcher that queues many small batches (one round trip
// in flight, batches of at most 4) and through the defaults: every Take
// whose context stays live is decided, and Redis counts every allowed Take
// once, plus at most the abandoned ones.
func TestBatcherNoLostWaiter(t *testing.T) {
	t.Parallel()
	r, c, prefix := newTestRedis(t)
	for i, opts := range []BatchOptions{
		{MaxInFlight: 1, MaxBatch: 4, OverLimitEntries: -1, Timeout: accuracyTimeout},
		{OverLimitEntries: -1, Timeout: accuracyTimeout},
	} {
		b := NewBatcher(r, opts)
		req := Request{Key: testKey(prefix, strconv.Itoa(i)), Algorithm: rules.FixedWindow, Limit: 1 << 40, Period: noBoundary, Hits: 1}
		var allowed, abandoned atomic.Int64
		var wg sync.WaitGroup
		for g := range 64 {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(g), uint64(i)))
				for range 50 {
					ctx, cancel := context.Background(), context.CancelFunc(func() {})
					ends := true
					switch rng.IntN(6) {
					case 0:
						ctx, cancel = context.WithTimeout(ctx, time.Duration(rng.Int64N(int64(2*time.Millisecond))))
					case 1:
						ctx, cancel = context.WithCancel(ctx)
						time.AfterFunc(time.Duration(rng.Int64N(int64(time.Millisecond))), cancel)
					default:
						ends = false
					}
					ds, err := b.Take(ctx, []Request{req})
					cancel()
					switch {
					case err == nil && ds[0].Allowed:
						allowed.Add(1)
					case ends && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)):
						abandoned.Add(1)
					default:
						t.Errorf("options %d: Take (context ending: %v): %v %v", i, ends, ds, err)
						return
					}
				}
			})
		}
		wg.Wait()
		got := fwCount(t, c, req.Key)
		t.Logf("options %d: %d allowed, %d abandoned, %d counted", i, allowed.Load(), abandoned.Load(), got)
		if got < allowed.Load() || got > allowed.Load()+abandoned.Load() {
			t.Errorf("options %d: Redis counted %d, want %d allowed plus at most %d abandoned", i, got, allowed.Load(), abandoned.Load())
		}
	}
}

// TestBatcherContextDeadlineNotSent: a Take queued behind a round trip in
// flight whose context's deadline passes returns at its deadline with the
// context's error, and is not sent when its batch goes; the Take queued
// with it is.
func TestBatcherContextDeadlineNotSent(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t)
	c, err := NewClient(srv.URL(), WithTimeout(5*time.Second), WithDialTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	b := NewBatcher(NewRedis(c), BatchOptions{MaxInFlight: 1, Timeout: 5 * time.Second, OverLimitEntries: -1})
	req := func(k string) []Request {
		return []Request{{Key: testKey("ctxdl:", k), Algorithm: rules.FixedWindow, Limit: 10, Period: noBoundary, Hits: 1}}
	}
	bg := context.Background()
	if _, err := b.Take(bg, req("warm")); err != nil {
		t.Fatal(err)
	}
	state := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
			b.mu.Lock()
			ok := cond()
			b.mu.Unlock()
			if ok {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}
	type result struct {
		ds  []Decision
		err error
	}
	take := func(ctx context.Context, k string) chan result {
		ch := make(chan result, 1)
		go func() {
			ds, err := b.Take(ctx, req(k))
			ch <- result{ds, err}
		}()
		return ch
	}

	// A's round trip is in flight, stuck on a frozen Redis; B (with a
	// deadline) and C queue behind it.
	srv.Signal(syscall.SIGSTOP)
	thawed := false
	defer func() {
		if !thawed {
			srv.Signal(syscall.SIGCONT)
		}
	}()
	resA := take(bg, "a")
	state("A's round trip in flight", func() bool { return b.inflight == 1 && len(b.pending) == 0 })
	ctxB, cancelB := context.WithTimeout(bg, 200*time.Millisecond)
	defer cancelB()
	resB := take(ctxB, "b")
	resC := take(bg, "c")
	state("B and C queued", func() bool { return len(b.pending) == 2 })
	select {
	case r := <-resB:
		if !errors.Is(r.err, context.DeadlineExceeded) {
			t.Errorf("B: %v %v, want its context's deadline", r.ds, r.err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("B did not return at its context's deadline")
	}

	srv.Signal(syscall.SIGCONT)
	thawed = true
	for name, ch := range map[string]chan result{"A": resA, "C": resC} {
		if r := <-ch; r.err != nil || !r.ds[0].Allowed || r.ds[0].Remaining != 9 {
			t.Errorf("%s: %+v %v, want allowed with 9 remaining", name, r.ds, r.err)
		}
	}
	state("nothing queued or in flight", func() bool { return b.inflight == 0 && len(b.pending) == 0 })
	if n, err := c.Exists(bg, stateKey(req("b")[0])).Result(); err != nil || n != 0 {
		t.Errorf("B's key exists (%d, %v): a Take sent after its context's deadline", n, err)
	}
}
