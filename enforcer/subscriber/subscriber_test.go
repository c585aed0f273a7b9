//lint:file-ignore SA1019 Sluice uses nhooyr.io/websocket, deprecated in favour of its maintained twin github.com/coder/websocket

package subscriber_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"nhooyr.io/websocket"

	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/enforcer/subscriber"
	"github.com/sluicehq/sluice/rules/wire"
)

const (
	token   = "node-secret"
	apiYAML = "domain: api\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: minute, requests_per_unit: 3}\n"
	webYAML = "domain: web\ndescriptors:\n  - key: ip\n    rate_limit: {unit: second, requests_per_unit: 10}\n"
)

// console is a fake console: a real HTTP server speaking the real push
// protocol over a real websocket, driven by the test.
type console struct {
	t     *testing.T
	srv   *httptest.Server
	conns chan *consoleConn
}

// consoleConn is one node connection as the console sees it.
type consoleConn struct {
	t     *testing.T
	ws    *websocket.Conn
	hello wire.Hello
	in    chan any // decoded messages from the node
	done  chan struct{}
}

func newConsole(t *testing.T) *console {
	t.Helper()
	c := &console{t: t, conns: make(chan *consoleConn, 10)}
	c.srv = httptest.NewServer(http.HandlerFunc(c.serve))
	t.Cleanup(c.srv.Close)
	return c
}

func (c *console) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != subscriber.StreamPath {
		http.NotFound(w, r)
		return
	}
	if r.Header.Get("Authorization") != "Bearer "+token {
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	ws, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	defer ws.CloseNow()
	ws.SetReadLimit(wire.MaxMessageBytes)
	ctx := r.Context()
	_, data, err := ws.Read(ctx)
	if err != nil {
		return
	}
	msg, err := wire.Decode(data)
	if err != nil {
		c.t.Errorf("console: first message: %v", err)
		return
	}
	hello, ok := msg.(*wire.Hello)
	if !ok {
		c.t.Errorf("console: first message is %T, want hello", msg)
		return
	}
	cc := &consoleConn{t: c.t, ws: ws, hello: *hello, in: make(chan any, 10), done: make(chan struct{})}
	c.conns <- cc
	defer close(cc.done)
	for {
		_, data, err := ws.Read(ctx)
		if err != nil {
			return
		}
		msg, err := wire.Decode(data)
		if err != nil {
			c.t.Errorf("console: decode: %v", err)
			return
		}
		cc.in <- msg
	}
}

// accept waits for the next node connection.
func (c *console) accept() *consoleConn {
	c.t.Helper()
	select {
	case cc := <-c.conns:
		return cc
	case <-time.After(10 * time.Second):
		c.t.Fatal("no node connected within 10s")
		return nil
	}
}

func (cc *consoleConn) send(v any) {
	cc.t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		cc.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := cc.ws.Write(ctx, websocket.MessageText, data); err != nil {
		cc.t.Fatalf("console: write: %v", err)
	}
}

func (cc *consoleConn) recv() any {
	cc.t.Helper()
	select {
	case msg := <-cc.in:
		return msg
	case <-time.After(10 * time.Second):
		cc.t.Fatal("no message from the node within 10s")
		return nil
	}
}

func snapshot(version int64, domains ...wire.DomainConfig) wire.Snapshot {
	return wire.Snapshot{
		Type:      wire.TypeSnapshot,
		Version:   version,
		Checksum:  wire.Checksum(domains),
		Domains:   domains,
		NodeCount: 1,
	}
}

func api() wire.DomainConfig { return wire.DomainConfig{Name: "api", YAML: apiYAML} }
func web() wire.DomainConfig { return wire.DomainConfig{Name: "web", YAML: webYAML} }

type node struct {
	eng  *engine.Engine
	sub  *subscriber.Subscriber
	dir  string
	stop func() // cancels Run and waits for it; also run at cleanup
}

