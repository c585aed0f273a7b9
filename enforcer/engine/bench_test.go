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
// Redis round trip, the breaker) on a hot key and on 10k keys.
func BenchmarkCheck(b *testing.B) {
	client, err := limiter.NewClient(testenv.RedisURL(b))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { client.Close() })
	eng := engine.New(limiter.NewRedis(client), testenv.KeyPrefix(b),
		engine.WithBreaker(breaker.New(breaker.Config{})), engine.WithStoreTimeout(limiter.DefaultTimeout))
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
