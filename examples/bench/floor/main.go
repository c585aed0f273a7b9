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
}

func (service) ShouldRateLimit(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return answer, nil
}

func main() {
	grpcAddr := flag.String("grpc", "127.0.0.1:8081", "gRPC listen address")
	httpAddr := flag.String("http", "127.0.0.1:8080", "HTTP (/json) listen address")
	flag.Parse()
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
	}
	if err := run(*grpcAddr, *httpAddr); err != nil {
		log.Fatal(err)
	}
}

func run(grpcAddr, httpAddr string) error {
	body, err := protojson.Marshal(answer)
	if err != nil {
		return err
	}
	l, err := net.Listen("tcp", grpcAddr)
	if err != nil {
		return err
	}
	g := grpc.NewServer(grpc.MaxRecvMsgSize(maxBodyBytes), grpc.NumStreamWorkers(streamWorkers))
	rlsv3.RegisterRateLimitServiceServer(g, service{})
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