// startNode runs a subscriber against consoleURL until the test ends.
func startNode(t *testing.T, consoleURL, stateDir string, load bool) *node {
	t.Helper()
	return startNodePinging(t, consoleURL, stateDir, load, 50*time.Millisecond)
}

// startNodePinging is startNode with the keepalive window ping.
func startNodePinging(t *testing.T, consoleURL, stateDir string, load bool, ping time.Duration) *node {
	t.Helper()
	eng := engine.New(nil, "") // these tests never check; no store needed
	sub, err := subscriber.New(subscriber.Config{
		ConsoleURL:   consoleURL,
		NodeToken:    token,
		NodeID:       "node-1",
		Labels:       map[string]string{"zone": "a"},
		Build:        "test",
		StateDir:     stateDir,
		PingInterval: ping,
		MinBackoff:   10 * time.Millisecond,
		MaxBackoff:   50 * time.Millisecond,
	}, eng, nil)
	if err != nil {
		t.Fatalf("new subscriber: %v", err)
	}
	if load {
		if _, err := sub.LoadState(); err != nil {
			t.Fatalf("load state: %v", err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Error("Run did not return within 10s of cancel")
			}
		})
	}
	t.Cleanup(stop)
	return &node{eng: eng, sub: sub, dir: stateDir, stop: stop}
}

func wantAck(t *testing.T, msg any, version int64) {
	t.Helper()
	ack, ok := msg.(*wire.Ack)
	if !ok {
		t.Fatalf("got %T %+v, want ack %d", msg, msg, version)
	}
	if ack.Version != version {
		t.Fatalf("ack version %d, want %d", ack.Version, version)
	}
}

func wantNack(t *testing.T, msg any, version int64, fragment string) {
	t.Helper()
	nack, ok := msg.(*wire.Nack)
	if !ok {
		t.Fatalf("got %T %+v, want nack %d", msg, msg, version)
	}
	if nack.Version != version || !strings.Contains(nack.Error, fragment) {
		t.Fatalf("nack %d %q, want version %d and error containing %q", nack.Version, nack.Error, version, fragment)
	}
}

func TestSubscribeSnapshotAck(t *testing.T) {
	t.Parallel()
	c := newConsole(t)
	n := startNode(t, c.srv.URL, t.TempDir(), false)
	cc := c.accept()

	want := wire.Hello{Type: wire.TypeHello, Protocol: wire.ProtocolVersion, NodeID: "node-1",
		AppliedVersion: 0, Labels: map[string]string{"zone": "a"}, Build: "test"}
	if got := cc.hello; got.Type != want.Type || got.Protocol != want.Protocol || got.NodeID != want.NodeID ||
		got.AppliedVersion != want.AppliedVersion || got.Labels["zone"] != "a" || got.Build != want.Build {
		t.Fatalf("hello %+v, want %+v", got, want)
	}

	cc.send(snapshot(1, api(), web()))
	wantAck(t, cc.recv(), 1)
	if n.eng.Version() != 1 || !n.eng.HasDomain("api") || !n.eng.HasDomain("web") {
		t.Fatalf("engine version %d domains api=%v web=%v, want 1 true true", n.eng.Version(), n.eng.HasDomain("api"), n.eng.HasDomain("web"))
	}
	if !n.sub.Connected() || time.Since(n.sub.LastContact()) > 5*time.Second {
		t.Errorf("connected %v last contact %v, want true and recent", n.sub.Connected(), n.sub.LastContact())
	}

	// The snapshot is on disk as the console sent it.
	data, err := os.ReadFile(filepath.Join(n.dir, subscriber.StateFile))
	if err != nil {
		t.Fatalf("state file: %v", err)
	}
	var saved wire.Snapshot
	if err := json.Unmarshal(data, &saved); err != nil {
		t.Fatalf("state file: %v", err)
	}
	if saved.Version != 1 || saved.Checksum != wire.Checksum([]wire.DomainConfig{api(), web()}) {
		t.Errorf("saved snapshot version %d checksum %s, want 1 and the snapshot's", saved.Version, saved.Checksum)
	}

	// A newer version replaces the ruleset; the same version again is acked.
	cc.send(snapshot(2, api()))
	wantAck(t, cc.recv(), 2)
	if n.eng.Version() != 2 || n.eng.HasDomain("web") {
		t.Errorf("after v2: version %d web=%v, want 2 false", n.eng.Version(), n.eng.HasDomain("web"))
	}
	cc.send(snapshot(2, api()))
	wantAck(t, cc.recv(), 2)

	// Keepalive pings keep LastContact fresh without any message.
	before := n.sub.LastContact()
	time.Sleep(200 * time.Millisecond)
	if !n.sub.LastContact().After(before) {
		t.Errorf("last contact did not advance with pings (%v)", before)
	}
}

