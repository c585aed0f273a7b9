package engine_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/sluicehq/sluice/enforcer/breaker"
	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/enforcer/limiter"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
)

// BenchmarkCheck measures one check through the engine (matching, one
// Redis round trip, the breaker, the per-rule stats) on a hot key and on
// 10k keys.
func BenchmarkCheck(b *testing.B) { benchmarkCheck(b) }

// BenchmarkCheckWithoutStats is BenchmarkCheck without the per-rule stats
// the node reports to the console: compare the two in one run.
func BenchmarkCheckWithoutStats(b *testing.B) { benchmarkCheck(b, engine.WithoutStats()) }

func benchmarkCheck(b *testing.B, opts ...engine.Option) {
	client, err := limiter.NewClient(testenv.RedisURL(b))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { client.Close() })
	opts = append(opts, engine.WithBreaker(breaker.New(breaker.Config{})), engine.WithStoreTimeout(limiter.DefaultTimeout))
	eng := engine.New(limiter.NewRedis(client), testenv.KeyPrefix(b), opts...)
	if err := eng.Apply(1, compile(b, "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 100000000}\n")); err != nil {
		b.Fatal(err)
	}
	for _, keys := range []int{1, 10000} {
		b.Run(strconv.Itoa(keys)+"keys", func(b *testing.B) {
			reqs := make([]engine.Request, keys)
			for i := range reqs {
				reqs[i] = engine.Request{Domain: "api", Descriptors: []engine.Descriptor{{Entries: []rules.Entry{{Key: "k", Value: "v" + strconv.Itoa(i)}}}}}
			}
			var n, failed atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(8)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					res, err := eng.Check(context.Background(), reqs[int(n.Add(1))%keys])
					if err != nil {
						b.Fatal(err)
					}
					if res.StoreErr != nil {
						failed.Add(1) // a loaded machine's timeouts; reported, not fatal
					}
				}
			})
			b.ReportMetric(float64(failed.Load())/float64(b.N), "storefail/op")
		})
	}
}

// BenchmarkStatsCost isolates what the per-rule stats cost a check: the
// same checks against the in-process limiter (no network), with the stats
// on and off, over 1,000 keys of a rule that limits a tenth of them.
func BenchmarkStatsCost(b *testing.B) {
	for _, on := range []bool{true, false} {
		name := "stats=on"
		var opts []engine.Option
		if !on {
			name, opts = "stats=off", []engine.Option{engine.WithoutStats()}
		}
		b.Run(name, func(b *testing.B) {
			eng := engine.New(limiter.NewLocal(limiter.LocalOptions{}), "", opts...)
			if err := eng.Apply(1, compile(b, "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1000, name: per-key}\n")); err != nil {
				b.Fatal(err)
			}
			reqs := make([]engine.Request, 1000)
			for i := range reqs {
				reqs[i] = engine.Request{Domain: "api", Descriptors: []engine.Descriptor{{Entries: []rules.Entry{{Key: "k", Value: "v" + strconv.Itoa(i)}}}}}
			}
			var n atomic.Int64
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := eng.Check(context.Background(), reqs[int(n.Add(1))%len(reqs)]); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// BenchmarkStatsCostLimited is BenchmarkStatsCost where every check is
// limited (1 per hour, 1,000 keys): each one counts its value for the
// console's per-value history.
func BenchmarkStatsCostLimited(b *testing.B) {
	for _, on := range []bool{true, false} {
		name := "stats=on"
		var opts []engine.Option
		if !on {
			name, opts = "stats=off", []engine.Option{engine.WithoutStats()}
		}
		b.Run(name, func(b *testing.B) {
			eng := engine.New(limiter.NewLocal(limiter.LocalOptions{}), "", opts...)
			if err := eng.Apply(1, compile(b, "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1, name: per-key}\n")); err != nil {
				b.Fatal(err)
			}
			reqs := make([]engine.Request, 1000)
			for i := range reqs {
				reqs[i] = engine.Request{Domain: "api", Descriptors: []engine.Descriptor{{Entries: []rules.Entry{{Key: "k", Value: "v" + strconv.Itoa(i)}}}}}
			}
			var n atomic.Int64
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := eng.Check(context.Background(), reqs[int(n.Add(1))%len(reqs)]); err != nil {
						b.Fatal(err)
					}
				}
			})
			if on {
				eng.TakeStats() // a node drains them every second
			}
		})
	}
}
