package node_test

import (
	"context"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/enforcer/node"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
)

// regionInterval is the tests' exchange interval with the global store,
// short so that the tests are.
const regionInterval = 20 * time.Millisecond

const regionRules = `domain: geo
descriptors:
  - key: global
    algorithm: fixed_window
    scope: global
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: regional
    algorithm: fixed_window
    rate_limit: {unit: second, requests_per_unit: 50}
  - key: quota
    algorithm: fixed_window
    scope: global
    rate_limit: {unit: second, unit_multiplier: 10, requests_per_unit: 100}
  - key: sliding
    algorithm: sliding_window_counter
    scope: global
    rate_limit: {unit: second, requests_per_unit: 100}
`

// world is two regions, each with its own Redis and one enforcer node (in
// file mode, with the same rules), and a third Redis as the global store.
type world struct {
	global  *testenv.RedisServer
	nodes   map[string]*node.Node
	metrics map[string]*prometheus.Registry
}

func startWorld(t *testing.T) *world {
	t.Helper()
	dir := t.TempDir()
	write(t, filepath.Join(dir, "geo.yaml"), regionRules)
	w := &world{global: testenv.StartRedis(t), nodes: map[string]*node.Node{}, metrics: map[string]*prometheus.Registry{}}
	prefix := testenv.KeyPrefix(t)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	for _, region := range []string{"eu", "us"} {
		rdb := testenv.StartRedis(t)
		reg := prometheus.NewRegistry()
		// Checks may wait 2 s on Redis, so a loaded machine never makes
		// them fail open.
		n, err := node.New(node.Config{RulesDir: dir, RedisURL: rdb.URL(), KeyPrefix: prefix, NodeID: region + "-1",
			Region: region, GlobalRedisURL: w.global.URL(), GlobalInterval: regionInterval, Registry: reg, StoreTimeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		wg.Add(1)
		go func() { defer wg.Done(); _ = n.Run(ctx) }()
		w.nodes[region] = n
		w.metrics[region] = reg
	}
	w.waitUp(t, true)
	return w
}

// waitUp waits until every node's view of the global store is (or is
// not) current.
func (w *world) waitUp(t *testing.T, up bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for _, n := range w.nodes {
		for n.Engine.GlobalUp() != up || (w.gauge(t, n, "sluice_enforcer_global_store_up") == 1) != up {
			if time.Now().After(deadline) {
				t.Fatalf("global store up: %t, want %t", n.Engine.GlobalUp(), up)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// gauge reads one of n's gauges.
func (w *world) gauge(t *testing.T, n *node.Node, name string) float64 {
	t.Helper()
	for region, m := range w.nodes {
		if m != n {
			continue
		}
		mfs, err := w.metrics[region].Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == name {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
	}
	t.Fatalf("no gauge %s", name)
	return 0
}

// sync runs one exchange on every node, so each one's view holds what the
// others sent before.
func (w *world) sync(t *testing.T) {
	t.Helper()
	for range 2 { // the second round reads what every node sent in the first
		for region, n := range w.nodes {
			if err := n.Engine.SyncRegions(context.Background()); err != nil {
				t.Fatalf("sync %s: %v", region, err)
			}
		}
	}
}

func check(t *testing.T, n *node.Node, key, value string) bool {
	t.Helper()
	res, err := n.Engine.Check(context.Background(), engine.Request{Domain: "geo",
		Descriptors: []engine.Descriptor{{Entries: []rules.Entry{{Key: key, Value: value}}}}})
	if err != nil {
		t.Fatal(err)
	}
	if res.StoreErr != nil {
		t.Fatalf("store error: %v", res.StoreErr)
	}
	return res.Code == engine.OK
}

// admit sends count checks of key=value to n and returns how many it
// admitted.
func admit(t *testing.T, n *node.Node, key, value string, count int) int {
	t.Helper()
	ok := 0
	for range count {
		if check(t, n, key, value) {
			ok++
		}
	}
	return ok
}

// touch checks key=value on n without consuming (hits 0), so that n
// tracks the key's window and reads the other regions' counts of it from
// the next exchange on; a node's first checks of a key are decided before
// it has read them (see engine's "Regions").
func touch(t *testing.T, n *node.Node, key, value string) {
	t.Helper()
	zero := uint64(0)
	if _, err := n.Engine.Check(context.Background(), engine.Request{Domain: "geo",
		Descriptors: []engine.Descriptor{{Entries: []rules.Entry{{Key: key, Value: value}}, Hits: &zero}}}); err != nil {
		t.Fatal(err)
	}
}

// waitWindow waits until the current window of period has at least left
// to go, so a test's steps all fall in one window.
func waitWindow(period, left time.Duration) {
	for time.Until(time.Now().Truncate(period).Add(period)) < left {
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRegionScopedLimitHoldsPerRegion: a limit without scope: global is
// counted in each region on its own, each admitting the whole limit.
func TestRegionScopedLimitHoldsPerRegion(t *testing.T) {
	t.Parallel()
	w := startWorld(t)
	waitWindow(time.Second, 600*time.Millisecond)
	eu := admit(t, w.nodes["eu"], "regional", "k", 70)
	w.sync(t)
	us := admit(t, w.nodes["us"], "regional", "k", 70)
	if eu != 50 || us != 50 {
		t.Fatalf("admitted eu %d, us %d: want 50 in each region", eu, us)
	}
}

// TestGlobalLimitSequential: what one region admitted of a global limit is
// taken off what the other may admit, once they have exchanged counts, for
// fixed_window and sliding_window_counter.
func TestGlobalLimitSequential(t *testing.T) {
	t.Parallel()
	w := startWorld(t)
	waitWindow(10*time.Second, 3*time.Second)
	touch(t, w.nodes["us"], "quota", "q")
	if got := admit(t, w.nodes["eu"], "quota", "q", 70); got != 70 {
		t.Fatalf("eu admitted %d of 70, want all (limit 100)", got)
	}
	w.sync(t)
	if got := admit(t, w.nodes["us"], "quota", "q", 70); got != 30 {
		t.Fatalf("us admitted %d after eu's 70, want 30 (limit 100)", got)
	}
	w.sync(t)
	if got := admit(t, w.nodes["eu"], "quota", "q", 10); got != 0 {
		t.Fatalf("eu admitted %d once the limit is used up, want 0", got)
	}

	// A sliding window weighs the other region's previous window as its
	// own: eu fills one window, and in the next us may admit what the
	// weighted estimate leaves.
	waitWindow(time.Second, 700*time.Millisecond)
	touch(t, w.nodes["us"], "sliding", "s")
	if got := admit(t, w.nodes["eu"], "sliding", "s", 100); got != 100 {
		t.Fatalf("sliding: eu admitted %d of 100, want all", got)
	}
	w.sync(t)
	if got := admit(t, w.nodes["us"], "sliding", "s", 10); got != 0 {
		t.Fatalf("sliding: us admitted %d in the window eu filled, want 0", got)
	}
	// Half of the next window: eu's 100 weigh 50.
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(1500 * time.Millisecond)))
	w.sync(t)
	got := admit(t, w.nodes["us"], "sliding", "s", 100)
	if got < 40 || got > 60 {
		t.Fatalf("sliding: us admitted %d half a window after eu's 100, want about 50", got)
	}
}

// TestGlobalLimitHoldsAcrossRegions: both regions send a hot key of a
// global limit at once, each above the limit; every window admits at least
// min(limit, checks sent in it) and at most the stated bound,
// limit + Σ λ_r·D with λ_r a region's check rate and D = 2·(interval + a
// round's time), a round allowed 15 ms on a loaded machine. Serial in
// spirit: it paces checks for 3 s.
func TestGlobalLimitHoldsAcrossRegions(t *testing.T) {
	w := startWorld(t)
	const limit = 100
	waitWindow(time.Second, 990*time.Millisecond)
	start := time.Now()
	stop := start.Add(3 * time.Second)
	var (
		mu       sync.Mutex
		admitted = map[int64]int{} // window (Unix s) → admitted
		offered  = map[int64]int{} // window (Unix s) → checks
		sent     atomic.Int64
		wg       sync.WaitGroup
	)
	for _, n := range w.nodes {
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(stop) {
					at := time.Now().Unix()
					res, err := n.Engine.Check(context.Background(), engine.Request{Domain: "geo",
						Descriptors: []engine.Descriptor{{Entries: []rules.Entry{{Key: "global", Value: "hot"}}}}})
					if err != nil || res.StoreErr != nil {
						t.Errorf("check: %v %v", err, res.StoreErr)
						return
					}
					sent.Add(1)
					mu.Lock()
					offered[at]++
					if res.Code == engine.OK {
						admitted[at]++
					}
					mu.Unlock()
					time.Sleep(10 * time.Millisecond)
				}
			}()
		}
	}
	wg.Wait()
	rate := float64(sent.Load()) / time.Since(start).Seconds() // both regions
	d := (2 * (regionInterval + 15*time.Millisecond)).Seconds()
	bound := limit + int(rate*d+0.5)
	first := start.Unix()
	for s := first; s < first+3; s++ {
		got, low := admitted[s], min(limit, offered[s])-2 // a check started just before a window ends may count in the next
		t.Logf("window %d: admitted %d of %d (limit %d, bound %d, %.0f checks/s)", s-first, got, offered[s], limit, bound, rate)
		if got < low || got > bound {
			t.Errorf("window %d admitted %d, want [%d, %d]", s-first, got, low, bound)
		}
	}
}

// TestGlobalStoreDownAndBack: with the global store down, each region
// enforces its share of a global limit (limit / 2 regions); when it is
// back, what each admitted meanwhile reaches the other and they converge
// on the limit.
func TestGlobalStoreDownAndBack(t *testing.T) {
	t.Parallel()
	w := startWorld(t)
	eu, us := w.nodes["eu"], w.nodes["us"]
	waitWindow(10*time.Second, 4*time.Second)
	// Both regions show up in the global store (as a console's region
	// count would tell them).
	admit(t, eu, "quota", "warm", 1)
	admit(t, us, "quota", "warm", 1)
	w.sync(t)
	if eu.Engine.RegionCount() != 2 || us.Engine.RegionCount() != 2 || w.gauge(t, eu, "sluice_enforcer_regions") != 2 {
		t.Fatalf("region counts %d, %d, want 2", eu.Engine.RegionCount(), us.Engine.RegionCount())
	}

	w.global.Stop()
	w.waitUp(t, false)
	if got := admit(t, eu, "quota", "q", 80); got != 50 {
		t.Fatalf("global store down: eu admitted %d of 80, want its share 50", got)
	}
	if got := admit(t, us, "quota", "q", 30); got != 30 {
		t.Fatalf("global store down: us admitted %d of 30, want all (share 50)", got)
	}

	w.global.Restart()
	w.waitUp(t, true)
	w.sync(t)
	// The limit is 100 and 80 were admitted: eu may take the 20 us left.
	if got := admit(t, eu, "quota", "q", 40); got != 20 {
		t.Fatalf("global store back: eu admitted %d more, want 20", got)
	}
	w.sync(t)
	if got := admit(t, us, "quota", "q", 40); got != 0 {
		t.Fatalf("global store back: us admitted %d more, want 0", got)
	}
}
