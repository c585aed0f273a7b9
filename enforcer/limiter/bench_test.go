package limiter

import (
	"context"
	"encoding/csv"
	"fmt"
	"net/url"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
)

// benchCallers is the number of concurrent callers of every benchmark.
const benchCallers = 64

// BenchmarkDecisions measures decisions per second and latency percentiles
// with 64 concurrent callers, per algorithm, on one hot key and spread over
// 100,000 keys, three ways: "direct" (Redis.Take, one script call and round
// trip per Take), "pipelined" (Batcher, one script call per Take, batches in
// one pipeline) and "coalesced" (Batcher, one script call per batch). Every
// request is allowed (the write path). Run with the baselines:
//
//	go test -run '^$' -bench 'BenchmarkDecisions|BenchmarkRedisBaseline' -benchtime 30000x -count 3 ./enforcer/limiter/
func BenchmarkDecisions(b *testing.B) {
	c, err := NewClient(testenv.RedisURL(b), WithTimeout(time.Second), WithDialTimeout(time.Second), WithPoolSize(benchCallers))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	prefix := testPrefix(b, c)
	r := NewRedis(c)
	stores := []struct {
		name  string
		store Store
	}{
		{"direct", r},
		{"pipelined", NewBatcher(r, BatchOptions{NoCoalescing: true, OverLimitEntries: -1})},
		{"coalesced", NewBatcher(r, BatchOptions{OverLimitEntries: -1})},
	}
	for _, keys := range []struct {
		name string
		n    int
	}{{"hot", 1}, {"100k", 100_000}} {
		for _, alg := range allAlgorithms {
			// Limits no benchmark reaches. The hot key needs a huge one; the
			// 100k keys get a realistic per-client limit (each sees less than
			// one hit per run), so their state lives as long as a real limit's
			// instead of expiring within a millisecond (1<<40 per second
			// refills a token bucket at once) and being created anew each time.
			limit, period := int64(1<<40), time.Second
			if keys.n > 1 {
				limit, period = 6000, time.Minute
			}
			reqs := make([]Request, keys.n)
			for i := range reqs {
				reqs[i] = Request{
					Key:       Key(prefix, "bench", []rules.Entry{{Key: "k", Value: strconv.Itoa(i)}}),
					Algorithm: alg, Limit: limit, Period: period, Hits: 1,
				}
			}
			for _, s := range stores {
				b.Run(fmt.Sprintf("%s/%s/%s", keys.name, alg, s.name), func(b *testing.B) {
					runDecisions(b, s.store, reqs)
				})
			}
		}
	}
}

func runDecisions(b *testing.B, s Store, reqs []Request) {
	var seq atomic.Int64
	var mu sync.Mutex
	lat := make([]time.Duration, 0, b.N)
	b.SetParallelism(max(1, benchCallers/runtime.GOMAXPROCS(0)))
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		mine := make([]time.Duration, 0, 1024)
		one := make([]Request, 1)
		for pb.Next() {
			one[0] = reqs[int(seq.Add(1))%len(reqs)]
			t := time.Now()
			ds, err := s.Take(ctx, one)
			mine = append(mine, time.Since(t))
			if err != nil || !ds[0].Allowed {
				b.Errorf("Take: %v %v", ds, err)
				return
			}
		}
		mu.Lock()
		lat = append(lat, mine...)
		mu.Unlock()
	})
	elapsed := time.Since(start)
	b.StopTimer()
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	b.ReportMetric(float64(len(lat))/elapsed.Seconds(), "decisions/s")
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

