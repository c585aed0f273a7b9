package bench

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/enforcer/checkserver"
	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/enforcer/limiter"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
)

// benchRules is the "bench" domain of 50 checks per minute per key.
const benchRules = "domain: bench\ndescriptors:\n  - key: key\n    rate_limit: {unit: minute, requests_per_unit: 50}\n"

// target is a real check server (HTTP and gRPC) on loopback.
type target struct {
	httpURL, grpcAddr string
	hs                *httptest.Server
	grpc              *grpc.Server
}

// benchTarget serves a real check server of the rules in yaml on loopback.
func benchTarget(t *testing.T, yaml string, opts ...grpc.ServerOption) target {
	t.Helper()
	client, err := limiter.NewClient(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	eng := engine.New(limiter.NewRedis(client), testenv.KeyPrefix(t))
	d, err := rules.Parse("bench.yaml", []byte(yaml))
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
	g := grpc.NewServer(opts...)
	srv.RegisterGRPC(g)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go g.Serve(ln)
	t.Cleanup(g.Stop)
	return target{httpURL: hs.URL, grpcAddr: ln.Addr().String(), hs: hs, grpc: g}
}

// testConfig is a run of `sluice bench`'s defaults against target, without
// the warm-up, for d.
func testConfig(transport, target string, concurrency int, d time.Duration) Config {
	return Config{Target: target, Transport: transport, Domain: "bench", Key: "key", Keys: 1,
		Concurrency: concurrency, Connections: 4, Duration: d, Hits: 1}
}

// runConfig runs the load of cfg and returns its output.
func runConfig(t *testing.T, cfg Config) (string, error) {
	t.Helper()
	var out bytes.Buffer
	err := Run(context.Background(), cfg, &out)
	return out.String(), err
}

// benchCounts reads checks, over_limit and errors from bench's output.
func benchCounts(t *testing.T, out string) (checks, overLimit, errs int) {
	t.Helper()
	var ok int
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) == 6 && f[0] == "checks":
			checks, _ = strconv.Atoi(f[1])
			ok, _ = strconv.Atoi(strings.TrimSuffix(f[3], ","))
			overLimit, _ = strconv.Atoi(strings.TrimSuffix(f[5], ")"))
			if ok+overLimit != checks {
				t.Fatalf("checks line does not add up: %q", line)
			}
		case len(f) == 2 && f[0] == "errors":
			errs, _ = strconv.Atoi(f[1])
		}
	}
	return checks, overLimit, errs
}

// benchCPU reads the load generator's CPU µs per check from bench's output.
func benchCPU(t *testing.T, out string) float64 {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) >= 3 && f[0] == "cpu/check" && f[2] == "µs" {
			v, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				t.Fatalf("cpu/check line: %v", err)
			}
			return v
		}
	}
	t.Fatalf("no cpu/check line in:\n%s", out)
	return 0
}

func TestBench(t *testing.T) {
	// Not parallel: it asserts latencies under load.
	for _, transport := range []string{"grpc", "http"} {
		t.Run(transport, func(t *testing.T) {
			tg := benchTarget(t, benchRules) // a fresh quota
			addr := tg.grpcAddr
			if transport == "http" {
				addr = tg.httpURL
			}
			cfg := testConfig(transport, addr, 4, 300*time.Millisecond)
			cfg.Keys = 3
			out, err := runConfig(t, cfg)
			if err != nil {
				t.Fatalf("bench: %v\n%s", err, out)
			}
			for _, want := range []string{"checks/s", "p50", "p90", "p99", "max", "errors", "over_limit"} {
				if !strings.Contains(out, want) {
					t.Errorf("output lacks %q:\n%s", want, out)
				}
			}
			// 3 keys of 50/min: the run outlasts the quota, so both codes show.
			checks, over, errs := benchCounts(t, out)
			if errs != 0 {
				t.Errorf("got %d errors, want 0:\n%s", errs, out)
			}
			if over == 0 || over == checks {
				t.Errorf("want both ok and over_limit after 3 keys × 50 were used up:\n%s", out)
			}
			// The process's CPU per check (here the server's too, in this
			// process), where getrusage exists: measured, so above zero,
			// and within what the machine's CPUs have in the 300 ms window
			// (and a half, for timers waking late).
			if ProcessCPU() >= 0 {
				if cpu := benchCPU(t, out); cpu <= 0 || cpu*float64(checks) > float64(runtime.NumCPU())*450e3 {
					t.Errorf("cpu/check %v µs for %d checks in 300 ms:\n%s", cpu, checks, out)
				}
			}
		})
	}
}

// A check the server refuses is an error: counted, the first one printed,
// and a run without any success fails.
func TestBenchCountsRefusedChecks(t *testing.T) {
	t.Parallel()
	tg := benchTarget(t, benchRules)
	for _, tt := range []struct{ transport, target, want string }{
		{"grpc", tg.grpcAddr, "first error: rpc error: code = InvalidArgument desc = invalid rate limit request: domain must not be empty"},
		{"http", tg.httpURL, "first error: HTTP 400 Bad Request"},
	} {
		t.Run(tt.transport, func(t *testing.T) {
			cfg := testConfig(tt.transport, tt.target, 4, 200*time.Millisecond)
			cfg.Domain = ""
			out, err := runConfig(t, cfg)
			if err == nil {
				t.Errorf("bench succeeded without a single check:\n%s", out)
			}
			if !strings.Contains(out, tt.want) {
				t.Errorf("output lacks %q:\n%s", tt.want, out)
			}
			if checks, _, errs := benchCounts(t, out); checks != 0 || errs == 0 {
				t.Errorf("got %d checks, %d errors; want 0 and some:\n%s", checks, errs, out)
			}
		})
	}
}

