package gateway_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/enforcer/gateway"
	"github.com/sluicehq/sluice/enforcer/internal/sfv"
	"github.com/sluicehq/sluice/enforcer/limiter"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
)

// webYAML's request_descriptors: the client address; and the API key
// header with the path.
const webYAML = `domain: web
request_descriptors:
  - entries:
      - {key: remote_address, from: remote_address}
  - entries:
      - {key: api_key, from: header, name: X-Api-Key}
      - {key: path, from: path}
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 3, name: per-ip}
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 100, name: per-key}
    descriptors:
      - key: path
        value: /slow
        rate_limit: {unit: second, requests_per_unit: 2, name: slow-path}
`

// upstream is a real HTTP server that records what reaches it.
type upstream struct {
	*httptest.Server
	mu   sync.Mutex
	seen []*http.Request
	at   []time.Time
}

func newUpstream(t *testing.T) *upstream {
	t.Helper()
	u := &upstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.seen = append(u.seen, r.Clone(context.Background()))
		u.at = append(u.at, time.Now())
		u.mu.Unlock()
		w.Header().Set("X-RateLimit-Remaining", "999") // the gateway's own wins
		w.Header().Set("X-Upstream", "yes")
		if r.URL.Path == "/busy" {
			w.Header().Set("Retry-After", "7")
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		switch r.URL.Path {
		case "/echo":
			// HTTP/1 handlers read the whole body before answering.
			b, err := io.ReadAll(r.Body)
			if err != nil {
				http.Error(w, err.Error(), 500)
				return
			}
			w.Write(b)
		case "/stream":
			// Two chunks with a pause: the client must get the first
			// before the second is written.
			fmt.Fprintln(w, "first")
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		default:
			fmt.Fprintf(w, "%s %s xff=%q fwd-host=%q", r.Method, r.URL.Path, r.Header.Get("X-Forwarded-For"), r.Header.Get("X-Forwarded-Host"))
		}
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *upstream) count() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.seen)
}

type gw struct {
	url string
	eng *engine.Engine
	g   *gateway.Gateway
}

