package checkserver_test

import (
	"context"
	"net"
	"strconv"
	"sync/atomic"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/enforcer/checkserver"
	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/enforcer/limiter"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
)

// floorService answers every check OK, as examples/bench/floor does: the
// transport's own cost.
type floorService struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

func (floorService) ShouldRateLimit(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: rlsv3.RateLimitResponse_OK}}}, nil
}

// BenchmarkGRPCCheck is the node's gRPC check path in one process, to
// profile what the node spends beyond the transport: the real Server over
// loopback with an engine counting in process ("node": limiter.Local, so no
// Redis in the profile) or in Redis through a Batcher as a node does
// ("node-redis"), beside the floor (the same gRPC server answering a fixed
// status). Run with -cpuprofile and compare the node's frames with the
// floor's.
func BenchmarkGRPCCheck(b *testing.B) {
	for _, name := range []string{"floor", "node", "node-redis"} {
		b.Run(name, func(b *testing.B) {
			g := grpc.NewServer(grpc.NumStreamWorkers(256))
			if name == "floor" {
				rlsv3.RegisterRateLimitServiceServer(g, floorService{})
			} else {
				d, err := rules.Parse("bench.yaml", []byte("domain: bench\ndescriptors:\n  - key: key\n    rate_limit: {unit: second, requests_per_unit: 100000000}\n"))
				if err != nil {
					b.Fatal(err)
				}
				set, err := rules.Compile([]*rules.Domain{d})
				if err != nil {
					b.Fatal(err)
				}
				var store engine.Store = limiter.NewLocal(limiter.LocalOptions{})
				if name == "node-redis" {
					client, err := limiter.NewClient(testenv.RedisURL(b))
					if err != nil {
						b.Fatal(err)
					}
					b.Cleanup(func() { client.Close() })
					store = limiter.NewBatcher(limiter.NewRedis(client), limiter.BatchOptions{})
				}
				eng := engine.New(store, testenv.KeyPrefix(b))
				if err := eng.Apply(1, set); err != nil {
					b.Fatal(err)
				}
				srv, err := checkserver.New(eng, checkserver.Options{})
				if err != nil {
					b.Fatal(err)
				}
				srv.RegisterGRPC(g)
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
			client := rlsv3.NewRateLimitServiceClient(conn)
			reqs := make([]*rlsv3.RateLimitRequest, 16)
			for i := range reqs {
				reqs[i] = &rlsv3.RateLimitRequest{Domain: "bench", HitsAddend: 1, Descriptors: []*commonv3.RateLimitDescriptor{
					{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "key", Value: "k" + strconv.Itoa(i)}}}}}
			}
			b.ReportAllocs()
			b.SetParallelism(32) // 64 callers at GOMAXPROCS 2
			b.ResetTimer()
			var n atomic.Int64
			b.RunParallel(func(pb *testing.PB) {
				req := reqs[int(n.Add(1))%len(reqs)]
				for pb.Next() {
					if _, err := client.ShouldRateLimit(context.Background(), req); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
