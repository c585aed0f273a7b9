//lint:file-ignore SA1019 Sluice uses nhooyr.io/websocket, deprecated in favour of its maintained twin github.com/coder/websocket

package enforcer_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"nhooyr.io/websocket"

	"github.com/sluicehq/sluice/enforcer"
	"github.com/sluicehq/sluice/enforcer/node"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules/wire"
)

const apiYAML = `domain: api
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 2, name: per-key}
`

// fakeConsole accepts node subscriptions on the real stream path, sends each
// node one snapshot after its hello and reports what the node says.
func fakeConsole(t *testing.T, token string, snap wire.Snapshot) (url string, hellos chan wire.Hello, answers chan any) {
	t.Helper()
	hellos, answers = make(chan wire.Hello, 10), make(chan any, 10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v1/nodes/stream" || r.Header.Get("Authorization") != "Bearer "+token {
			http.Error(w, "no", http.StatusUnauthorized)
			return
		}
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer ws.CloseNow()
		ctx := r.Context()
		_, data, err := ws.Read(ctx)
		if err != nil {
			return
		}
		var hello wire.Hello
		if err := json.Unmarshal(data, &hello); err != nil {
			t.Errorf("console: hello: %v", err)
			return
		}
		hellos <- hello
		if hello.AppliedVersion < snap.Version {
			b, _ := json.Marshal(snap)
			if err := ws.Write(ctx, websocket.MessageText, b); err != nil {
				return
			}
		}
		for {
			_, data, err := ws.Read(ctx)
			if err != nil {
				return
			}
			msg, err := wire.Decode(data)
			if err != nil {
				t.Errorf("console: %v", err)
				return
			}
			answers <- msg
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL, hellos, answers
}

type running struct {
	httpURL  string
	grpcAddr string
	gateway  net.Addr // nil without gateway mode
	cancel   context.CancelFunc
	done     chan error
	once     sync.Once
}

func start(t *testing.T, cfg enforcer.Config) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	addrs := make(chan enforcer.Addrs, 1)
	done := make(chan error, 1)
	go func() {
		done <- enforcer.Run(ctx, cfg, nil, func(a enforcer.Addrs) { addrs <- a })
	}()
	r := &running{cancel: cancel, done: done}
	t.Cleanup(func() { r.stop(t) })
	select {
	case a := <-addrs:
		r.httpURL, r.grpcAddr, r.gateway = "http://"+a.HTTP.String(), a.GRPC.String(), a.Gateway
	case err := <-done:
		t.Fatalf("Run returned before ready: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("not ready within 10s")
	}
	return r
}

func (r *running) stop(t *testing.T) {
	t.Helper()
	r.once.Do(func() {
		r.cancel()
		select {
		case err := <-r.done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Error("Run did not return within 15s of cancel")
		}
	})
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func post(t *testing.T, url, body string) *http.Response {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

func TestRunEndToEnd(t *testing.T) {
	t.Parallel()
	domains := []wire.DomainConfig{{Name: "api", YAML: apiYAML}}
	snap := wire.Snapshot{Type: wire.TypeSnapshot, Version: 3, Checksum: wire.Checksum(domains), Domains: domains, NodeCount: 1}
	consoleURL, hellos, answers := fakeConsole(t, "tok", snap)
	stateDir := t.TempDir()
	cfg := enforcer.Config{
		Config: node.Config{
			ConsoleURL: consoleURL,
			NodeToken:  "tok",
			NodeID:     "e2e-node",
			RedisURL:   testenv.RedisURL(t),
			StateDir:   stateDir,
			Labels:     map[string]string{"region": "test"},
			Build:      "v0.0.0-test",
			KeyPrefix:  testenv.KeyPrefix(t),
		},
		HTTPAddr: "127.0.0.1:0",
		GRPCAddr: "127.0.0.1:0",
	}
	node := start(t, cfg)

	select {
	case h := <-hellos:
		if h.NodeID != "e2e-node" || h.Protocol != wire.ProtocolVersion || h.AppliedVersion != 0 || h.Build != "v0.0.0-test" || h.Labels["region"] != "test" {
			t.Errorf("hello %+v", h)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no hello within 10s")
	}
	select {
	case msg := <-answers:
		if ack, ok := msg.(*wire.Ack); !ok || ack.Version != 3 {
			t.Fatalf("answer %T %+v, want ack 3", msg, msg)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no ack within 10s")
	}

	if code, body := get(t, node.httpURL+"/readyz"); code != 200 {
		t.Errorf("/readyz %d %s, want 200", code, body)
	}
	body := `{"domain":"api","descriptors":[{"entries":[{"key":"api_key","value":"e2e"}]}]}`
	if resp := post(t, node.httpURL+"/json", body); resp.StatusCode != 200 {
		t.Errorf("1st check %d, want 200", resp.StatusCode)
	}

	// gRPC shares the counters with HTTP.
	conn, err := grpc.NewClient(node.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	out, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{
		Domain: "api",
		Descriptors: []*ratelimitv3.RateLimitDescriptor{{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "api_key", Value: "e2e"}},
		}},
	})
	if err != nil {
		t.Fatalf("gRPC: %v", err)
	}
	if out.OverallCode != rlsv3.RateLimitResponse_OK || out.Statuses[0].LimitRemaining != 0 {
		t.Errorf("gRPC: %v, want OK with 0 remaining", out)
	}

	resp := post(t, node.httpURL+"/v1/check", body)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Errorf("3rd check %d Retry-After %q, want 429 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}

	code, metrics := get(t, node.httpURL+"/metrics")
	for _, want := range []string{
		"sluice_enforcer_ruleset_version 3",
		"sluice_enforcer_console_connected 1",
		`sluice_enforcer_decisions_total{code="over_limit",domain="api"} 1`,
		"go_goroutines",
	} {
		if code != 200 || !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}

	node.stop(t)
	if _, err := os.Stat(filepath.Join(stateDir, "snapshot.json")); err != nil {
		t.Errorf("state file: %v", err)
	}
	if _, err := http.Get(node.httpURL + "/healthz"); err == nil {
		t.Error("HTTP still served after Run returned")
	}

	// Restarted while the console is down, the node enforces the saved
	// ruleset at once and its counters are still there.
	cfg.ConsoleURL = "http://127.0.0.1:1"
	again := start(t, cfg)
	if code, body := get(t, again.httpURL+"/readyz"); code != 200 {
		t.Errorf("/readyz after restart without console: %d %s, want 200", code, body)
	}
	if resp := post(t, again.httpURL+"/json", body); resp.StatusCode != http.StatusTooManyRequests {
		t.Errorf("check after restart: %d, want 429", resp.StatusCode)
	}
}

func TestRunNotReadyWithoutRuleset(t *testing.T) {
	t.Parallel()
	cfg := enforcer.Config{
		Config: node.Config{
			ConsoleURL: "http://127.0.0.1:1", // nobody there
			NodeToken:  "tok",
			NodeID:     "lonely",
			RedisURL:   testenv.RedisURL(t),
			StateDir:   t.TempDir(),
			KeyPrefix:  testenv.KeyPrefix(t),
		},
		HTTPAddr: "127.0.0.1:0",
		GRPCAddr: "127.0.0.1:0",
	}
	node := start(t, cfg)
	if code, _ := get(t, node.httpURL+"/healthz"); code != 200 {
		t.Errorf("/healthz %d, want 200", code)
	}
	if code, body := get(t, node.httpURL+"/readyz"); code != 503 || !strings.Contains(body, "no ruleset") {
		t.Errorf("/readyz %d %s, want 503 no ruleset", code, body)
	}
}

func TestRunRejectsBadConfig(t *testing.T) {
	t.Parallel()
	base := enforcer.Config{Config: node.Config{ConsoleURL: "http://console", RedisURL: "redis://127.0.0.1:6379/0"}, HTTPAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0"}
	tests := []struct {
		name string
		edit func(*enforcer.Config)
	}{
		{"no console url", func(c *enforcer.Config) { c.ConsoleURL = "" }},
		{"bad console url", func(c *enforcer.Config) { c.ConsoleURL = "ftp://x" }},
		{"no redis url", func(c *enforcer.Config) { c.RedisURL = "" }},
		{"bad listen address", func(c *enforcer.Config) { c.HTTPAddr = "256.0.0.1:-1" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := base
			tt.edit(&cfg)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := enforcer.Run(ctx, cfg, nil, nil); err == nil {
				t.Fatal("Run succeeded, want error")
			}
		})
	}
}

func TestRunGatewayMode(t *testing.T) {
	t.Parallel()
	const webYAML = `domain: web
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 2, name: per-ip}
`
	domains := []wire.DomainConfig{{Name: "web", YAML: webYAML}}
	snap := wire.Snapshot{Type: wire.TypeSnapshot, Version: 1, Checksum: wire.Checksum(domains), Domains: domains, NodeCount: 1}
	consoleURL, _, answers := fakeConsole(t, "tok", snap)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "upstream "+r.URL.Path)
	}))
	t.Cleanup(upstream.Close)

	node := start(t, enforcer.Config{
		Config: node.Config{
			ConsoleURL: consoleURL,
			NodeToken:  "tok",
			NodeID:     "gw-node",
			RedisURL:   testenv.RedisURL(t),
			KeyPrefix:  testenv.KeyPrefix(t),
		},
		HTTPAddr:        "127.0.0.1:0",
		GRPCAddr:        "127.0.0.1:0",
		GatewayAddr:     "127.0.0.1:0",
		GatewayUpstream: upstream.URL,
		GatewayDomain:   "web",
	})
	gw := "http://" + node.gateway.String()
	select {
	case <-answers:
	case <-time.After(10 * time.Second):
		t.Fatal("no ack within 10s")
	}

	for i, want := range []int{200, 200, 429} {
		code, body := get(t, gw+"/page")
		if code != want {
			t.Fatalf("request %d through the gateway: %d %s, want %d", i+1, code, body, want)
		}
		if want == 200 && body != "upstream /page" {
			t.Errorf("request %d: body %q, want the upstream's", i+1, body)
		}
	}
	_, metrics := get(t, node.httpURL+"/metrics")
	for _, want := range []string{
		`sluice_enforcer_check_duration_seconds_count{transport="gateway"} 3`,
		`sluice_enforcer_rule_decisions_total{domain="web",result="limited",rule="per-ip"} 1`,
		`sluice_enforcer_breaker_state 0`,
		`sluice_enforcer_console_last_contact_age_seconds`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

func TestRunGatewayConfigErrors(t *testing.T) {
	t.Parallel()
	base := enforcer.Config{Config: node.Config{ConsoleURL: "http://127.0.0.1:9", RedisURL: "redis://127.0.0.1:9/0", NodeID: "n"}, GatewayAddr: "127.0.0.1:0"}
	for name, mod := range map[string]func(*enforcer.Config){
		"no upstream":       func(c *enforcer.Config) { c.GatewayDomain = "web" },
		"relative upstream": func(c *enforcer.Config) { c.GatewayUpstream = "/x"; c.GatewayDomain = "web" },
		"no domain":         func(c *enforcer.Config) { c.GatewayUpstream = "http://127.0.0.1:9" },
	} {
		cfg := base
		mod(&cfg)
		if err := enforcer.Run(context.Background(), cfg, nil, nil); err == nil {
			t.Errorf("%s: Run accepted the config", name)
		}
	}
}
