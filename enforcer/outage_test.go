package enforcer

import (
	"context"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/enforcer/breaker"
	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/enforcer/limiter"
	"github.com/sluicehq/sluice/enforcer/node"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
)

const outageYAML = `domain: api
descriptors:
  - key: open
    rate_limit: {unit: second, requests_per_unit: 1000000}
    failure_mode: open
  - key: closed
    rate_limit: {unit: second, requests_per_unit: 1000000}
    failure_mode: closed
  - key: local
    rate_limit: {unit: second, requests_per_unit: 200}
    failure_mode: local
`

var discard = slog.New(slog.DiscardHandler)

// TestMain keeps go-redis's own logging (a line per failed dial, which the
// outage, failover and fault tests cause by the thousand) out of test
// output.
func TestMain(m *testing.M) {
	limiter.SetLogger(discard)
	os.Exit(m.Run())
}

// sample is one check made under load.
type sample struct {
	start   time.Time
	took    time.Duration
	code    engine.Code
	local   bool
	fromErr bool // answered by a failure mode
	err     error
}

// load runs checks of key from workers goroutines until stop is closed,
// each pausing 100 µs between checks.
func load(eng *engine.Engine, key string, workers int, stop <-chan struct{}) []sample {
	return loadPaced(eng, key, workers, 100*time.Microsecond, stop, nil)
}

// loadPaced is load with each worker pausing pace between checks, and
// seen (when not nil) called with each sample as it is taken.
func loadPaced(eng *engine.Engine, key string, workers int, pace time.Duration, stop <-chan struct{}, seen func(sample)) []sample {
	var (
		mu  sync.Mutex
		all []sample
		wg  sync.WaitGroup
	)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []sample
			req := engine.Request{Domain: "api", Descriptors: []engine.Descriptor{{Entries: []rules.Entry{{Key: key, Value: "v" + strconv.Itoa(w%4)}}}}}
			for {
				select {
				case <-stop:
					mu.Lock()
					all = append(all, mine...)
					mu.Unlock()
					return
				default:
				}
				t0 := time.Now()
				res, err := eng.Check(context.Background(), req)
				s := sample{start: t0, took: time.Since(t0), code: res.Code, fromErr: res.StoreErr != nil, err: err}
				if len(res.Statuses) > 0 {
					s.local = res.Statuses[0].Local
				}
				mine = append(mine, s)
				if seen != nil {
					seen(s)
				}
				// Paced, so the machine keeps idle CPU and latencies
				// measure the checks, not the scheduler.
				time.Sleep(pace)
			}
		}()
	}
	wg.Wait()
	return all
}

func p99(ss []sample) time.Duration {
	if len(ss) == 0 {
		return 0
	}
	d := make([]time.Duration, len(ss))
	for i, s := range ss {
		d[i] = s.took
	}
	slices.Sort(d)
	return d[len(d)*99/100]
}

