package limiter

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
)

// BenchmarkTake measures Take against the test Redis: "serial" is one caller's
// round-trip latency, the others are throughput with 8 callers per CPU. Run:
//
//	go test -run '^$' -bench BenchmarkTake -benchmem ./enforcer/limiter/
func BenchmarkTake(b *testing.B) {
	// The request-path defaults except the 50 ms timeout: on a loaded CI box
	// a timeout would turn a throughput benchmark into a failure.
	c, err := NewClient(testenv.RedisURL(b), WithTimeout(time.Second))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	prefix := testPrefix(b, c)
	r := NewRedis(c)
	// Huge limits: the benchmark measures the allowed path, which writes.
	limit := func(key string) Request {
		return Request{Key: key, Limit: 1 << 40, Period: time.Second, Hits: 1}
	}

	b.Run("serial", func(b *testing.B) {
		reqs := []Request{limit(Key(prefix, "bench", []rules.Entry{{Key: "k", Value: "serial"}}))}
		ctx := context.Background()
		b.ReportAllocs()
		for b.Loop() {
			if _, err := r.Take(ctx, reqs); err != nil {
				b.Fatal(err)
			}
		}
	})

	b.Run("hot_key", func(b *testing.B) {
		reqs := []Request{limit(Key(prefix, "bench", []rules.Entry{{Key: "k", Value: "hot"}}))}
		runParallel(b, r, func(int64) []Request { return reqs })
	})

	b.Run("many_keys", func(b *testing.B) {
		const n = 10_000
		keys := make([]Request, n)
		for i := range keys {
			keys[i] = limit(Key(prefix, "bench", []rules.Entry{{Key: "k", Value: strconv.Itoa(i)}}))
		}
		runParallel(b, r, func(i int64) []Request { return keys[i%n : i%n+1] })
	})

	b.Run("three_limits", func(b *testing.B) {
		// A typical hierarchical request: per key, per key and route, global.
		reqs := []Request{
			limit(Key(prefix, "bench", []rules.Entry{{Key: "api_key", Value: "k1"}})),
			limit(Key(prefix, "bench", []rules.Entry{{Key: "api_key", Value: "k1"}, {Key: "route", Value: "/search"}})),
			limit(Key(prefix, "bench", []rules.Entry{{Key: "global", Value: ""}})),
		}
		runParallel(b, r, func(int64) []Request { return reqs })
	})
}

func runParallel(b *testing.B, r *Redis, next func(i int64) []Request) {
	var seq atomic.Int64
	b.ReportAllocs()
	// Many requests in flight, as on an enforcer: 8 goroutines per CPU.
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			if _, err := r.Take(ctx, next(seq.Add(1))); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