// newGateway serves a Gateway to up over a real listener, counting in the
// test Redis, with the domain source yaml (webYAML when empty) applied;
// opts change the gateway's configuration.
func newGateway(t *testing.T, up string, trusted []netip.Prefix, yaml string, opts ...func(*gateway.Config)) *gw {
	t.Helper()
	client, err := limiter.NewClient(testenv.RedisURL(t), limiter.WithTimeout(2*time.Second), limiter.WithDialTimeout(2*time.Second)) // a loaded machine must not fail open
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	eng := engine.New(limiter.NewRedis(client), testenv.KeyPrefix(t))
	if yaml == "" {
		yaml = webYAML
	}
	d, err := rules.Parse("web.yaml", []byte(yaml))
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
	u, err := url.Parse(up)
	if err != nil {
		t.Fatal(err)
	}
	cfg := gateway.Config{
		Upstream:       u,
		Domain:         "web",
		TrustedProxies: trusted,
	}
	for _, o := range opts {
		o(&cfg)
	}
	g, err := gateway.New(eng, cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(g)
	t.Cleanup(srv.Close)
	return &gw{url: srv.URL, eng: eng, g: g}
}

func send(t *testing.T, method, u string, body io.Reader, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, u, body)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

// remaining parses the RateLimit field strictly and returns r of limit name.
func remaining(t *testing.T, h http.Header, name string) int64 {
	t.Helper()
	items, err := sfv.ParseList(h.Values("RateLimit")...)
	if err != nil {
		t.Fatalf("RateLimit %q: %v", h.Values("RateLimit"), err)
	}
	for _, it := range items {
		if it.Value == name {
			r, _ := it.Param("r")
			n, ok := r.(int64)
			if !ok {
				t.Fatalf("RateLimit %q: r of %s is not an integer", h.Get("RateLimit"), name)
			}
			return n
		}
	}
	t.Fatalf("RateLimit %q has no %s", h.Get("RateLimit"), name)
	return 0
}

func TestGatewayProxiesThenRejects(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	g := newGateway(t, up.URL, nil, "")

	for i := range 3 {
		resp, body := send(t, "GET", g.url+"/hello?x=1", nil, map[string]string{"X-Forwarded-For": "6.6.6.6"})
		if resp.StatusCode != 200 || !strings.HasPrefix(body, "GET /hello") {
			t.Fatalf("request %d: %d %q, want the upstream's answer", i+1, resp.StatusCode, body)
		}
		if resp.Header.Get("X-Upstream") != "yes" {
			t.Errorf("request %d: upstream headers lost", i+1)
		}
		// The client's own X-Forwarded-For is not believed: the gateway
		// replaces it with the real peer.
		if !strings.Contains(body, `xff="127.0.0.1"`) {
			t.Errorf("request %d: upstream saw %s, want xff=127.0.0.1 only", i+1, body)
		}
		if got := remaining(t, resp.Header, "per-ip"); got != int64(2-i) {
			t.Errorf("request %d: RateLimit r=%d for per-ip, want %d", i+1, got, 2-i)
		}
		if got := resp.Header.Values("X-RateLimit-Remaining"); len(got) != 1 || got[0] != fmt.Sprint(2-i) {
			t.Errorf("request %d: X-RateLimit-Remaining %q, want only the gateway's %d", i+1, got, 2-i)
		}
	}

	resp, body := send(t, "GET", g.url+"/hello", nil, nil)
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("4th request: %d, want 429", resp.StatusCode)
	}
	if resp.Header.Get("Content-Type") != "application/problem+json" || resp.Header.Get("Retry-After") == "" {
		t.Errorf("429 headers %v, want problem+json and Retry-After", resp.Header)
	}
	var p struct {
		Type, Title, Limit, Instance string
		Status                       int
	}
	if err := json.Unmarshal([]byte(body), &p); err != nil || p.Status != 429 || p.Limit != "per-ip" || p.Instance != "/hello" || p.Type != "about:blank" {
		t.Errorf("problem %s (%v), want status 429 limit per-ip", body, err)
	}
	if remaining(t, resp.Header, "per-ip") != 0 {
		t.Errorf("429 RateLimit %q, want r=0", resp.Header.Get("RateLimit"))
	}
	if n := up.count(); n != 3 {
		t.Errorf("upstream got %d requests, want 3 (the rejected one never reaches it)", n)
	}
}

func TestGatewayTrustedProxies(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	g := newGateway(t, up.URL, []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, "")
	// Behind a trusted proxy, each forwarded client has its own budget.
	for _, client := range []string{"203.0.113.7", "203.0.113.8"} {
		for i := range 3 {
			resp, body := send(t, "GET", g.url+"/", nil, map[string]string{"X-Forwarded-For": "10.9.9.9, " + client})
			if resp.StatusCode != 200 {
				t.Fatalf("%s request %d: %d", client, i+1, resp.StatusCode)
			}
			// The trusted chain is extended, not replaced.
			if want := fmt.Sprintf(`xff="10.9.9.9, %s, 127.0.0.1"`, client); !strings.Contains(body, want) {
				t.Errorf("upstream saw %s, want %s", body, want)
			}
		}
		if resp, _ := send(t, "GET", g.url+"/", nil, map[string]string{"X-Forwarded-For": client}); resp.StatusCode != 429 {
			t.Errorf("%s 4th request: %d, want 429", client, resp.StatusCode)
		}
	}
}

