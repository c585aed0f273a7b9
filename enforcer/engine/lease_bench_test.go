package engine

import (
	"bufio"
	"context"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/bench"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
)

// redisCPU returns the CPU seconds (user + system) the Redis server at url
// has used, from INFO cpu.
func redisCPU(b *testing.B, c *redis.Client) float64 {
	b.Helper()
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		if ok && (k == "used_cpu_user" || k == "used_cpu_sys") {
			f, _ := strconv.ParseFloat(v, 64)
			total += f
		}
	}
	return total
}

// BenchmarkLeaseHotKey: one hot key at 256 concurrent callers through an
// engine as a node builds it (Batcher, breaker), with leases off (the
// baseline: every check goes to Redis, coalesced) and on, on a private
// Redis whose CPU time (INFO cpu) is divided by the checks, as is the
// process's (the engine and the callers: node-cpu-µs/check). The limit
// (10^8 per second) is never reached.
func BenchmarkLeaseHotKey(b *testing.B) {
	srv := testenv.StartRedis(b)
	info := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	b.Cleanup(func() { info.Close() })
	for _, alg := range []rules.Algorithm{rules.TokenBucket, rules.FixedWindow} {
		for _, on := range []bool{false, true} {
			name := string(alg) + "/leases=off"
			if on {
				name = string(alg) + "/leases=on"
			}
			b.Run(name, func(b *testing.B) {
				src := "domain: api\ndescriptors:\n  - key: hot\n    algorithm: " + string(alg) +
					"\n    rate_limit: {unit: second, requests_per_unit: 100000000}\n"
				if on {
					src += "    lease: true\n"
				}
				d, err := rules.Parse("bench.yaml", []byte(src))
				if err != nil {
					b.Fatal(err)
				}
				set, err := rules.Compile([]*rules.Domain{d})
				if err != nil {
					b.Fatal(err)
				}
				e := leaseEngine(b, srv.URL(), testenv.KeyPrefix(b), LeaseOptions{MinRate: 100})
				if err := e.Apply(1, set); err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { e.Close(context.Background()) })
				req := hot("x")
				var failed, refused atomic.Int64
				cpu0, node0 := redisCPU(b, info), bench.ProcessCPU()
				start := time.Now()
				b.ReportAllocs()
				b.SetParallelism(128) // 256 callers at GOMAXPROCS 2
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						res, err := e.Check(context.Background(), req)
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
					// The benchmark's own loop included: an upper bound.
					b.ReportMetric(float64(node.Microseconds())/float64(b.N), "node-cpu-µs/check")
				}
				b.ReportMetric(cpu*1e6/float64(b.N), "redis-cpu-µs/check")
				b.ReportMetric(float64(failed.Load())/float64(b.N), "storefail/op")
				if refused.Load() > 0 {
					b.Errorf("%d checks refused under a limit never reached", refused.Load())
				}
			})
		}
	}
}

// BenchmarkLeaseTwoNodes: two engines (nodes) on one fixed_window limit of
// 20,000 per second, 128 callers each, for 11 s. Each admitted check is
// put in the window it counted in (the Redis window's end: the first whole
// second at or after the time before the check plus the answer's ResetAfter); the first and last, partial, windows
// are dropped, and min and max report the least and the most one full
// window admitted, over the limit (1 is exact; above 1 would be
// over-admission; below 1, units stranded in leases or lost at the window's
// end). Leases off is the baseline, decided request by request in Redis.
func BenchmarkLeaseTwoNodes(b *testing.B) {
	const limit = 20000
	url := testenv.RedisURL(b)
	for _, on := range []bool{false, true} {
		name := "leases=off"
		if on {
			name = "leases=on"
		}
		b.Run(name, func(b *testing.B) {
			src := "domain: api\ndescriptors:\n  - key: hot\n    algorithm: fixed_window\n    rate_limit: {unit: second, requests_per_unit: " + strconv.Itoa(limit) + "}\n"
			if on {
				src += "    lease: true\n"
			}
			d, err := rules.Parse("bench.yaml", []byte(src))
			if err != nil {
				b.Fatal(err)
			}
			set, err := rules.Compile([]*rules.Domain{d})
			if err != nil {
				b.Fatal(err)
			}
			for range b.N {
				prefix := testenv.KeyPrefix(b) + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"
				var engines []*Engine
				for range 2 {
					e := leaseEngine(b, url, prefix, LeaseOptions{MinRate: 100})
					e.SetNodeCount(2)
					if err := e.Apply(1, set); err != nil {
						b.Fatal(err)
					}
					engines = append(engines, e)
				}
				stop := time.Now().Add(11 * time.Second)
				var (
					checks, failed atomic.Int64
					mu             sync.Mutex
					windows        = map[int64]int64{} // window end (s) → admitted
					wg             sync.WaitGroup
				)
				for _, e := range engines {
					for range 128 {
						wg.Add(1)
						go func() {
							defer wg.Done()
							req := hot("x")
							for before := time.Now(); before.Before(stop); before = time.Now() {
								res, err := e.Check(context.Background(), req)
								if err != nil {
									b.Error(err)
									return
								}
								checks.Add(1)
								switch {
								case res.StoreErr != nil:
									failed.Add(1)
								case res.Code == OK:
									// The decision was made at some t ≥ before,
									// and t + ResetAfter is the window's end (a
									// whole second) or a little before it.
									end := (before.Add(res.Statuses[0].ResetAfter).UnixNano() + 1e9 - 1) / 1e9
									mu.Lock()
									windows[end]++
									mu.Unlock()
								}
							}
						}()
					}
				}
				wg.Wait()
				for _, e := range engines {
					e.Close(context.Background())
				}
				ends := make([]int64, 0, len(windows))
				for end := range windows {
					ends = append(ends, end)
				}
				slices.Sort(ends)
				lo, hi, full, total := math.Inf(1), 0.0, 0, int64(0)
				for _, end := range ends[1 : len(ends)-1] {
					r := float64(windows[end]) / limit
					lo, hi, full, total = min(lo, r), max(hi, r), full+1, total+windows[end]
				}
				b.ReportMetric(float64(total)/float64(full*limit), "total-admitted/limit")
				b.ReportMetric(lo, "min-admitted/limit")
				b.ReportMetric(hi, "max-admitted/limit")
				b.ReportMetric(float64(full), "windows")
				b.ReportMetric((hi-1)*limit, "max-over-limit")
				b.ReportMetric((1-lo)*limit, "max-under-limit")
				b.ReportMetric(float64(checks.Load())/11, "checks/s")
				b.ReportMetric(float64(failed.Load()), "storefail")
			}
		})
	}
}
