//lint:file-ignore SA1019 Sluice uses nhooyr.io/websocket, deprecated in favour of its maintained twin github.com/coder/websocket

package enforcer

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"nhooyr.io/websocket"

	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/enforcer/limiter"
	"github.com/sluicehq/sluice/enforcer/node"
	"github.com/sluicehq/sluice/enforcer/subscriber"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/rules/wire"
)

// faultFor is how long TestConsoleFaultsUnderLoad keeps each fault on. A
// half-open connection is noticed by the node's keepalive only after its
// ping times out (10 s): measure it with
// go test -count=1 -run 'TestConsoleFaultsUnderLoad/half-open' -v ./enforcer/ -args -fault=15s
var faultFor = flag.Duration("fault", time.Second, "how long TestConsoleFaultsUnderLoad keeps each fault on")

// fakeConsole speaks the push protocol's console side over real
// websockets: a snapshot of the current version to every node behind it,
// on connect and on publish. It counts the TCP connections it accepts.
type fakeConsole struct {
	t     *testing.T
	srv   *httptest.Server
	conns atomic.Int64

	mu      sync.Mutex
	version int64
	live    map[*websocket.Conn]bool
}

func newFakeConsole(t *testing.T) *fakeConsole {
	c := &fakeConsole{t: t, live: map[*websocket.Conn]bool{}}
	c.srv = httptest.NewUnstartedServer(http.HandlerFunc(c.serve))
	c.srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			c.conns.Add(1)
		}
	}
	c.srv.Start()
	t.Cleanup(c.srv.Close)
	return c
}

func (c *fakeConsole) snapshot() []byte {
	c.mu.Lock()
	v := c.version
	c.mu.Unlock()
	domains := []wire.DomainConfig{{Name: "api", YAML: fmt.Sprintf(
		"domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: %d}\n", 1_000_000*v)}}
	data, err := json.Marshal(wire.Snapshot{Type: wire.TypeSnapshot, Version: v, Checksum: wire.Checksum(domains), Domains: domains, NodeCount: 1})
	if err != nil {
		c.t.Error(err)
	}
	return data
}

func (c *fakeConsole) serve(w http.ResponseWriter, r *http.Request) {
	ws, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	defer ws.CloseNow()
	ctx := r.Context()
	if _, _, err := ws.Read(ctx); err != nil { // hello
		return
	}
	c.mu.Lock()
	c.live[ws] = true
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.live, ws)
		c.mu.Unlock()
	}()
	c.write(ws, c.snapshot())
	for {
		if _, _, err := ws.Read(ctx); err != nil { // acks
			return
		}
	}
}

func (c *fakeConsole) write(ws *websocket.Conn, data []byte) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = ws.Write(ctx, websocket.MessageText, data) // a node that misses it gets it on reconnect
}

// publish makes v the current version and sends it to every live node.
func (c *fakeConsole) publish(v int64) {
	c.mu.Lock()
	c.version = v
	var live []*websocket.Conn
	for ws := range c.live {
		live = append(live, ws)
	}
	c.mu.Unlock()
	data := c.snapshot()
	for _, ws := range live {
		go c.write(ws, data)
	}
}