func TestGatewayStreamsAndDropsHopByHop(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	g := newGateway(t, up.URL, nil, "")

	// A request body larger than any buffer, streamed through both ways.
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	resp, body := send(t, "POST", g.url+"/echo", io.MultiReader(bytes.NewReader(big)), map[string]string{
		"Connection": "X-Hop", "X-Hop": "secret", "Keep-Alive": "timeout=5",
	})
	if resp.StatusCode != 200 || body != string(big) {
		t.Fatalf("echo: %d, %d bytes back, want 200 and the %d bytes sent", resp.StatusCode, len(body), len(big))
	}
	up.mu.Lock()
	seen := up.seen[len(up.seen)-1]
	up.mu.Unlock()
	if seen.Header.Get("X-Hop") != "" || seen.Header.Get("Keep-Alive") != "" {
		t.Errorf("hop-by-hop headers reached the upstream: %v", seen.Header)
	}

	// A streamed response arrives chunk by chunk.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", g.url+"/stream", nil)
	sresp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer sresp.Body.Close()
	line, err := bufio.NewReader(sresp.Body).ReadString('\n')
	if err != nil || line != "first\n" {
		t.Errorf("first chunk %q, %v: want it while the upstream is still writing", line, err)
	}
}

func TestGatewayDescriptorsFromHeaderAndPath(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	g := newGateway(t, up.URL, []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, "")
	// Distinct forwarded addresses keep per-ip out of the way; the API
	// key's /slow limit (2/s) is what bites.
	codes := make([]int, 3)
	for i := range codes {
		resp, _ := send(t, "GET", g.url+"/slow", nil, map[string]string{"X-Api-Key": "k1", "X-Forwarded-For": fmt.Sprintf("198.51.100.%d", i+1)})
		codes[i] = resp.StatusCode
	}
	if codes[0] != 200 || codes[1] != 200 || codes[2] != 429 {
		t.Errorf("codes %v on /slow with one key, want [200 200 429]", codes)
	}
	// Without the header, the api_key descriptor is not sent at all.
	if resp, _ := send(t, "GET", g.url+"/slow", nil, map[string]string{"X-Forwarded-For": "198.51.100.99"}); resp.StatusCode != 200 {
		t.Errorf("no API key: %d, want 200 (descriptor skipped)", resp.StatusCode)
	}
}

func TestGatewayDelay(t *testing.T) {
	// Not parallel: it measures the delays it asserts.
	up := newUpstream(t)
	g := newGateway(t, up.URL, []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, strings.Replace(webYAML,
		"name: slow-path}", "name: slow-path}\n        on_limit: {action: delay, max_delay: 1s}", 1))
	// 2/s is one every 500 ms: a 1 s queue holds two requests.
	const n = 5
	type result struct {
		code int
		took time.Duration
	}
	results := make([]result, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			resp, _ := send(t, "GET", g.url+"/slow", nil, map[string]string{"X-Api-Key": "k-delay", "X-Forwarded-For": fmt.Sprintf("192.0.2.%d", i+1)})
			results[i] = result{resp.StatusCode, time.Since(t0)}
		}()
	}
	wg.Wait()
	ok, rejected := 0, 0
	for _, r := range results {
		switch r.code {
		case 200:
			ok++
		case 429:
			rejected++
		default:
			t.Errorf("unexpected status %d", r.code)
		}
	}
	// Two at once from the burst, two queued (500 ms and 1 s), one over.
	if ok != 4 || rejected != 1 {
		t.Fatalf("results %+v: %d passed and %d rejected, want 4 and 1", results, ok, rejected)
	}
	up.mu.Lock()
	at := append([]time.Time(nil), up.at...)
	up.mu.Unlock()
	if len(at) != 4 {
		t.Fatalf("upstream got %d requests, want 4", len(at))
	}
	// Held requests reach the upstream no earlier than the bucket allows:
	// the 3rd after ~500 ms, the 4th after ~1 s (lower bounds only; a
	// slow machine may add to them).
	if d := at[2].Sub(start); d < 400*time.Millisecond {
		t.Errorf("3rd request reached the upstream after %v, want >= ~500ms", d)
	}
	if d := at[3].Sub(start); d < 900*time.Millisecond {
		t.Errorf("4th request reached the upstream after %v, want >= ~1s", d)
	}
	if g.g.Waiting() != 0 {
		t.Errorf("%d requests still held", g.g.Waiting())
	}
}

