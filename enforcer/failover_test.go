package enforcer

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/enforcer/limiter"
	"github.com/sluicehq/sluice/enforcer/node"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
)

// failoverYAML counts every check exactly (fixed windows of a day, far
// above what a test reaches), so what Redis admitted can be compared with
// what it holds after a failover.
const failoverYAML = `domain: api
descriptors:
  - key: open
    rate_limit: {unit: day, requests_per_unit: 1000000000}
    algorithm: fixed_window
    failure_mode: open
  - key: closed
    rate_limit: {unit: day, requests_per_unit: 1000000000}
    algorithm: fixed_window
    failure_mode: closed
`

// recordingStore counts, per limit, the hits Redis admitted (Takes that
// returned allowed decisions, not failure modes), and keeps each limit's
// request so the test can read its count back.
type recordingStore struct {
	inner engine.Store
	mu    sync.Mutex
	hits  map[string]int64
	reqs  map[string]limiter.Request
	times []time.Time // when each admitted Take returned (one hit each here)
}

func newRecordingStore(s engine.Store) *recordingStore {
	return &recordingStore{inner: s, hits: map[string]int64{}, reqs: map[string]limiter.Request{}}
}

func (r *recordingStore) Take(ctx context.Context, reqs []limiter.Request) ([]limiter.Decision, error) {
	ds, err := r.inner.Take(ctx, reqs)
	if err != nil {
		return ds, err
	}
	all := true
	for _, d := range ds {
		all = all && d.Allowed
	}
	r.mu.Lock()
	for _, q := range reqs {
		if all {
			r.hits[q.Key] += q.Hits
		}
		r.reqs[q.Key] = q
	}
	if all {
		r.times = append(r.times, time.Now())
	}
	r.mu.Unlock()
	return ds, nil
}

// lost reads back every limit's count through client and returns, summed,
// the hits Redis admitted that it no longer counts, and the hits admitted.
func (r *recordingStore) lost(t *testing.T, client redis.UniversalClient) (lost, admitted int64) {
	lost, _, admitted = r.counts(t, client)
	return lost, admitted
}

// counts reads back every limit's count through client and returns, summed,
// the hits Redis admitted that it no longer counts (lost), the hits it
// counts that it did not admit (extra: a Take whose answer came too late
// and the failure mode answered), and the hits admitted.
func (r *recordingStore) counts(t *testing.T, client redis.UniversalClient) (lost, extra, admitted int64) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	store := limiter.NewRedis(client)
	for key, req := range r.reqs {
		peek := req
		peek.Hits = 0
		var ds []limiter.Decision
		var err error
		for range 50 { // the new master may still be settling
			if ds, err = store.Take(context.Background(), []limiter.Request{peek}); err == nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("read back %s: %v", key, err)
		}
		counted := req.Limit - ds[0].Remaining
		admitted += r.hits[key]
		if counted < r.hits[key] {
			lost += r.hits[key] - counted
		} else {
			extra += counted - r.hits[key]
		}
	}
	return lost, extra, admitted
}

// admittedBetween returns how many Takes Redis admitted between from and to.
func (r *recordingStore) admittedBetween(from, to time.Time) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	var n int64
	for _, at := range r.times {
		if at.After(from) && at.Before(to) {
			n++
		}
	}
	return n
}

// failoverRun is what runFailover measured.
type failoverRun struct {
	samples map[string][]sample // by failure mode, in start order
	cut     time.Time           // when the fault was caused
	healed  time.Time           // when the test saw the store whole again
	trips   int64               // times the breaker opened
}

// settleQuiet is how long, after a fault heals, the failure mode must
// have answered no check before the load stops: five times the end of the
// load check asks for.
const settleQuiet = time.Second

// runFailover puts load on both failure modes through a node's engine on
// store, causes the fault with fault after 300 ms, and keeps the load on
// after healed returns until the failure mode has answered nothing for
// settleQuiet, or at most 2 s.
func runFailover(t *testing.T, store engine.Store, fault func(), healed func()) failoverRun {
	return runFault(t, store, fault, healed, 2*time.Second)
}