// TestRedisOutageUnderLoad kills the counter store under load for each
// failure mode and checks what callers see during the outage and after
// Redis returns.
func TestRedisOutageUnderLoad(t *testing.T) {
	// Not parallel: it asserts latencies under load.
	if testing.Short() {
		t.Skip("outage test runs a private redis-server")
	}
	const workers = 16
	for _, mode := range []string{"open", "closed", "local"} {
		t.Run(mode, func(t *testing.T) {
			srv := testenv.StartRedis(t)
			client, err := limiter.NewClient(srv.URL())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { client.Close() })
			eng := node.NewEngine(limiter.NewRedis(client), "sluicetest:outage:", discard)
			d, err := rules.Parse("api.yaml", []byte(outageYAML))
			if err != nil {
				t.Fatal(err)
			}
			set, err := rules.Compile([]*rules.Domain{d})
			if err != nil {
				t.Fatal(err)
			}
			eng.Apply(1, set)
			brk := eng.Breaker()

			stop := make(chan struct{})
			time.AfterFunc(200*time.Millisecond, func() { close(stop) })
			// Healthy: Redis decides (all but the odd timeout of a loaded
			// machine).
			healthy := load(eng, mode, workers, stop)
			undecided := 0
			for _, s := range healthy {
				if s.err != nil {
					t.Fatalf("healthy store: %v", s.err)
				}
				if s.fromErr {
					undecided++
				}
			}
			if undecided*10 > len(healthy) {
				t.Fatalf("healthy store: %d of %d checks not decided by Redis", undecided, len(healthy))
			}

			// Kill Redis under load.
			stop = make(chan struct{})
			var outage []sample
			done := make(chan struct{})
			go func() { outage = load(eng, mode, workers, stop); close(done) }()
			time.Sleep(100 * time.Millisecond)
			killed := time.Now()
			srv.Stop()
			var opened time.Duration
			for brk.State() == breaker.Closed && time.Since(killed) < 5*time.Second {
				time.Sleep(time.Millisecond)
			}
			opened = time.Since(killed)
			time.Sleep(time.Second)
			close(stop)
			<-done
			if brk.State() == breaker.Closed {
				t.Fatal("breaker never opened while Redis was dead")
			}
			t.Logf("breaker opened %v after the kill; %d checks during the outage", opened.Round(time.Millisecond), len(outage))

			var during []sample
			settle := killed.Add(opened)
			for _, s := range outage {
				if s.err != nil {
					t.Fatalf("check failed during the outage: %v", s.err)
				}
				if s.start.After(settle) {
					during = append(during, s)
				}
			}
			if len(during) < 100 {
				t.Fatalf("only %d checks after the breaker opened", len(during))
			}
			// An open breaker costs nothing: checks do not wait on Redis.
			if got := p99(during); got > 20*time.Millisecond {
				t.Errorf("p99 check latency with the breaker open: %v, want well under the 50ms store timeout", got)
			}
			t.Logf("outage p99 %v over %d checks", p99(during), len(during))

			switch mode {
			case "open":
				for _, s := range during {
					if s.code != engine.OK || !s.fromErr {
						t.Fatalf("fail open: %+v, want OK by failure mode", s)
					}
				}
			case "closed":
				for _, s := range during {
					if s.code != engine.OverLimit || !s.fromErr {
						t.Fatalf("fail closed: %+v, want OVER_LIMIT by failure mode", s)
					}
				}
			case "local":
				// Documented error: each node admits its 1/node_count share
				// (here 1 node, 200/s with a 200 burst) per descriptor value:
				// at most burst + rate × duration, and that many when load
				// is steady. Workers use 4 values.
				first, last := time.Time{}, time.Time{}
				allowed := 0
				for _, s := range during {
					if !s.local {
						t.Fatalf("fail local: %+v, want a local decision", s)
					}
					if first.IsZero() || s.start.Before(first) {
						first = s.start
					}
					if s.start.After(last) {
						last = s.start
					}
					if s.code == engine.OK {
						allowed++
					}
				}
				secs := last.Sub(killed).Seconds()
				maxAllowed := 4 * (200 + int(200*secs) + 1)
				minAllowed := 4 * (int(200*last.Sub(first).Seconds()) - 1)
				t.Logf("local mode admitted %d over %.2fs (bound %d..%d)", allowed, secs, minAllowed, maxAllowed)
				if allowed > maxAllowed || allowed < minAllowed {
					t.Errorf("local mode admitted %d, want between %d and %d", allowed, minAllowed, maxAllowed)
				}
			}

			// Redis comes back: enforcement resumes by itself.
			srv.Restart()
			back := time.Now()
			req := engine.Request{Domain: "api", Descriptors: []engine.Descriptor{{Entries: []rules.Entry{{Key: mode, Value: "resume"}}}}}
			var resumed time.Duration
			for {
				res, err := eng.Check(context.Background(), req)
				if err != nil {
					t.Fatal(err)
				}
				if res.StoreErr == nil {
					resumed = time.Since(back)
					break
				}
				if time.Since(back) > 10*time.Second {
					t.Fatalf("Redis back for 10s and checks still fail: %v", res.StoreErr)
				}
				time.Sleep(5 * time.Millisecond)
			}
			t.Logf("enforcement resumed %v after Redis came back", resumed.Round(time.Millisecond))
			// go-redis re-dials a failed pool once a second, and the
			// breaker probes every 200 ms: ~1.2s in the worst case.
			if resumed > 1500*time.Millisecond {
				t.Errorf("enforcement resumed %v after Redis came back, want about a second", resumed)
			}
			if brk.State() != breaker.Closed {
				t.Errorf("breaker %v after Redis came back, want closed", brk.State())
			}
		})
	}
}

// TestRedisFrozenUnderLoad freezes Redis (SIGSTOP: connections stay open,
// nothing answers), the case where every call would wait for its timeout:
// the breaker must keep checks from waiting.
func TestRedisFrozenUnderLoad(t *testing.T) {
	// Not parallel: it asserts latencies under load.
	if testing.Short() {
		t.Skip("outage test runs a private redis-server")
	}
	const workers = 16
	srv := testenv.StartRedis(t)
	client, err := limiter.NewClient(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	store := &countingStore{Store: limiter.NewRedis(client)}
	eng := node.NewEngine(store, "sluicetest:frozen:", discard)
	d, _ := rules.Parse("api.yaml", []byte(outageYAML))
	set, _ := rules.Compile([]*rules.Domain{d})
	eng.Apply(1, set)

	stop := make(chan struct{})
	var samples []sample
	done := make(chan struct{})
	go func() { samples = load(eng, "open", workers, stop); close(done) }()
	time.Sleep(100 * time.Millisecond)
	frozen := time.Now()
	before := store.calls.Load()
	srv.Signal(syscall.SIGSTOP)
	time.Sleep(time.Second)
	reached := store.calls.Load() - before
	close(stop)
	<-done
	srv.Signal(syscall.SIGCONT)

	var during []sample
	for _, s := range samples {
		if s.err != nil || s.code != engine.OK {
			t.Fatalf("fail open while frozen: %+v", s)
		}
		if s.start.After(frozen) {
			during = append(during, s)
		}
	}
	// Calls that reached the frozen store (each waits its 50 ms timeout):
	// the ones made before the breaker opens — it waits for 100 ms without
	// a success (breaker.DefaultQuiet), i.e. up to 3 rounds of timeouts
	// per worker — then one probe per 200 ms cooldown.
	t.Logf("frozen Redis: %d checks, %d reached the store, p99 %v, breaker trips %d", len(during), reached, p99(during), eng.Breaker().Trips())
	if limit := int64(3*workers + 1000/200 + 3); reached > limit {
		t.Errorf("%d calls reached a frozen Redis in 1s, want at most %d", reached, limit)
	}
	if got := p99(during); got > 20*time.Millisecond {
		t.Errorf("p99 check latency with Redis frozen: %v, want the breaker to spare checks the 50ms timeout", got)
	}
}

// countingStore counts the calls that reach the store.
type countingStore struct {
	engine.Store
	calls atomic.Int64
}

func (c *countingStore) Take(ctx context.Context, reqs []limiter.Request) ([]limiter.Decision, error) {
	c.calls.Add(1)
	return c.Store.Take(ctx, reqs)
}
