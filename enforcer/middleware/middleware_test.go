//lint:file-ignore SA1019 Sluice uses nhooyr.io/websocket, deprecated in favour of its maintained twin github.com/coder/websocket

package middleware_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/google/go-cmp/cmp"
	"nhooyr.io/websocket"

	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/enforcer/limiter"
	"github.com/sluicehq/sluice/enforcer/middleware"
	"github.com/sluicehq/sluice/enforcer/middleware/ginlimit"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/rules/wire"
)

const appYAML = `domain: app
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 2, name: per-ip}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1, name: per-user}
`

func TestClientIP(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("::1/128")}
	tests := []struct {
		name, remote string
		xff          []string
		want         string
	}{
		{"untrusted peer: XFF ignored", "203.0.113.1:5000", []string{"1.2.3.4"}, "203.0.113.1"},
		{"trusted peer: rightmost untrusted hop", "10.0.0.1:5000", []string{"1.1.1.1, 2.2.2.2, 10.0.0.2"}, "2.2.2.2"},
		{"several header lines", "10.0.0.1:5000", []string{"1.1.1.1", "2.2.2.2, 10.0.0.9"}, "2.2.2.2"},
		{"all hops trusted: leftmost", "10.0.0.1:5000", []string{"10.1.1.1, 10.2.2.2"}, "10.1.1.1"},
		{"no XFF from a trusted peer", "10.0.0.1:5000", nil, "10.0.0.1"},
		{"garbage hop stops the walk", "10.0.0.1:5000", []string{"1.1.1.1, bogus, 10.0.0.3"}, "10.0.0.3"},
		{"IPv6 peer", "[::1]:80", []string{"2001:db8::1"}, "2001:db8::1"},
		{"IPv4-mapped", "[::ffff:203.0.113.5]:80", nil, "203.0.113.5"},
		{"not an IP", "@unix", nil, "invalid IP"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/", nil)
			r.RemoteAddr = tt.remote
			for _, v := range tt.xff {
				r.Header.Add("X-Forwarded-For", v)
			}
			if got := middleware.ClientIP(r, trusted).String(); got != tt.want {
				t.Errorf("ClientIP = %s, want %s", got, tt.want)
			}
		})
	}
}