// runFault is runFailover with the load kept on for at most settle after
// healed: until the failure mode has answered nothing for settleQuiet.
func runFault(t *testing.T, store engine.Store, fault func(), healed func(), settle time.Duration) failoverRun {
	t.Helper()
	eng := node.NewEngine(store, testenv.KeyPrefix(t), discard)
	d, err := rules.Parse("api.yaml", []byte(failoverYAML))
	if err != nil {
		t.Fatal(err)
	}
	set, err := rules.Compile([]*rules.Domain{d})
	if err != nil {
		t.Fatal(err)
	}
	eng.Apply(1, set)
	// Warm: a loaded machine may miss the first dials' 50 ms.
	warm := engine.Request{Domain: "api", Descriptors: []engine.Descriptor{{Entries: []rules.Entry{{Key: "open", Value: "warm"}}}}}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		res, err := eng.Check(context.Background(), warm)
		if err == nil && res.StoreErr == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("store not answering before the fault: %v %v", err, res.StoreErr)
		}
	}
	stop := make(chan struct{})
	var mu sync.Mutex
	run := failoverRun{samples: map[string][]sample{}}
	var wg sync.WaitGroup
	// lastErr is when the latest check the failure mode answered ended
	// (Unix nanoseconds).
	var lastErr atomic.Int64
	seen := func(s sample) {
		if !s.fromErr {
			return
		}
		for end := s.start.Add(s.took).UnixNano(); ; {
			old := lastErr.Load()
			if end <= old || lastErr.CompareAndSwap(old, end) {
				return
			}
		}
	}
	for _, key := range []string{"open", "closed"} {
		wg.Go(func() {
			// Two workers paced at 1 ms: these tests run beside other packages' timing
			// tests on a 2-core machine.
			s := loadPaced(eng, key, 2, time.Millisecond, stop, seen)
			slices.SortFunc(s, func(a, b sample) int { return a.start.Compare(b.start) })
			mu.Lock()
			run.samples[key] = s
			mu.Unlock()
		})
	}
	time.Sleep(300 * time.Millisecond)
	run.cut = time.Now()
	fault()
	healed()
	run.healed = time.Now()
	// Redis decides again: check judges the end of the load.
	for deadline := run.healed.Add(settle); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		quietSince := time.Unix(0, max(lastErr.Load(), run.healed.UnixNano()))
		if time.Since(quietSince) >= settleQuiet {
			break
		}
	}
	close(stop)
	wg.Wait()
	run.trips = int64(eng.Breaker().Trips())
	return run
}

// during returns the checks that started within d after the fault.
func (f failoverRun) during(d time.Duration) []sample {
	var out []sample
	for _, ss := range f.samples {
		for _, s := range ss {
			if !s.start.Before(f.cut) && s.start.Before(f.cut.Add(d)) {
				out = append(out, s)
			}
		}
	}
	return out
}

// check asserts what a fault may do to checks and returns its window of
// errors (first to last check the failure mode answered) and the number of
// checks answered so: no check fails (the failure mode answers every one
// Redis could not decide), open admits and closed refuses them, nothing is
// answered so before the fault, and Redis decides again before the end (at
// least 200 ms of checks after the failure mode's last answer).
func (f failoverRun) check(t *testing.T) (window time.Duration, undecided int) {
	t.Helper()
	var first, last, end time.Time
	early, before := 0, 0
	for mode, ss := range f.samples {
		if len(ss) < 100 {
			t.Fatalf("%s: only %d checks", mode, len(ss))
		}
		if e := ss[len(ss)-1].start; e.After(end) {
			end = e
		}
		for _, s := range ss {
			if s.err != nil {
				t.Fatalf("%s: check failed: %v", mode, s.err)
			}
			if s.start.Before(f.cut) {
				before++
			}
			if !s.fromErr {
				continue
			}
			if s.start.Before(f.cut) {
				early++
				continue
			}
			if want := map[string]engine.Code{"open": engine.OK, "closed": engine.OverLimit}[mode]; s.code != want {
				t.Fatalf("%s: failure mode answered %v, want %v", mode, s.code, want)
			}
			if first.IsZero() || s.start.Before(first) {
				first = s.start
			}
			if e := s.start.Add(s.took); e.After(last) {
				last = e
			}
			undecided++
		}
	}
	// A loaded machine (make test runs packages side by side) misses some
	// 50 ms timeouts before the fault too.
	if early*10 > before {
		t.Errorf("the failure mode answered %d of %d checks before the fault", early, before)
	}
	if !last.IsZero() && end.Sub(last) < 200*time.Millisecond {
		t.Errorf("the failure mode answered until %v before the end of the load, want Redis deciding again", end.Sub(last))
	}
	if !first.IsZero() {
		window = last.Sub(first)
	}
	return window, undecided
}

// newNodeStore is the store an enforcer node runs on client: a Batcher with
// the node's 50 ms store timeout, recording what Redis admitted.
func newNodeStore(client redis.UniversalClient) *recordingStore {
	return newRecordingStore(limiter.NewBatcher(limiter.NewRedis(client), limiter.BatchOptions{Timeout: limiter.DefaultTimeout}))
}

// waitReplicated returns a time before which every write the master at
// addr answered is on its replica: WAIT, sent after that time, returns once
// the replica acknowledged every write the master had made by then.
func waitReplicated(t *testing.T, addr string) time.Time {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	before := time.Now()
	n, err := c.Do(context.Background(), "WAIT", 1, 5000).Int()
	if err != nil || n != 1 {
		t.Fatalf("WAIT for the replica: %d replicas, %v", n, err)
	}
	return before
}

