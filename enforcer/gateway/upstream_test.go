//lint:file-ignore SA1019 nhooyr.io/websocket is the websocket library the project uses (its maintained twin is github.com/coder/websocket)

package gateway_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"nhooyr.io/websocket"

	"github.com/sluicehq/sluice/enforcer/gateway"
)

// TestGatewayWebsocketPassThrough: a websocket upgrade is checked like any
// request, then the connection is passed through to the upstream both ways;
// once the client's limit is spent, the upgrade is refused with 429.
func TestGatewayWebsocketPassThrough(t *testing.T) {
	t.Parallel()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		for {
			typ, msg, err := c.Read(r.Context())
			if err != nil {
				return
			}
			if err := c.Write(r.Context(), typ, append([]byte("upstream: "), msg...)); err != nil {
				return
			}
		}
	}))
	t.Cleanup(up.Close)
	g := newGateway(t, up.URL, nil, "")
	wsURL := "ws" + strings.TrimPrefix(g.url, "http") + "/ws"

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// webYAML's per-ip limit is 3 a minute: three upgrades get through.
	for i := range 3 {
		c, resp, err := websocket.Dial(ctx, wsURL, nil)
		if err != nil {
			t.Fatalf("upgrade %d through the gateway: %v", i+1, err)
		}
		if resp.StatusCode != http.StatusSwitchingProtocols {
			t.Errorf("upgrade %d: %d, want 101", i+1, resp.StatusCode)
		}
		if got := remaining(t, resp.Header, "per-ip"); got != int64(2-i) {
			t.Errorf("upgrade %d: RateLimit r=%d for per-ip, want %d", i+1, got, 2-i)
		}
		for _, msg := range []string{"hello", "again"} {
			if err := c.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
				t.Fatalf("upgrade %d: write: %v", i+1, err)
			}
			typ, got, err := c.Read(ctx)
			if err != nil || typ != websocket.MessageText || string(got) != "upstream: "+msg {
				t.Fatalf("upgrade %d: read %v %q %v, want the upstream's echo of %q", i+1, typ, got, err, msg)
			}
		}
		c.Close(websocket.StatusNormalClosure, "")
	}
	_, resp, err := websocket.Dial(ctx, wsURL, nil)
	if err == nil {
		t.Fatal("4th upgrade went through, want 429")
	}
	if resp == nil || resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Errorf("4th upgrade: %v (%v), want 429 with Retry-After", resp, err)
	}
}

// TestGatewayUpstreamTimeout: an upstream that does not send its response
// headers within the transport's timeout gets the client a 504 problem.
func TestGatewayUpstreamTimeout(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(up.Close)
	t.Cleanup(func() { close(release) }) // runs before up.Close
	transport := gateway.NewTransport()
	transport.ResponseHeaderTimeout = 200 * time.Millisecond
	t.Cleanup(transport.CloseIdleConnections)
	g := newGateway(t, up.URL, nil, "", func(c *gateway.Config) { c.Transport = transport })

	began := time.Now()
	resp, body := send(t, "GET", g.url+"/slow-upstream", nil, nil)
	if resp.StatusCode != http.StatusGatewayTimeout || resp.Header.Get("Content-Type") != "application/problem+json" || !strings.Contains(body, `"status":504`) {
		t.Errorf("upstream timeout: %d %q %s, want 504 problem+json", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	if resp.Header.Get("RateLimit") != "" || resp.Header.Get("X-RateLimit-Remaining") != "" {
		t.Errorf("504 carries rate-limit headers %v, want none (the request was not answered by the upstream)", resp.Header)
	}
	if took := time.Since(began); took > 10*time.Second {
		t.Errorf("504 after %v, want about the 200ms timeout", took)
	}
}

// records is a slog.Handler that keeps every record.
type records struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (h *records) Enabled(context.Context, slog.Level) bool { return true }
func (h *records) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.recs = append(h.recs, r.Clone())
	return nil
}
func (h *records) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *records) WithGroup(string) slog.Handler      { return h }

// failures returns the "upstream request failed" records' suppressed_since_last.
func (h *records) failures() []int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []int64
	for _, r := range h.recs {
		if r.Message != "upstream request failed" {
			continue
		}
		n := int64(-1)
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "suppressed_since_last" {
				n = a.Value.Int64()
			}
			return true
		})
		out = append(out, n)
	}
	return out
}

// TestGatewayUpstreamDownLogsOnceASecond: an unreachable upstream fails
// every request, and the gateway logs it at most once a second, with the
// count of failures it did not log since the last line.
func TestGatewayUpstreamDownLogsOnceASecond(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	addr := up.URL
	up.Close()
	log := &records{}
	// A limit far above what the test sends, so every request reaches the upstream.
	g := newGateway(t, addr, nil, `domain: web
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 10000}
`, func(c *gateway.Config) { c.Log = slog.New(log) })

	sent := 0
	fail := func() {
		t.Helper()
		sent++
		if resp, _ := send(t, "GET", g.url+"/x", nil, nil); resp.StatusCode != http.StatusBadGateway {
			t.Fatalf("request %d: %d, want 502", sent, resp.StatusCode)
		}
	}
	began := time.Now()
	for range 5 {
		fail()
	}
	if got := log.failures(); time.Since(began) < time.Second && len(got) != 1 {
		t.Fatalf("5 failures within a second logged %d lines (%v), want 1", len(got), got)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(log.failures()) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("no second log line after %d failures over 10s", sent)
		}
		time.Sleep(50 * time.Millisecond) // waiting for the log's second to pass
		fail()
	}
	got := log.failures()
	if len(got) != 2 || got[0] != 0 || got[1] != int64(sent-2) {
		t.Errorf("log lines' suppressed_since_last %v after %d failures, want [0 %d]", got, sent, sent-2)
	}
}