// More callers than the server's MAX_CONCURRENT_STREAMS on one connection:
// the extra checks wait for a stream instead of being refused.
func TestBenchGRPCHonoursMaxConcurrentStreams(t *testing.T) {
	t.Parallel()
	tg := benchTarget(t, benchRules, grpc.MaxConcurrentStreams(2))
	cfg := testConfig("grpc", tg.grpcAddr, 16, 300*time.Millisecond)
	cfg.Connections, cfg.Keys = 1, 1000
	out, err := runConfig(t, cfg)
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, out)
	}
	if _, _, errs := benchCounts(t, out); errs != 0 {
		t.Errorf("got %d errors, want 0:\n%s", errs, out)
	}
}

// Enough checks on one connection that requests and responses each cross
// the 64 KiB HTTP/2 flow-control windows several times: the client must
// wait for and grant WINDOW_UPDATEs, or the connection stalls or fails.
func TestBenchGRPCFlowControl(t *testing.T) {
	// Not parallel: it changes the client's connection window, a package variable.
	// Long descriptor keys and limit names make big requests and responses,
	// so few checks cross the windows.
	key, name := strings.Repeat("k", 1000), strings.Repeat("n", 3000) // keys: at most engine.MaxKeyBytes
	tg := benchTarget(t, "domain: bench\ndescriptors:\n  - key: "+key+"\n    rate_limit: {unit: second, requests_per_unit: 100000000, name: "+name+"}\n",
		// Fixed 64 KiB windows (no BDP growth): the client waits for each
		// WINDOW_UPDATE. (grpc-go does not enforce its connection window, so
		// a client that ignored it would go unnoticed here.)
		grpc.InitialConnWindowSize(64<<10), grpc.InitialWindowSize(64<<10))
	// The client grants the server no more than the default window, so it
	// has to top it up.
	defer func(w int64) { grpcConnWindow = w }(grpcConnWindow)
	grpcConnWindow = 65535

	// Sizes of one request and one response, from grpc-go's client.
	cc, err := grpc.NewClient(tg.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	req := &rlsv3.RateLimitRequest{Domain: "bench", HitsAddend: 1,
		Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: key, Value: "k0"}}}}}
	resp, err := rlsv3.NewRateLimitServiceClient(cc).ShouldRateLimit(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	smaller := min(proto.Size(req), proto.Size(resp))

	cfg := testConfig("grpc", tg.grpcAddr, 64, time.Second)
	cfg.Key, cfg.Connections = key, 1
	out, err := runConfig(t, cfg)
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, out)
	}
	checks, _, errs := benchCounts(t, out)
	if errs != 0 {
		t.Errorf("got %d errors, want 0:\n%s", errs, out)
	}
	if want := 4 * 65535 / smaller; checks < want {
		t.Errorf("got %d checks of ≥ %d bytes each way, want ≥ %d (4 windows):\n%s", checks, smaller, want, out)
	}
}

// A server that goes away mid-run costs errors, not a hang or a crash.
func TestBenchServerStops(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, transport string
		stop            func(target)
	}{
		{"grpc", "grpc", func(tg target) { tg.grpc.Stop() }},
		// GOAWAY, the checks in flight finish, then the listener is gone.
		{"grpc graceful", "grpc", func(tg target) { tg.grpc.GracefulStop() }},
		{"http", "http", func(tg target) { tg.hs.CloseClientConnections(); tg.hs.Listener.Close() }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tg := benchTarget(t, benchRules)
			addr := tg.grpcAddr
			if tt.transport == "http" {
				addr = tg.httpURL
			}
			time.AfterFunc(300*time.Millisecond, func() { tt.stop(tg) })
			cfg := testConfig(tt.transport, addr, 8, time.Second)
			cfg.Keys = 1000
			out, err := runConfig(t, cfg)
			if err != nil {
				t.Fatalf("bench: %v\n%s", err, out)
			}
			if checks, _, errs := benchCounts(t, out); checks == 0 || errs == 0 {
				t.Errorf("got %d checks, %d errors; want some of both:\n%s", checks, errs, out)
			}
			if !strings.Contains(out, "first error: ") {
				t.Errorf("output lacks the first error:\n%s", out)
			}
		})
	}
}

// The HTTP transport reads the framings net/http's server writes: a
// chunked body (with trailers), and a response after which the server
// closes the connection.
func TestBenchHTTPFramings(t *testing.T) {
	t.Parallel()
	mux := http.NewServeMux()
	mux.HandleFunc("POST /chunked/json", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-Done")
		w.Write([]byte(`{"overallCode":`))
		w.(http.Flusher).Flush()
		w.Write([]byte(`"OK"}`))
		w.Header().Set("X-Done", "yes")
	})
	mux.HandleFunc("POST /close/json", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		w.WriteHeader(http.StatusTooManyRequests)
		w.Write([]byte(`{"overallCode":"OVER_LIMIT"}`))
	})
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)
	for _, tt := range []struct {
		path   string
		wantOK bool
	}{{"/chunked", true}, {"/close", false}} {
		t.Run(tt.path, func(t *testing.T) {
			out, err := runConfig(t, testConfig("http", hs.URL+tt.path, 2, 200*time.Millisecond))
			if err != nil {
				t.Fatalf("bench: %v\n%s", err, out)
			}
			checks, over, errs := benchCounts(t, out)
			if checks == 0 || errs != 0 || (over == 0) != tt.wantOK || (over == checks) == tt.wantOK {
				t.Errorf("got %d checks (%d over_limit), %d errors; want all ok %v, no error:\n%s", checks, over, errs, tt.wantOK, out)
			}
		})
	}
}
