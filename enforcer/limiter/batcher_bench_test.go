package limiter

import (
	"context"
	"runtime"
	"runtime/metrics"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
)

// BenchmarkBatcherHandOff: 64 and 256 callers taking one hot key through a
// Batcher, the node's path to Redis without a transport, reporting
// decisions/s and goroutine schedulings per Take: how often a goroutine was
// made to run (callers woken when their batch returns, and whatever
// goroutines carry a batch), from runtime/metrics' /sched/latencies, which
// records one transition to running in 8 (the runtime's gTrackingPeriod),
// scaled by 8. Run with the CPU time of the process:
//
//	go test -c -o /tmp/limiter.test ./enforcer/limiter/ && cd enforcer/limiter
//	/usr/bin/time -f '%U %S' /tmp/limiter.test -test.run '^$' -test.bench 'BenchmarkBatcherHandOff/64$' -test.benchtime 60000x
func BenchmarkBatcherHandOff(b *testing.B) {
	c, err := NewClient(testenv.RedisURL(b), WithTimeout(time.Second), WithDialTimeout(time.Second))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	prefix := testPrefix(b, c)
	bt := NewBatcher(NewRedis(c), BatchOptions{OverLimitEntries: -1})
	req := Request{Key: testKey(prefix, "hot"), Algorithm: rules.TokenBucket, Limit: 1 << 40, Period: time.Second, Hits: 1}
	for _, callers := range []int{64, 256} {
		b.Run(strconv.Itoa(callers), func(b *testing.B) {
			b.SetParallelism(max(1, callers/runtime.GOMAXPROCS(0)))
			b.ReportAllocs()
			s0 := schedulings()
			start := time.Now()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				one := []Request{req}
				for pb.Next() {
					ds, err := bt.Take(context.Background(), one)
					if err != nil || !ds[0].Allowed {
						b.Errorf("Take: %v %v", ds, err)
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "decisions/s")
			b.ReportMetric((schedulings()-s0)/float64(b.N), "schedulings/op")
		})
	}
}

// schedulings estimates how many times goroutines have been made to run in
// this process (see BenchmarkBatcherHandOff).
func schedulings() float64 {
	s := []metrics.Sample{{Name: "/sched/latencies:seconds"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindFloat64Histogram {
		return 0
	}
	var n uint64
	for _, c := range s[0].Value.Float64Histogram().Counts {
		n += c
	}
	return 8 * float64(n)
}