func TestParseTrustedProxies(t *testing.T) {
	got, err := middleware.ParseTrustedProxies(" 10.0.0.0/8, 192.168.1.7 ,::1,")
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.168.1.7/32"), netip.MustParsePrefix("::1/128")}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	for _, bad := range []string{"10.0.0.0/33", "host.example", "1.2.3"} {
		if _, err := middleware.ParseTrustedProxies(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestBuild(t *testing.T) {
	specs := []rules.RequestDescriptor{
		{Entries: []rules.RequestEntry{{Key: "remote_address", From: rules.FromRemoteAddress}}},
		{Entries: []rules.RequestEntry{
			{Key: "method", From: rules.FromMethod},
			{Key: "path", From: rules.FromPath},
			{Key: "plan", From: rules.FromQuery, Name: "plan"},
		}},
		{Entries: []rules.RequestEntry{{Key: "global", Value: "all"}, {Key: "key", From: rules.FromHeader, Name: "X-Key"}}},
	}
	if err := middleware.Validate(specs); err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest("POST", "/v1/items?plan=free&x=1", nil)
	r.RemoteAddr = "198.51.100.4:1234"
	got := middleware.Build(r, specs, nil)
	want := []engine.Descriptor{
		{Entries: []rules.Entry{{Key: "remote_address", Value: "198.51.100.4"}}},
		{Entries: []rules.Entry{{Key: "method", Value: "POST"}, {Key: "path", Value: "/v1/items"}, {Key: "plan", Value: "free"}}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("no X-Key header: (-want +got):\n%s", diff)
	}
	r.Header.Set("X-Key", "k9")
	if got := middleware.Build(r, specs, nil); len(got) != 3 || got[2].Entries[1].Value != "k9" {
		t.Errorf("with X-Key: %+v, want a third descriptor", got)
	}
	for _, bad := range [][]rules.RequestDescriptor{
		{{}},
		{{Entries: []rules.RequestEntry{{From: rules.FromPath}}}},
		{{Entries: []rules.RequestEntry{{Key: "h", From: rules.FromHeader}}}},
		{{Entries: []rules.RequestEntry{{Key: "h", From: "cookie"}}}},
		{{Entries: []rules.RequestEntry{{Key: "h"}}}},
		{{Entries: []rules.RequestEntry{{Key: "h", From: rules.FromPath, Value: "x"}}}},
	} {
		if err := middleware.Validate(bad); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

func newEngine(t *testing.T) *engine.Engine {
	t.Helper()
	client, err := limiter.NewClient(testenv.RedisURL(t), limiter.WithTimeout(2*time.Second), limiter.WithDialTimeout(2*time.Second)) // a loaded machine must not fail open
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	return engine.New(limiter.NewRedis(client), testenv.KeyPrefix(t))
}

func apply(t *testing.T, eng *engine.Engine) {
	t.Helper()
	d, err := rules.Parse("app.yaml", []byte(appYAML))
	if err != nil {
		t.Fatal(err)
	}
	set, err := rules.Compile([]*rules.Domain{d})
	if err != nil {
		t.Fatal(err)
	}
	if err := eng.Apply(1, set); err != nil {
		t.Fatal(err)
	}
}

var hello = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello") })

func get(t *testing.T, h http.Handler, remote string) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest("GET", "/things", nil)
	r.RemoteAddr = remote
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func TestHandler(t *testing.T) {
	eng := newEngine(t)
	lim, err := middleware.New(eng, middleware.Config{Domain: "app"})
	if err != nil {
		t.Fatal(err)
	}
	h := lim.Handler(hello)

	// Before any ruleset, requests go through untouched.
	if w := get(t, h, "192.0.2.1:1"); w.Code != 200 || w.Header().Get("RateLimit") != "" {
		t.Fatalf("no ruleset: %d %v, want 200 without headers", w.Code, w.Header())
	}
	apply(t, eng)
	for i, want := range []string{"1", "0"} {
		w := get(t, h, "192.0.2.1:1")
		if w.Code != 200 || w.Body.String() != "hello" || w.Header().Get("X-RateLimit-Remaining") != want {
			t.Fatalf("request %d: %d %q remaining %q, want 200 hello %s", i+1, w.Code, w.Body, w.Header().Get("X-RateLimit-Remaining"), want)
		}
	}
	w := get(t, h, "192.0.2.1:1")
	if w.Code != 429 || w.Header().Get("Content-Type") != "application/problem+json" || w.Header().Get("Retry-After") == "" {
		t.Fatalf("3rd request: %d %v, want 429 problem+json with Retry-After", w.Code, w.Header())
	}
	var p map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil || p["limit"] != "per-ip" || p["status"] != float64(429) {
		t.Errorf("problem %s (%v)", w.Body, err)
	}
	if w := get(t, h, "192.0.2.2:1"); w.Code != 200 {
		t.Errorf("another client: %d, want 200", w.Code)
	}
}

func TestDescriptorFunc(t *testing.T) {
	eng := newEngine(t)
	apply(t, eng)
	lim, err := middleware.New(eng, middleware.Config{
		Domain: "app",
		DescriptorFunc: func(r *http.Request) []engine.Descriptor {
			u := r.Header.Get("X-User")
			if u == "" {
				return nil
			}
			return []engine.Descriptor{{Entries: []rules.Entry{{Key: "user", Value: u}}}}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	h := lim.Handler(hello)
	do := func(user string) int {
		r := httptest.NewRequest("GET", "/", nil)
		if user != "" {
			r.Header.Set("X-User", user)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	if got := []int{do("ann"), do("ann"), do(""), do("")}; !cmp.Equal(got, []int{200, 429, 200, 200}) {
		t.Errorf("codes %v, want [200 429 200 200] (anonymous requests unchecked)", got)
	}
}

func TestGin(t *testing.T) {
	gin.SetMode(gin.ReleaseMode)
	eng := newEngine(t)
	apply(t, eng)
	lim, err := middleware.New(eng, middleware.Config{Domain: "app"})
	if err != nil {
		t.Fatal(err)
	}
	router := gin.New()
	reached := 0
	router.Use(ginlimit.Handler(lim))
	router.GET("/things", func(c *gin.Context) { reached++; c.String(200, "ok") })
	codes := []int{get(t, router, "192.0.2.9:1").Code, get(t, router, "192.0.2.9:1").Code, get(t, router, "192.0.2.9:1").Code}
	if !cmp.Equal(codes, []int{200, 200, 429}) || reached != 2 {
		t.Errorf("codes %v, handler reached %d times, want [200 200 429] and 2", codes, reached)
	}
}

func TestNodeFollowsTheConsole(t *testing.T) {
	snap := wire.Snapshot{Type: wire.TypeSnapshot, Version: 7, Domains: []wire.DomainConfig{{Name: "app", YAML: appYAML}}, NodeCount: 3}
	snap.Checksum = wire.Checksum(snap.Domains)
	acked := make(chan int64, 1)
	console := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer tok" {
			http.Error(w, "no", http.StatusUnauthorized)
			return
		}
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer ws.CloseNow()
		if _, _, err := ws.Read(r.Context()); err != nil { // hello
			return
		}
		b, _ := json.Marshal(snap)
		if err := ws.Write(r.Context(), websocket.MessageText, b); err != nil {
			return
		}
		_, data, err := ws.Read(r.Context())
		if err != nil {
			return
		}
		if msg, err := wire.Decode(data); err == nil {
			if ack, ok := msg.(*wire.Ack); ok {
				acked <- ack.Version
			}
		}
		// Keep reading so the node's close frame is answered.
		for {
			if _, _, err := ws.Read(r.Context()); err != nil {
				return
			}
		}
	}))
	t.Cleanup(console.Close)

	node, err := middleware.NewNode(middleware.NodeConfig{
		ConsoleURL: console.URL, NodeToken: "tok", NodeID: "app-1",
		RedisURL: testenv.RedisURL(t), KeyPrefix: testenv.KeyPrefix(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { node.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- node.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	if v := <-acked; v != 7 {
		t.Fatalf("acked %d, want 7", v)
	}
	if !node.Ready() || node.Engine().Version() != 7 || node.Engine().NodeCount() != 3 {
		t.Fatalf("node ready=%v version=%d nodes=%d, want true 7 3", node.Ready(), node.Engine().Version(), node.Engine().NodeCount())
	}
	lim, err := node.Limiter(middleware.Config{Domain: "app"})
	if err != nil {
		t.Fatal(err)
	}
	h := lim.Handler(hello)
	codes := []int{get(t, h, "192.0.2.3:1").Code, get(t, h, "192.0.2.3:1").Code, get(t, h, "192.0.2.3:1").Code}
	if !cmp.Equal(codes, []int{200, 200, 429}) {
		t.Errorf("codes %v under the console's rules, want [200 200 429]", codes)
	}
}

// TestValueOverTheBoundsIsRefused: a header value over the engine's bound
// of one request gets 400, not a pass around its limits.
func TestValueOverTheBoundsIsRefused(t *testing.T) {
	eng := newEngine(t)
	apply(t, eng)
	lim, err := middleware.New(eng, middleware.Config{
		Domain:      "app",
		Descriptors: []rules.RequestDescriptor{{Entries: []rules.RequestEntry{{Key: "user", From: rules.FromHeader, Name: "X-User"}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	h := lim.Handler(hello)
	do := func(user string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("X-User", user)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	if w := do(strings.Repeat("u", engine.MaxValueBytes)); w.Code != 200 {
		t.Errorf("value at the bound: %d %s, want 200", w.Code, w.Body)
	}
	w := do(strings.Repeat("u", engine.MaxValueBytes+1))
	if w.Code != 400 || w.Header().Get("Content-Type") != "application/problem+json" || !strings.Contains(w.Body.String(), "at most") {
		t.Errorf("value over the bound: %d %v %s, want 400 problem+json with the reason", w.Code, w.Header(), w.Body)
	}
}
