package checkserver_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice/enforcer/checkserver"
	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/enforcer/limiter"
	"github.com/sluicehq/sluice/enforcer/node"
	"github.com/sluicehq/sluice/internal/bench"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
)

// floorAnswer is what the floors answer: OK with the status one descriptor
// of the benchmark's rule would have (examples/bench/floor's answer).
var floorAnswer = &rlsv3.RateLimitResponse{
	OverallCode: rlsv3.RateLimitResponse_OK,
	Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{
		Code:               rlsv3.RateLimitResponse_OK,
		CurrentLimit:       &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 100_000_000, Unit: rlsv3.RateLimitResponse_RateLimit_SECOND},
		LimitRemaining:     99_999_999,
		DurationUntilReset: durationpb.New(time.Second),
	}},
}

// floorService answers every check with floorAnswer, as examples/bench/floor
// does: the transport's own cost. With a store it first takes each
// descriptor's hit from a token bucket keyed by its entries, as floor
// -redis does ("floor+redis": the transport and the round trip to Redis,
// nothing else).
type floorService struct {
	rlsv3.UnimplementedRateLimitServiceServer
	store *limiter.Batcher
}

func (f floorService) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if f.store == nil {
		return floorAnswer, nil
	}
	reqs := make([]limiter.Request, len(req.Descriptors))
	for i, d := range req.Descriptors {
		entries := make([]rules.Entry, len(d.Entries))
		for j, e := range d.Entries {
			entries[j] = rules.Entry{Key: e.Key, Value: e.Value}
		}
		reqs[i] = limiter.Request{Key: limiter.Key("floor:", req.Domain, entries), Algorithm: rules.TokenBucket, Limit: 100_000_000, Period: time.Second, Hits: 1}
	}
	if _, err := f.store.Take(ctx, reqs); err != nil {
		return nil, err
	}
	return floorAnswer, nil
}

// BenchmarkGRPCCheck is the node's gRPC check path in one process, to
// profile and count what the node spends beyond the transport and Redis:
// the real Server over loopback gRPC (256 stream workers, as the enforcer
// runs it) with
//
//   - "floor": a server answering a fixed status (the transport alone);
//   - "floor-redis": the same taking each check's hit in Redis through a
//     Batcher with the node's timeout (examples/bench/floor -redis);
//   - "node": the engine as enforcer/node builds it (node.NewEngine: the
//     breaker, the local limiter, leases, async counting, per-rule stats),
//     with the node's Batcher on a shared Redis, and compare.sh's rule
//     (failure_mode: closed);
//   - "node-local": the same engine counting in process (limiter.Local), so
//     no Redis is in the profile.
//
// Sub-benchmarks name the distinct keys and the concurrent callers, as the
// rows of examples/bench/compare.sh do. The profile holds the client too,
// which is the same for every server; node ÷ floor-redis in CPU per check
// is what the engine adds.
func BenchmarkGRPCCheck(b *testing.B) {
	for _, keys := range []int{1, 10000} {
		for _, callers := range []int{16, 64, 256} {
			for _, name := range []string{"floor", "floor-redis", "node", "node-local"} {
				b.Run(fmt.Sprintf("keys=%d/callers=%d/%s", keys, callers, name), func(b *testing.B) {
					benchGRPC(b, name, keys, callers)
				})
			}
		}
	}
}

func benchGRPC(b *testing.B, name string, keys, callers int) {
	g := grpc.NewServer(grpc.NumStreamWorkers(256))
	var rdb *limiter.Redis // as enforcer/node builds it
	if name == "floor-redis" || name == "node" {
		client, err := limiter.NewClient(testenv.RedisURL(b), limiter.WithTimeout(limiter.DefaultTimeout), limiter.WithDialTimeout(limiter.DefaultTimeout))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { client.Close() })
		rdb = limiter.NewRedis(client)
	}
	switch name {
	case "floor":
		rlsv3.RegisterRateLimitServiceServer(g, floorService{})
	case "floor-redis":
		rlsv3.RegisterRateLimitServiceServer(g, floorService{store: limiter.NewBatcher(rdb, limiter.BatchOptions{Timeout: limiter.DefaultTimeout})})
	default:
		d, err := rules.Parse("bench.yaml", []byte("domain: bench\ndescriptors:\n  - key: key\n    rate_limit: {unit: second, requests_per_unit: 100000000}\n    failure_mode: closed\n"))
		if err != nil {
			b.Fatal(err)
		}
		set, err := rules.Compile([]*rules.Domain{d})
		if err != nil {
			b.Fatal(err)
		}
		var (
			store engine.Store = limiter.NewLocal(limiter.LocalOptions{})
			opts  []engine.Option
		)
		if rdb != nil {
			store = limiter.NewBatcher(rdb, limiter.BatchOptions{Timeout: limiter.DefaultTimeout})
			opts = append(opts, engine.WithLeases(rdb, engine.LeaseOptions{Timeout: limiter.DefaultTimeout}),
				engine.WithAsync(rdb, engine.AsyncOptions{}))
		}
		eng := node.NewEngine(store, testenv.KeyPrefix(b), slog.New(slog.DiscardHandler), opts...)
		b.Cleanup(func() { eng.Close(context.Background()) })
		if err := eng.Apply(1, set); err != nil {
			b.Fatal(err)
		}
		srv, err := checkserver.New(eng, checkserver.Options{})
		if err != nil {
			b.Fatal(err)
		}
		srv.RegisterGRPC(g)
		// The console takes the per-rule stats every few seconds.
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			t := time.NewTicker(time.Second)
			defer t.Stop()
			for {
				select {
				case <-stop:
					return
				case <-t.C:
					eng.TakeStats()
				}
			}
		}()
		b.Cleanup(func() { close(stop); <-done })
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go g.Serve(ln)
	b.Cleanup(g.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	rls := rlsv3.NewRateLimitServiceClient(conn)
	reqs := make([]*rlsv3.RateLimitRequest, keys)
	for i := range reqs {
		reqs[i] = &rlsv3.RateLimitRequest{Domain: "bench", HitsAddend: 1, Descriptors: []*commonv3.RateLimitDescriptor{
			{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "key", Value: "k" + strconv.Itoa(i)}}}}}
	}
	b.ReportAllocs()
	b.SetParallelism(max(callers/runtime.GOMAXPROCS(0), 1))
	b.ResetTimer()
	cpu0 := bench.ProcessCPU()
	var n, undecided atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			// Redis may time out on a loaded machine: the floor answers
			// an error, the node its failure mode (closed: over limit).
			resp, err := rls.ShouldRateLimit(context.Background(), reqs[int(n.Add(1))%keys])
			if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
				undecided.Add(1)
			}
		}
	})
	b.ReportMetric(float64(undecided.Load())/float64(b.N), "undecided/check")
	if cpu := bench.ProcessCPU(); cpu0 >= 0 && cpu >= 0 {
		// Client and server together: the client's share is the same for
		// every server.
		b.ReportMetric(float64((cpu-cpu0).Nanoseconds())/1e3/float64(b.N), "cpu-µs/check")
	}
}
