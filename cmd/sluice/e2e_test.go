package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/enforcer"
	"github.com/sluicehq/sluice/enforcer/node"
	"github.com/sluicehq/sluice/internal/consoletest"
	"github.com/sluicehq/sluice/internal/testenv"
)

type nodeAddrs struct{ http, grpc string }

// TestEndToEnd starts a console and two enforcers, publishes a token bucket
// with burst N and a slow refill, fires 10·N concurrent checks across both
// nodes and both APIs, and requires exactly N allowed.
func TestEndToEnd(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	dbURL, redisURL, prefix := testenv.PostgresURL(t), testenv.RedisURL(t), testenv.KeyPrefix(t)

	base := consoletest.Start(t, ctx, &wg, backend.Config{DatabaseURL: dbURL, AdminPassword: "e2e-password"}, log)
	admin := login(t, base, "admin", "e2e-password")

	// One node token per node: a token is bound to the node id it first connects with.
	var toks [2]struct {
		Token string `json:"token"`
	}
	for i := range toks {
		admin.MustDo(t, "POST", "/api/v1/tokens", map[string]string{"name": fmt.Sprintf("e2e-%d", i), "role": "node"}, 201, &toks[i])
	}

	const burst = 20
	domain := fmt.Sprintf("domain: e2e\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: %d, name: per-user}\n", burst)
	var pub struct {
		Version int64 `json:"version"`
	}
	admin.MustDo(t, "PUT", "/api/v1/domains/e2e", map[string]any{"yaml": domain, "message": "e2e", "base_version": 0}, 200, &pub)

	nodes := make([]nodeAddrs, 2)
	for i := range nodes {
		ready := make(chan nodeAddrs, 1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			cfg := enforcer.Config{Config: node.Config{ConsoleURL: base, NodeToken: toks[i].Token, NodeID: fmt.Sprintf("e2e-%d", i), RedisURL: redisURL,
				StateDir: t.TempDir(), KeyPrefix: prefix,
				// Generous: the exact-count checks must not fail open on a
				// loaded machine (50 ms by default).
				StoreTimeout: 2 * time.Second},
				HTTPAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0"}
			err := enforcer.Run(ctx, cfg, log, func(a enforcer.Addrs) { ready <- nodeAddrs{a.HTTP.String(), a.GRPC.String()} })
			if err != nil && ctx.Err() == nil {
				t.Errorf("enforcer %d: %v", i, err)
			}
		}()
		select {
		case nodes[i] = <-ready:
		case <-time.After(10 * time.Second):
			t.Fatalf("enforcer %d did not start", i)
		}
	}

	// Both nodes must report the published version through the console.
	deadline := time.Now().Add(10 * time.Second)
	for {
		var list struct {
			Nodes []struct {
				ID             string `json:"id"`
				AppliedVersion int64  `json:"applied_version"`
				Status         string `json:"status"`
			} `json:"nodes"`
		}
		admin.MustDo(t, "GET", "/api/v1/nodes", nil, 200, &list)
		acked := 0
		for _, n := range list.Nodes {
			if n.AppliedVersion == pub.Version && n.Status == "connected" {
				acked++
			}
		}
		if acked == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("nodes did not ack version %d: %+v", pub.Version, list.Nodes)
		}
		time.Sleep(20 * time.Millisecond)
	}

	grpcClients := make([]rlsv3.RateLimitServiceClient, len(nodes))
	for i, n := range nodes {
		conn, err := grpc.NewClient(n.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		grpcClients[i] = rlsv3.NewRateLimitServiceClient(conn)
	}
	body := []byte(`{"domain":"e2e","descriptors":[{"entries":[{"key":"user","value":"u1"}]}]}`)
	start := time.Now()
	var allowed, limited, failed atomic.Int64
	var fire sync.WaitGroup
	for i := range 10 * burst {
		fire.Add(1)
		go func() {
			defer fire.Done()
			n := i % len(nodes)
			if (i/len(nodes))%2 == 0 {
				resp, err := http.Post("http://"+nodes[n].http+"/json", "application/json", bytes.NewReader(body))
				if err != nil {
					failed.Add(1)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				switch resp.StatusCode {
				case 200:
					allowed.Add(1)
				case 429:
					limited.Add(1)
				default:
					failed.Add(1)
				}
				return
			}
			resp, err := grpcClients[n].ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "e2e",
				Descriptors: []*commonrl.RateLimitDescriptor{{Entries: []*commonrl.RateLimitDescriptor_Entry{{Key: "user", Value: "u1"}}}}})
			switch {
			case err != nil:
				failed.Add(1)
			case resp.OverallCode == rlsv3.RateLimitResponse_OK:
				allowed.Add(1)
			case resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT:
				limited.Add(1)
			default:
				failed.Add(1)
			}
		}()
	}
	fire.Wait()
	// The bucket refills one token every hour/burst; count what may have refilled.
	refill := int64(time.Since(start) / (time.Hour / burst))
	if failed.Load() != 0 {
		t.Fatalf("%d checks failed", failed.Load())
	}
	if got := allowed.Load(); got < burst || got > burst+refill {
		t.Fatalf("allowed %d of %d checks, want exactly %d (+%d refill)", got, 10*burst, burst, refill)
	}
	if got := limited.Load(); got != 10*burst-allowed.Load() {
		t.Fatalf("limited %d, want %d", got, 10*burst-allowed.Load())
	}
}

// client is a signed-in console session (consoletest.Client).
type client = consoletest.Client

// login signs user in on the console at base.
func login(t *testing.T, base, user, password string) *client {
	t.Helper()
	return consoletest.Login(t, base, user, password)
}
