package engine

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/bench"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
)

// BenchmarkAsyncOvershoot measures what consistency: async admits per
// window of a fixed_window limit on two nodes sharing one hot value at
// 1,000 checks/s in all (demand 5/3 of the limit), as admitted ÷ limit
// over every full window: p50, p99, min and max, beside consistency:
// exact on another value in the same run (its spread is the measurement's:
// windows here are the node's clock, Redis counts on its own). A window
// whose callers, stalled by a loaded machine, asked for less than the
// limit counts as admitted ÷ asked (1 when all of it was admitted), and
// the windows short of demand are reported (short). Run with
// -benchtime=1x: one iteration is the whole run (windows × period).
func BenchmarkAsyncOvershoot(b *testing.B) {
	for _, c := range []struct {
		interval, period time.Duration
		limit, windows   int
	}{
		{100 * time.Millisecond, time.Second, 600, 100},
	} {
		b.Run(fmt.Sprintf("interval=%v/window=%v", c.interval, c.period), func(b *testing.B) {
			for range b.N {
				async, exact, short := overshoot(b, c.interval, c.period, c.limit, c.windows)
				report(b, "async", async)
				report(b, "exact", exact)
				b.ReportMetric(float64(short), "short")
			}
		})
	}
}

func report(b *testing.B, name string, r []float64) {
	slices.Sort(r)
	q := func(p float64) float64 { return r[min(int(p*float64(len(r))), len(r)-1)] }
	b.ReportMetric(q(0.5), name+"_p50")
	b.ReportMetric(q(0.99), name+"_p99")
	b.ReportMetric(r[len(r)-1], name+"_max")
	b.ReportMetric(r[0], name+"_min")
}

// overshoot runs the two-node load and returns admitted ÷ limit per full
// window (÷ asked when less was asked), async and exact, and how many
// windows were short of demand.
func overshoot(b *testing.B, interval, period time.Duration, limit, windows int) (async, exact []float64, short int) {
	url := testenv.RedisURL(b)
	prefix := testenv.KeyPrefix(b)
	src := fmt.Sprintf(`domain: api
descriptors:
  - key: hot
    algorithm: fixed_window
    rate_limit: {unit: second, requests_per_unit: %d}
    consistency: async
  - key: exact
    algorithm: fixed_window
    rate_limit: {unit: second, requests_per_unit: %d}
`, limit, limit)
	d, err := rules.Parse("o.yaml", []byte(src))
	if err != nil {
		b.Fatal(err)
	}
	set, err := rules.Compile([]*rules.Domain{d})
	if err != nil {
		b.Fatal(err)
	}
	// Any window, even one the rules cannot say (under a second): the
	// compiled limits' period is what the engine counts with.
	for _, key := range []string{"hot", "exact"} {
		set.Match("api", []rules.Entry{{Key: key, Value: "v"}}).Period = period
	}
	engines := []*Engine{
		asyncEngine(b, url, prefix, AsyncOptions{Interval: interval}, set, 2),
		asyncEngine(b, url, prefix, AsyncOptions{Interval: interval}, set, 2),
	}
	run := time.Duration(windows+1) * period
	var (
		mu    sync.Mutex
		times = map[string][]time.Time{}
		asked = map[string][]time.Time{}
		wg    sync.WaitGroup
	)
	start := time.Now()
	every := 4 * time.Millisecond // 250/s per caller, 2 callers per node and key
	for _, e := range engines {
		for _, key := range []string{"hot", "exact"} {
			for c := range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					req := Request{Domain: "api", Descriptors: []Descriptor{{Entries: []rules.Entry{{Key: key, Value: "v"}}}}}
					next := start.Add(time.Duration(c) * every / 2)
					for {
						if w := time.Until(next); w > 0 {
							time.Sleep(w)
						}
						now := time.Now()
						if now.Sub(start) >= run {
							return
						}
						res, err := e.Check(context.Background(), req)
						mu.Lock()
						asked[key] = append(asked[key], now)
						if err == nil && res.StoreErr == nil && res.Code == OK {
							times[key] = append(times[key], now)
						}
						mu.Unlock()
						next = next.Add(every)
					}
				}()
			}
		}
	}
	wg.Wait()
	end := time.Now()
	ratios := func(key string) []float64 {
		var r []float64
		want := perWindow(asked[key], period, start, end)
		for i, n := range perWindow(times[key], period, start, end) {
			if want[i] < limit {
				short++
				r = append(r, float64(n)/float64(want[i]))
				continue
			}
			r = append(r, float64(n)/float64(limit))
		}
		return r
	}
	return ratios("hot"), ratios("exact"), short
}

