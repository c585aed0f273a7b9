package main

import (
	"bytes"
	"context"
	"net"
	"net/http/httptest"
	"strings"
	"testing"

	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/enforcer/checkserver"
	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/enforcer/limiter"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
)

// benchTarget serves a real check server (HTTP and gRPC) on loopback with a
// "bench" domain of 50 checks per minute per key.
func benchTarget(t *testing.T) (httpURL, grpcAddr string) {
	t.Helper()
	client, err := limiter.NewClient(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	eng := engine.New(limiter.NewRedis(client), testenv.KeyPrefix(t))
	d, err := rules.Parse("bench.yaml", []byte("domain: bench\ndescriptors:\n  - key: key\n    rate_limit: {unit: minute, requests_per_unit: 50}\n"))
	if err != nil {
		t.Fatal(err)
	}
	set, err := rules.Compile([]*rules.Domain{d})
	if err != nil {
		t.Fatal(err)
	}
	eng.Apply(1, set)
	srv, err := checkserver.New(eng, checkserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	g := grpc.NewServer()
	srv.RegisterGRPC(g)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go g.Serve(ln)
	t.Cleanup(g.Stop)
	return hs.URL, ln.Addr().String()
}

func TestBench(t *testing.T) {
	httpURL, grpcAddr := benchTarget(t)
	for _, tt := range []struct{ transport, target string }{{"grpc", grpcAddr}, {"http", httpURL}} {
		t.Run(tt.transport, func(t *testing.T) {
			var out, errOut bytes.Buffer
			err := run(context.Background(), []string{"bench", "--transport", tt.transport, "--target", tt.target,
				"--concurrency", "4", "--keys", "3", "--duration", "300ms", "--warmup", "0s"}, func(string) string { return "" }, &out, &errOut)
			if err != nil {
				t.Fatalf("bench: %v\n%s%s", err, out.String(), errOut.String())
			}
			for _, want := range []string{"checks/s", "p50", "p90", "p99", "errors    0", "over_limit"} {
				if !strings.Contains(out.String(), want) {
					t.Errorf("output lacks %q:\n%s", want, out.String())
				}
			}
			// 3 keys of 50/min: the run outlasts the quota, so both codes show.
			if strings.Contains(out.String(), "over_limit 0)") {
				t.Errorf("no check was over limit after 3 keys × 50 were used up:\n%s", out.String())
			}
		})
	}
}

func TestBenchRefusesBadTargets(t *testing.T) {
	for _, args := range [][]string{
		{"--target", "203.0.113.9:8082"},
		{"--transport", "http", "--target", "http://example.com:8081"},
		{"--transport", "http", "--target", "127.0.0.1:8081"},
		{"--transport", "smtp"},
		{"--concurrency", "0"},
		{"--duration", "11m"},
	} {
		var out, errOut bytes.Buffer
		err := run(context.Background(), append([]string{"bench", "--duration", "1ms"}, args...), func(string) string { return "" }, &out, &errOut)
		if err == nil {
			t.Errorf("bench %v: ran, want refused", args)
		}
	}
}
