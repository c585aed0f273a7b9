package node_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/enforcer/node"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
)

// BenchmarkRegionOvershoot measures what a global limit admits per window
// across two regions (each with its own Redis and node, a third Redis the
// global store) under one hot key offered at 3× the limit (1.5× in each
// region) for b.N one-second windows: admitted ÷ limit (p50, p99, max,
// over the windows offered at least 1.5× the limit) and the windows that
// admitted less than min(limit, offered), next to the same load on two
// nodes sharing one Redis ("exact", the baseline). Run it with
// -benchtime 100x for 100 windows:
//
//	go test -run '^$' -bench BenchmarkRegionOvershoot -benchtime 100x ./enforcer/node/
func BenchmarkRegionOvershoot(b *testing.B) {
	const (
		limit = 100           // per second
		rate  = 3 * limit / 2 // per region
	)
	rulesFile := `domain: geo
descriptors:
  - key: hot
    algorithm: ALGO
    scope: SCOPE
    rate_limit: {unit: second, requests_per_unit: 100}
`
	cases := []struct {
		name     string
		algo     string
		scope    string
		shared   bool // both nodes on one Redis: exact
		interval time.Duration
	}{
		{"exact/fixed_window", "fixed_window", "region", true, 0},
		{"global/fixed_window/interval=100ms", "fixed_window", "global", false, 100 * time.Millisecond},
		{"global/fixed_window/interval=20ms", "fixed_window", "global", false, 20 * time.Millisecond},
		{"global/sliding_window_counter/interval=100ms", "sliding_window_counter", "global", false, 100 * time.Millisecond},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			dir := b.TempDir()
			src := strings.NewReplacer("ALGO", c.algo, "SCOPE", c.scope).Replace(rulesFile)
			if err := os.WriteFile(filepath.Join(dir, "geo.yaml"), []byte(src), 0o644); err != nil {
				b.Fatal(err)
			}
			global := testenv.StartRedis(b)
			shared := testenv.StartRedis(b)
			prefix := testenv.KeyPrefix(b)
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			defer func() { cancel(); wg.Wait() }()
			var nodes []*node.Node
			for _, region := range []string{"eu", "us"} {
				url := shared.URL()
				if !c.shared {
					url = testenv.StartRedis(b).URL()
				}
				// A loaded machine must not turn checks into store
				// timeouts (admitted by failure_mode: open): what is
				// measured is the exchange between regions.
				cfg := node.Config{RulesDir: dir, RedisURL: url, KeyPrefix: prefix, NodeID: region, StoreTimeout: 2 * time.Second}
				if !c.shared {
					cfg.Region, cfg.GlobalRedisURL, cfg.GlobalInterval = region, global.URL(), c.interval
				}
				n, err := node.New(cfg)
				if err != nil {
					b.Fatal(err)
				}
				defer n.Close()
				wg.Add(1)
				go func() { defer wg.Done(); _ = n.Run(ctx) }()
				nodes = append(nodes, n)
			}
			for _, n := range nodes {
				for !c.shared && !n.Engine.GlobalUp() {
					time.Sleep(5 * time.Millisecond)
				}
			}
			// Start on a window boundary; run b.N whole windows.
			time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second)))
			first := time.Now().Unix()
			stop := time.Unix(first+int64(b.N), 0)
			var (
				mu       sync.Mutex
				admitted = map[int64]int{}
				offered  = map[int64]int{} // checks sent, by the window they started in
				checks   int
				failed   int
				run      sync.WaitGroup
			)
			b.ResetTimer()
			const workers = 8 // per region
			for _, n := range nodes {
				for w := range workers {
					run.Add(1)
					go func() {
						defer run.Done()
						every := time.Second * workers / rate
						next := time.Now().Add(time.Duration(w) * every / workers)
						for {
							time.Sleep(time.Until(next))
							now := time.Now()
							// A worker that fell behind does not catch up in
							// a burst: the offered rate stays steady.
							if next = next.Add(every); next.Before(now) {
								next = now
							}
							if !now.Before(stop) {
								return
							}
							res, err := n.Engine.Check(context.Background(), engine.Request{Domain: "geo",
								Descriptors: []engine.Descriptor{{Entries: []rules.Entry{{Key: "hot", Value: "k"}}}}})
							// The window Redis counted the check in: its end is
							// ResetAfter away (two windows for a sliding counter,
							// whose counts weigh in the next one too).
							after := time.Now()
							win := now.Unix()
							if err == nil && res.Statuses[0].Limited() {
								end := after.Add(res.Statuses[0].ResetAfter).Round(time.Second).Unix()
								win = end - 1
								if c.algo == "sliding_window_counter" {
									win = end - 2
								}
							}
							mu.Lock()
							checks++
							offered[now.Unix()]++
							switch {
							case err != nil:
								failed++
							case res.Code == engine.OK:
								// Admitted, by Redis or, past a store
								// timeout, by failure_mode: open.
								admitted[win]++
							}
							if res.StoreErr != nil {
								failed++
							}
							mu.Unlock()
						}
					}()
				}
			}
			run.Wait()
			b.StopTimer()
			// A loaded machine may not send the offered rate in every
			// window: only windows offered at least 1.5× the limit say
			// what the limit admits; in every window, fewer admitted than
			// min(limit, offered), less 2 for the checks that straddle a
			// window's end, is under-admission.
			ratios := make([]float64, 0, b.N)
			under := 0
			for s := first; s < first+int64(b.N); s++ {
				if offered[s] >= limit*3/2 {
					ratios = append(ratios, float64(admitted[s])/limit)
				}
				if admitted[s] < min(limit, offered[s])-2 {
					under++
				}
			}
			if len(ratios) == 0 {
				b.Fatalf("no window was offered 1.5× the limit (%d checks in %d windows)", checks, b.N)
			}
			slices.Sort(ratios)
			q := func(p float64) float64 { return ratios[min(len(ratios)-1, int(p*float64(len(ratios))))] }
			b.ReportMetric(q(0.5), "p50_admitted/limit")
			b.ReportMetric(q(0.99), "p99_admitted/limit")
			b.ReportMetric(ratios[len(ratios)-1], "max_admitted/limit")
			b.ReportMetric(ratios[0], "min_admitted/limit")
			b.ReportMetric(float64(checks)/float64(b.N), "checks/window")
			b.ReportMetric(float64(len(ratios)), "saturated_windows")
			b.ReportMetric(float64(under), "under_admitted_windows")
			b.ReportMetric(float64(failed)/float64(b.N), "store_errors/window")
		})
	}
}