func TestSubscribeRejectsBadSnapshots(t *testing.T) {
	t.Parallel()
	c := newConsole(t)
	n := startNode(t, c.srv.URL, t.TempDir(), false)
	cc := c.accept()
	cc.send(snapshot(1, api()))
	wantAck(t, cc.recv(), 1)

	badChecksum := snapshot(2, api(), web())
	badChecksum.Checksum = strings.Repeat("0", 64)
	invalidYAML := snapshot(3, wire.DomainConfig{Name: "api", YAML: "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"})
	wrongName := snapshot(4, wire.DomainConfig{Name: "web", YAML: apiYAML})

	tests := []struct {
		name     string
		snap     wire.Snapshot
		fragment string
	}{
		{"bad checksum", badChecksum, "checksum"},
		{"invalid yaml", invalidYAML, "api.yaml"},
		{"domain name mismatch", wrongName, `declares domain "api"`},
		{"version zero", snapshot(0, api()), "invalid version"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cc.send(tt.snap)
			wantNack(t, cc.recv(), tt.snap.Version, tt.fragment)
			if n.eng.Version() != 1 || n.eng.HasDomain("web") != false || !n.eng.HasDomain("api") {
				t.Errorf("engine changed: version %d", n.eng.Version())
			}
		})
	}

	// Versions at or below the applied one are never applied.
	cc.send(snapshot(5, api(), web()))
	wantAck(t, cc.recv(), 5)
	cc.send(snapshot(4, api()))
	wantNack(t, cc.recv(), 4, "not newer")
	if n.eng.Version() != 5 || !n.eng.HasDomain("web") {
		t.Errorf("stale snapshot applied: version %d", n.eng.Version())
	}
}

func TestSubscribeStateSurvivesRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	c := newConsole(t)
	first := startNode(t, c.srv.URL, dir, false)
	cc := c.accept()
	cc.send(snapshot(7, api(), web()))
	wantAck(t, cc.recv(), 7)
	first.stop()
	select {
	case <-cc.done: // the node closed its side on shutdown
	case <-time.After(10 * time.Second):
		t.Fatal("console connection still open after the node stopped")
	}

	// A new node with the console unreachable enforces the saved version.
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close()
	n := startNode(t, down.URL, dir, true)
	if n.eng.Version() != 7 || !n.eng.HasDomain("web") || n.sub.AppliedVersion() != 7 {
		t.Fatalf("after restart: engine version %d, applied %d; want 7", n.eng.Version(), n.sub.AppliedVersion())
	}
	n.stop()

	// When the console is back, the node says which version it has.
	c2 := newConsole(t)
	startNode(t, c2.srv.URL, dir, true)
	if hello := c2.accept().hello; hello.AppliedVersion != 7 {
		t.Errorf("hello applied_version %d, want 7", hello.AppliedVersion)
	}
}

func TestLoadStateErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		content string // "" = no file
		wantNo  bool   // ErrNoState
	}{
		{name: "missing", wantNo: true},
		{name: "garbage", content: "{not json"},
		{name: "bad checksum", content: `{"type":"snapshot","version":3,"checksum":"abc","domains":[]}`},
		{name: "zero version", content: `{"type":"snapshot","version":0,"checksum":"","domains":[]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			if tt.content != "" {
				if err := os.WriteFile(filepath.Join(dir, subscriber.StateFile), []byte(tt.content), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			eng := engine.New(nil, "")
			sub, err := subscriber.New(subscriber.Config{ConsoleURL: "http://127.0.0.1:1", StateDir: dir}, eng, nil)
			if err != nil {
				t.Fatal(err)
			}
			_, err = sub.LoadState()
			if tt.wantNo && err != subscriber.ErrNoState {
				t.Fatalf("got %v, want ErrNoState", err)
			}
			if err == nil {
				t.Fatal("LoadState succeeded, want error")
			}
			if eng.Loaded() {
				t.Error("engine loaded from a bad state file")
			}
		})
	}
}

func TestSubscribeReconnects(t *testing.T) {
	t.Parallel()
	c := newConsole(t)
	n := startNode(t, c.srv.URL, "", false)
	cc := c.accept()
	cc.send(snapshot(1, api()))
	wantAck(t, cc.recv(), 1)

	// The console drops the connection; the node comes back by itself and
	// reports what it has.
	cc.ws.CloseNow()
	cc2 := c.accept()
	if cc2.hello.AppliedVersion != 1 {
		t.Errorf("hello after reconnect: applied_version %d, want 1", cc2.hello.AppliedVersion)
	}
	if n.eng.Version() != 1 {
		t.Errorf("engine version %d, want 1", n.eng.Version())
	}
}

func TestSubscribeUnauthorized(t *testing.T) {
	t.Parallel()
	c := newConsole(t)
	eng := engine.New(nil, "")
	sub, err := subscriber.New(subscriber.Config{ConsoleURL: c.srv.URL, NodeToken: "wrong",
		MinBackoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond}, eng, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := sub.Run(ctx); err != nil {
		t.Fatalf("Run: %v", err)
	}
	select {
	case <-c.conns:
		t.Fatal("console accepted a node with a wrong token")
	default:
	}
	if sub.Connected() || !sub.LastContact().IsZero() {
		t.Errorf("connected %v last contact %v, want false and never", sub.Connected(), sub.LastContact())
	}
}

func TestNewRejectsBadConsoleURL(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{"", "ftp://console", "http://", "::"} {
		if _, err := subscriber.New(subscriber.Config{ConsoleURL: raw}, engine.New(nil, ""), nil); err == nil {
			t.Errorf("New(%q) succeeded, want error", raw)
		}
	}
}

// TestConsolePingsKeepTheNodeQuiet checks that a node that hears the
// console's keepalive pings sends none of its own, and that it pings a
// console gone quiet once its window passed.
func TestConsolePingsKeepTheNodeQuiet(t *testing.T) {
	t.Parallel()
	c := newConsole(t)
	// A window of 500 ms: on a loaded machine a 10 ms sleep of the
	// console's can take far longer than 10 ms.
	n := startNodePinging(t, c.srv.URL, t.TempDir(), false, 500*time.Millisecond)
	cc := c.accept() // hello read; the console now pings every 10 ms for 1.5 s
	start := n.sub.Pings()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for end := time.Now().Add(1500 * time.Millisecond); time.Now().Before(end); {
		if err := cc.ws.Ping(ctx); err != nil {
			t.Fatalf("console ping: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := n.sub.Pings() - start; got != 0 {
		t.Errorf("the node sent %d pings while the console pinged it every 10 ms, want 0", got)
	}
	// Quiet console: the node pings once its window passed.
	for n.sub.Pings() == start {
		if ctx.Err() != nil {
			t.Fatal("the node never pinged the quiet console")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