// BenchmarkAsyncKeys: 256 concurrent callers through an engine as a node
// builds it (Batcher, breaker) on one key, 10,000 keys and 100,000 keys
// (as many as a node tracks by default) of a limit never reached (10^8 per
// second), consistency exact (the baseline: every check to Redis,
// coalesced) and async, on a private Redis whose CPU time (INFO cpu) is
// divided by the checks, as is the process's (engine and callers:
// node-cpu-µs/check). Every key is checked once before the timing starts.
// A far key holds its hits for up to 10 s (AsyncOptions.Hold): runs
// shorter than that see fewer flushes than a steady load does, so the
// figures in BENCHMARKS.md come from -benchtime 30s as well.
func BenchmarkAsyncKeys(b *testing.B) {
	srv := testenv.StartRedis(b)
	info := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	b.Cleanup(func() { info.Close() })
	for _, keys := range []int{1, 10_000, 100_000} {
		for _, consistency := range []string{"exact", "async"} {
			b.Run(fmt.Sprintf("keys=%d/%s", keys, consistency), func(b *testing.B) {
				src := "domain: api\ndescriptors:\n  - key: hot\n    algorithm: fixed_window\n" +
					"    rate_limit: {unit: second, requests_per_unit: 100000000}\n    consistency: " + consistency + "\n"
				d, err := rules.Parse("bench.yaml", []byte(src))
				if err != nil {
					b.Fatal(err)
				}
				set, err := rules.Compile([]*rules.Domain{d})
				if err != nil {
					b.Fatal(err)
				}
				e := asyncEngine(b, srv.URL(), testenv.KeyPrefix(b), AsyncOptions{}, set, 1)
				reqs := make([]Request, keys)
				for i := range reqs {
					reqs[i] = hot(fmt.Sprint("k", i))
				}
				// Every key checked once before timing: a key's first check is
				// exact in both modes (async has no view of it yet).
				var wg sync.WaitGroup
				for w := range 16 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for i := w; i < keys; i += 16 {
							_, _ = e.Check(context.Background(), reqs[i])
						}
					}()
				}
				wg.Wait()
				local0 := e.AsyncStats().Local
				var failed, refused, seq atomic.Int64
				cpu0, node0 := redisCPU(b, info), bench.ProcessCPU()
				start := time.Now()
				b.ReportAllocs()
				b.SetParallelism(128) // 256 callers at GOMAXPROCS 2
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						res, err := e.Check(context.Background(), reqs[int(seq.Add(1))%keys])
						switch {
						case err != nil:
							b.Error(err)
							return
						case res.StoreErr != nil:
							failed.Add(1)
						case res.Code != OK:
							refused.Add(1)
						}
					}
				})
				b.StopTimer()
				secs := time.Since(start).Seconds()
				cpu, node := redisCPU(b, info)-cpu0, bench.ProcessCPU()-node0
				b.ReportMetric(float64(b.N)/secs, "checks/s")
				if node0 >= 0 {
					b.ReportMetric(float64(node.Microseconds())/float64(b.N), "node-cpu-µs/check")
				}
				b.ReportMetric(cpu*1e6/float64(b.N), "redis-cpu-µs/check")
				b.ReportMetric(float64(failed.Load())/float64(b.N), "storefail/op")
				st := e.AsyncStats()
				b.ReportMetric(float64(st.Local-local0)/float64(b.N), "local/op")
				b.ReportMetric(float64(st.FlushErrors), "flush-errors")
				if refused.Load() > 0 {
					b.Errorf("%d checks refused under a limit never reached", refused.Load())
				}
			})
		}
	}
}
