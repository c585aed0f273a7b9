// Command floor is the cheapest server of envoyproxy/ratelimit's protocol on
// the transports a Sluice node uses: grpc-go (with the node's stream
// workers and grpc-go's default protobuf codec) and net/http (/json, the
// request decoded with protojson). It decodes each request as the node does
// and answers every one OK with one fixed status, without matching rules or
// asking Redis. examples/bench/compare.sh measures it beside the node to
// show how much of a check's cost is the transport alone: no server built
// on these libraries and codecs can spend less CPU per check than this one.
//
//	go run ./examples/bench/floor -grpc 127.0.0.1:8081 -http 127.0.0.1:8080
//
// With -redis URL ("floor+redis" in compare.sh) each check also takes one
// hit of a token bucket in Redis, keyed by its descriptors, through the
// node's own way to Redis (limiter.NewClient, NewRedis and a Batcher with
// the node's defaults), before the same fixed answer: what a node pays to
// decode, ask Redis and answer, without matching rules, building limit
// keys, metrics, stats, headers or failure modes. The node's CPU per
// check over this one is what the engine adds.
//
// It runs with the node's garbage-collector setting (GOGC=400 unless GOGC
// is set), like `sluice enforcer`.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice/enforcer/limiter"
	"github.com/sluicehq/sluice/rules"
)

// The node's settings (enforcer.grpcStreamWorkers, checkserver.MaxBodyBytes,
// cmd/sluice's enforcerGCPercent).
const (
	streamWorkers = 256
	maxBodyBytes  = 1 << 20
	gcPercent     = 400
)

// answer is what every check gets: OK, with the status one descriptor of
// the benchmark's rule would have.
var answer = &rlsv3.RateLimitResponse{
	OverallCode: rlsv3.RateLimitResponse_OK,
	Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{
		Code:               rlsv3.RateLimitResponse_OK,
		CurrentLimit:       &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 100_000_000, Unit: rlsv3.RateLimitResponse_RateLimit_SECOND},
		LimitRemaining:     99_999_999,
		DurationUntilReset: durationpb.New(time.Second),
	}},
}

type service struct {
	rlsv3.UnimplementedRateLimitServiceServer
	store *limiter.Batcher // nil: answer without asking Redis
}

func (s service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if err := s.take(ctx, req); err != nil {
		return nil, err
	}
	return answer, nil
}

// take takes one hit per descriptor from the benchmark rule's limit in
// Redis (token bucket, 10^8 a second), under the key limiter.Key makes of
// the request's domain and entries; it does nothing without a store.
func (s service) take(ctx context.Context, req *rlsv3.RateLimitRequest) error {
	if s.store == nil {
		return nil
	}
	reqs := make([]limiter.Request, len(req.Descriptors))
	for i, d := range req.Descriptors {
		entries := make([]rules.Entry, len(d.Entries))
		for j, e := range d.Entries {
			entries[j] = rules.Entry{Key: e.Key, Value: e.Value}
		}
		reqs[i] = limiter.Request{Key: limiter.Key("floor:", req.Domain, entries), Algorithm: rules.TokenBucket, Limit: 100_000_000, Period: time.Second, Hits: 1}
	}
	_, err := s.store.Take(ctx, reqs)
	return err
}

func main() {
	grpcAddr := flag.String("grpc", "127.0.0.1:8081", "gRPC listen address")
	httpAddr := flag.String("http", "127.0.0.1:8080", "HTTP (/json) listen address")
	redisURL := flag.String("redis", "", "take each check's hits in this Redis (limiter.NewClient's URL forms) before answering")
	flag.Parse()
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
	}
	svc := service{}
	if *redisURL != "" {
		// As enforcer/node builds its store, with its default timeout.
		client, err := limiter.NewClient(*redisURL, limiter.WithTimeout(limiter.DefaultTimeout), limiter.WithDialTimeout(limiter.DefaultTimeout))
		if err != nil {
			log.Fatal(err)
		}
		svc.store = limiter.NewBatcher(limiter.NewRedis(client), limiter.BatchOptions{Timeout: limiter.DefaultTimeout})
	}
	if err := run(svc, *grpcAddr, *httpAddr); err != nil {
		log.Fatal(err)
	}
}

func run(svc service, grpcAddr, httpAddr string) error {
	body, err := protojson.Marshal(answer)
	if err != nil {
		return err
	}
	l, err := net.Listen("tcp", grpcAddr)
	if err != nil {
		return err
	}
	g := grpc.NewServer(grpc.MaxRecvMsgSize(maxBodyBytes), grpc.NumStreamWorkers(streamWorkers))
	rlsv3.RegisterRateLimitServiceServer(g, svc)
	errc := make(chan error, 2)
	go func() { errc <- g.Serve(l) }()

	mux := http.NewServeMux()
	mux.HandleFunc("POST /json", func(w http.ResponseWriter, r *http.Request) {
		raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
		var req rlsv3.RateLimitRequest
		if err == nil {
			err = protojson.Unmarshal(raw, &req)
		}
		if err != nil {
			http.Error(w, "Bad Request", http.StatusBadRequest)
			return
		}
		if err := svc.take(r.Context(), &req); err != nil {
			http.Error(w, "Service Unavailable", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(body)
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	srv := &http.Server{Addr: httpAddr, Handler: mux, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 2 * time.Minute}
	go func() { errc <- srv.ListenAndServe() }()
	err = <-errc
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}