// TestConsoleFaultsUnderLoad degrades the push channel (a real subscriber
// through an in-process toxiproxy to a console) while the node checks
// requests against Redis and the console publishes a new version: the
// node enforces its last-known-good version throughout, reconnects with
// backoff (no storm), and has the new version soon after the fault is gone.
func TestConsoleFaultsUnderLoad(t *testing.T) {
	// Not parallel: it asserts latencies under load.
	if testing.Short() {
		t.Skip("fault test puts load through a proxy")
	}
	fault := *faultFor
	for _, tt := range []struct {
		name   string
		toxics [][2]string // type, stream
		attrs  map[string]any
	}{
		{"reset peer", [][2]string{{"reset_peer", "upstream"}, {"reset_peer", "downstream"}}, map[string]any{"timeout": 0}},
		{"half-open", [][2]string{{"timeout", "upstream"}, {"timeout", "downstream"}}, map[string]any{"timeout": 0}},
		{"latency 300ms", [][2]string{{"latency", "upstream"}, {"latency", "downstream"}}, map[string]any{"latency": 300}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			console := newFakeConsole(t)
			console.publish(1)
			proxy := testenv.StartToxiproxy(t, console.srv.Listener.Addr().String())
			client, err := limiter.NewClient(testenv.RedisURL(t))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { client.Close() })
			eng := node.NewEngine(limiter.NewRedis(client), testenv.KeyPrefix(t), discard)
			sub, err := subscriber.New(subscriber.Config{ConsoleURL: "http://" + proxy.Addr(), NodeToken: "t", NodeID: "n1",
				PingInterval: 100 * time.Millisecond, MinBackoff: 20 * time.Millisecond, MaxBackoff: 500 * time.Millisecond}, eng, discard)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- sub.Run(ctx) }()
			t.Cleanup(func() {
				cancel()
				<-done
			})
			waitUntil(t, 5*time.Second, "node on v1", func() bool { return eng.Version() == 1 })

			// Checks all along: every one must be decided by the rules.
			stop := make(chan struct{})
			var checks, unruled, storeErrs atomic.Int64
			var noticed atomic.Int64 // ns after the fault when the node first saw itself disconnected
			var cut time.Time
			var wg sync.WaitGroup
			wg.Go(func() {
				req := engine.Request{Domain: "api", Descriptors: []engine.Descriptor{{Entries: []rules.Entry{{Key: "k", Value: "v"}}}}}
				for {
					select {
					case <-stop:
						return
					default:
					}
					res, err := eng.Check(context.Background(), req)
					checks.Add(1)
					if !sub.Connected() && noticed.Load() == 0 {
						noticed.Store(int64(time.Since(cut)))
					}
					if err != nil || len(res.Statuses) == 0 || res.Statuses[0].Limit == nil {
						unruled.Add(1)
					}
					if res.StoreErr != nil { // the shared Redis on a loaded machine, not the push channel
						storeErrs.Add(1)
					}
					time.Sleep(time.Millisecond)
				}
			})

			before := console.conns.Load()
			cut = time.Now()
			for i, tx := range tt.toxics {
				proxy.AddToxic(fmt.Sprint("fault", i), tx[0], tx[1], tt.attrs)
			}
			console.publish(2)
			time.Sleep(fault)
			during := console.conns.Load() - before
			for i := range tt.toxics {
				proxy.RemoveToxic(fmt.Sprint("fault", i))
			}
			removed := time.Now()
			waitUntil(t, 30*time.Second, "node on v2", func() bool { return eng.Version() == 2 })
			caughtUp := time.Since(removed)
			close(stop)
			wg.Wait()
			seen := "never disconnected"
			if n := noticed.Load(); n > 0 {
				seen = fmt.Sprintf("saw itself disconnected %v after the fault began", time.Duration(n).Round(time.Millisecond))
			}
			t.Logf("%s: node %s; %d connections during the %v fault; v2 applied %v after the fault was removed; %d checks, %d not decided by the rules (%d store timeouts)",
				tt.name, seen, during, fault, caughtUp.Round(time.Millisecond), checks.Load(), unruled.Load(), storeErrs.Load())
			if n := unruled.Load(); n > 0 {
				t.Errorf("%d of %d checks were not decided by the last-known-good rules", n, checks.Load())
			}
			// Backoff from 20 ms doubling to 500 ms with full jitter: the
			// first second's delays average about 0.6 s in all, so 6–10
			// dials (a draw of short delays can make more); with no
			// backoff it would be hundreds. 20 a second is the storm line.
			if limit := 20 * int64(max(fault/time.Second, 1)); during > limit {
				t.Errorf("%d connections in %v of fault: a reconnect storm", during, fault)
			}
		})
	}
}

// waitUntil polls cond every 5 ms until it holds, failing the test after
// timeout.
func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