func TestGatewayKeepsUpstreamRetryAfter(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	g := newGateway(t, up.URL, nil, "")
	resp, _ := send(t, "GET", g.url+"/busy", nil, nil)
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "7" || resp.Header.Get("RateLimit") == "" {
		t.Errorf("upstream 503: %d Retry-After %q RateLimit %q, want 503, the upstream's 7 and the gateway's RateLimit", resp.StatusCode, resp.Header.Get("Retry-After"), resp.Header.Get("RateLimit"))
	}
}

func TestGatewayUpstreamDown(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	addr := up.URL
	up.Close()
	g := newGateway(t, addr, nil, "")
	resp, body := send(t, "GET", g.url+"/x", nil, nil)
	if resp.StatusCode != http.StatusBadGateway || resp.Header.Get("Content-Type") != "application/problem+json" || !strings.Contains(body, `"status":502`) {
		t.Errorf("upstream down: %d %q %s, want 502 problem+json", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	t.Parallel()
	eng := engine.New(nil, "")
	for name, cfg := range map[string]gateway.Config{
		"no upstream":  {Domain: "web"},
		"relative":     {Upstream: &url.URL{Path: "/x"}, Domain: "web"},
		"wrong scheme": {Upstream: &url.URL{Scheme: "ftp", Host: "x"}, Domain: "web"},
		"no domain":    {Upstream: &url.URL{Scheme: "http", Host: "x"}},
	} {
		if _, err := gateway.New(eng, cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// shapedYAML shapes GET requests per tenant (a query parameter) with a
// leaky bucket: 4/s drains one every 250 ms, and a request may wait up to
// 500 ms, so a burst of one tenant gets three through (at 0, 250 and
// 500 ms) and the rest rejected with the limit's 503.
const shapedYAML = `domain: web
request_descriptors:
  - entries:
      - {key: scope, value: shaped}
      - {key: method, from: method}
      - {key: tenant, from: query, name: tenant}
descriptors:
  - key: scope
    value: shaped
    descriptors:
      - key: method
        value: GET
        descriptors:
          - key: tenant
            rate_limit: {unit: second, requests_per_unit: 4, name: per-tenant}
            algorithm: leaky_bucket
            burst: 10
            on_limit: {action: delay, max_delay: 500ms, status: 503}
`

func TestGatewayLeakyBucketDelay(t *testing.T) {
	// Not parallel: it measures the delays it asserts.
	up := newUpstream(t)
	g := newGateway(t, up.URL, nil, shapedYAML)
	const n = 5
	codes := make([]int, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, _ := send(t, "GET", g.url+"/items?tenant=t1", nil, nil)
			codes[i] = resp.StatusCode
		}()
	}
	wg.Wait()
	ok, rejected := 0, 0
	for _, c := range codes {
		switch c {
		case 200:
			ok++
		case 503:
			rejected++
		default:
			t.Errorf("unexpected status %d", c)
		}
	}
	if ok != 3 || rejected != 2 {
		t.Fatalf("codes %v: %d passed and %d rejected, want 3 and 2 (503, the limit's status)", codes, ok, rejected)
	}
	up.mu.Lock()
	at := append([]time.Time(nil), up.at...)
	up.mu.Unlock()
	// The last admitted request was held for the queue ahead of it (lower
	// bound only; a slow machine may add to it).
	if len(at) != 3 || at[2].Sub(start) < 400*time.Millisecond {
		t.Errorf("upstream got %d requests, the last after %v; want 3, the last after ~500ms", len(at), at[len(at)-1].Sub(start))
	}
	if g.g.Waiting() != 0 {
		t.Errorf("%d requests still held", g.g.Waiting())
	}
	// Another tenant has its own bucket; a POST or a request without the
	// tenant parameter carries no descriptor this domain limits.
	for _, r := range []struct{ method, path string }{
		{"GET", "/items?tenant=t2"},
		{"POST", "/items?tenant=t1"},
		{"GET", "/items"},
	} {
		if resp, _ := send(t, r.method, g.url+r.path, nil, nil); resp.StatusCode != 200 {
			t.Errorf("%s %s: %d, want 200", r.method, r.path, resp.StatusCode)
		}
	}
}