// TestSentinelFailoverUnderLoad fails a Sentinel-monitored master over under
// load: checks get their failure mode inside a window of errors, then Redis
// decides again, through the same client. Killing the master loses what it
// admitted after its replica's last acknowledgement (replication is
// asynchronous, and a replica on a loaded machine lagged 300 ms once); the
// test kills it right after a WAIT, and nothing older may be lost. A failover asked of a live master (SENTINEL FAILOVER)
// loses what the old master admitted between the replica's promotion and
// the client following it (Sentinel's asynchronous replication); with
// min-replicas-to-write 1 the master refuses most of those writes (it
// notices its replica gone within a second) and the failure mode answers
// them instead.
func TestSentinelFailoverUnderLoad(t *testing.T) {
	// Not parallel: it asserts latencies under load.
	if testing.Short() {
		t.Skip("failover test runs private redis-servers and sentinels")
	}
	for _, tt := range []struct {
		name       string
		kill       bool
		masterArgs []string
	}{
		{"master killed", true, nil},
		{"sentinel failover", false, nil},
		{"sentinel failover, min-replicas-to-write 1", false, []string{"--min-replicas-to-write", "1", "--min-replicas-max-lag", "1"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			g := testenv.StartSentinel(t, 500*time.Millisecond, tt.masterArgs...)
			client, err := limiter.NewClient(g.URL())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { client.Close() })
			store := newNodeStore(client)
			// synced is when the replica had acknowledged every write the
			// master had made (WAIT): a killed master loses only what it
			// admitted after that (replication is asynchronous).
			var synced time.Time
			run := runFailover(t, store, func() {
				if tt.kill {
					synced = waitReplicated(t, g.Master.Addr())
					g.Master.Stop()
				} else {
					g.Failover()
				}
			}, func() { g.WaitMaster(g.Replica.Addr(), 15*time.Second) })
			window, undecided := run.check(t)
			lost, admitted := store.lost(t, client)
			during := store.admittedBetween(run.cut, time.Now())
			t.Logf("%s: new master %v after the fault; window of errors %v (%d checks answered by their failure mode); %d of %d admitted hits lost (%d admitted after the fault began)",
				tt.name, run.healed.Sub(run.cut).Round(time.Millisecond), window.Round(time.Millisecond), undecided, lost, admitted, during)
			switch {
			case tt.kill:
				if unsynced := store.admittedBetween(synced, time.Now()); lost > unsynced {
					t.Errorf("%d hits Redis admitted are not counted after the failover, more than the %d admitted after the replica's last acknowledgement", lost, unsynced)
				}
			case lost > during:
				// What the old master admitted after the promotion is lost;
				// what it admitted before the fault must not be.
				t.Errorf("%d hits lost, more than the %d admitted after the fault began", lost, during)
			}
		})
	}
}

// TestClusterFailoverUnderLoad kills the Redis Cluster master serving the
// limits' slot under load; its replica takes over.
func TestClusterFailoverUnderLoad(t *testing.T) {
	// Not parallel: it asserts latencies under load.
	if testing.Short() {
		t.Skip("failover test runs a private Redis Cluster")
	}
	cl := testenv.StartCluster(t, 3, 1, time.Second)
	client, err := limiter.NewClient(cl.Seeds())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	store := newNodeStore(client)
	var victim *testenv.RedisServer
	// 3 s to settle: on a loaded machine the client has taken up to 2 s
	// after the cluster healed to route to the new master (a slot map
	// reload per failed call, at most one per 200 ms, and the breaker's
	// probes every 200 ms).
	run := runFault(t, store, func() {
		store.mu.Lock()
		var key string
		for k := range store.reqs {
			key = k
			break
		}
		store.mu.Unlock()
		victim = cl.MasterOf(limiter.Slot(key))
		victim.Stop()
	}, func() {
		deadline := time.Now().Add(15 * time.Second)
		for len(cl.Masters()) < 3 {
			if time.Now().After(deadline) {
				t.Fatal("no replica took over within 15s")
			}
			time.Sleep(20 * time.Millisecond)
		}
		cl.WaitOK(15 * time.Second) // every live node sees the new master
	}, 3*time.Second)
	window, undecided := run.check(t)
	lost, admitted := store.lost(t, client)
	t.Logf("master %s killed: a replica took over %v after; window of errors %v (%d checks answered by their failure mode); %d of %d admitted hits lost",
		victim.Addr(), run.healed.Sub(run.cut).Round(time.Millisecond), window.Round(time.Millisecond), undecided, lost, admitted)
	if lost > 0 {
		t.Errorf("%d hits Redis admitted are not counted after the failover", lost)
	}
}