// BenchmarkRedisBaseline runs redis-benchmark against the same Redis: INCR
// and an EVALSHA of a trivial script (`return 1`), 64 clients, no pipelining,
// 200,000 requests each. It runs once whatever b.N is; its ns/op means
// nothing, its metrics are redis-benchmark's.
func BenchmarkRedisBaseline(b *testing.B) {
	if _, err := exec.LookPath("redis-benchmark"); err != nil {
		b.Skipf("redis-benchmark not installed: %v", err)
	}
	raw := testenv.RedisURL(b)
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		b.Skipf("REDIS_URL %q is not a single-server URL", raw)
	}
	c, err := NewClient(raw, WithTimeout(time.Second))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	sha, err := c.ScriptLoad(context.Background(), "return 1").Result()
	if err != nil {
		b.Fatal(err)
	}
	common := []string{"-h", u.Hostname(), "-p", u.Port(), "-c", strconv.Itoa(benchCallers), "-n", "200000", "--csv"}
	for _, t := range []struct {
		name string
		args []string
	}{
		{"incr", []string{"-t", "incr"}},
		{"evalsha_return_1", []string{"EVALSHA", sha, "0"}},
	} {
		b.Run(t.name, func(b *testing.B) {
			out, err := exec.Command("redis-benchmark", append(slices.Clone(common), t.args...)...).Output()
			if err != nil {
				b.Fatalf("redis-benchmark: %v\n%s", err, out)
			}
			rows, err := csv.NewReader(strings.NewReader(string(out))).ReadAll()
			if err != nil || len(rows) < 2 || len(rows[1]) < 7 {
				b.Fatalf("redis-benchmark output %q: %v", out, err)
			}
			// "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
			num := func(i int) float64 {
				f, err := strconv.ParseFloat(rows[1][i], 64)
				if err != nil {
					b.Fatalf("column %d of %q: %v", i, rows[1], err)
				}
				return f
			}
			b.ReportMetric(0, "ns/op")
			b.ReportMetric(num(1), "ops/s")
			b.ReportMetric(num(4)*1000, "p50-µs")
			b.ReportMetric(num(6)*1000, "p99-µs")
		})
	}
}

// BenchmarkClusterTakes measures Takes on a real three-master Redis Cluster
// with 64 concurrent callers: of one limit (one slot: one script call), and
// of a per-user and a global limit on different slots (reserve on the
// first, then on the other at its time: two round trips), direct and
// through a Batcher. Every request is allowed.
//
//	go test -run '^$' -bench BenchmarkClusterTakes -benchtime 20000x -count 3 ./enforcer/limiter/
func BenchmarkClusterTakes(b *testing.B) {
	c, err := NewClient(startCluster(b), WithTimeout(time.Second), WithDialTimeout(time.Second), WithPoolSize(benchCallers))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	r := NewRedis(c)
	key := func(k, v string) string { return Key("bench:", "d", []rules.Entry{{Key: k, Value: v}}) }
	global := Request{Key: key("global", "g"), Limit: 1 << 40, Period: time.Second, Hits: 1}
	for _, s := range []struct {
		name  string
		store Store
	}{{"direct", r}, {"batcher", NewBatcher(r, BatchOptions{OverLimitEntries: -1, Timeout: time.Second})}} {
		for _, slots := range []int{1, 2} {
			b.Run(fmt.Sprintf("%dslot/%s", slots, s.name), func(b *testing.B) {
				var seq atomic.Int64
				var mu sync.Mutex
				lat := make([]time.Duration, 0, b.N)
				b.SetParallelism(max(1, benchCallers/runtime.GOMAXPROCS(0)))
				b.ResetTimer()
				start := time.Now()
				b.RunParallel(func(pb *testing.PB) {
					mine := make([]time.Duration, 0, 1024)
					for pb.Next() {
						user := Request{Key: key("user", strconv.Itoa(int(seq.Add(1))%10_000)), Limit: 6000, Period: time.Minute, Hits: 1}
						reqs := []Request{user}
						if slots == 2 {
							reqs = append(reqs, global)
						}
						t0 := time.Now()
						ds, err := s.store.Take(context.Background(), reqs)
						mine = append(mine, time.Since(t0))
						if err != nil || !allowed(ds) {
							b.Errorf("Take: %v %v", ds, err)
							return
						}
					}
					mu.Lock()
					lat = append(lat, mine...)
					mu.Unlock()
				})
				elapsed := time.Since(start)
				b.StopTimer()
				if len(lat) == 0 {
					return
				}
				slices.Sort(lat)
				b.ReportMetric(float64(len(lat))/elapsed.Seconds(), "takes/s")
				b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
				b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
			})
		}
	}
}
