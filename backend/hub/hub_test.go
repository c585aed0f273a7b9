//lint:file-ignore SA1019 Sluice uses nhooyr.io/websocket, deprecated in favour of its maintained twin github.com/coder/websocket

package hub_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"nhooyr.io/websocket"

	"github.com/sluicehq/sluice/backend/hub"
	"github.com/sluicehq/sluice/rules/wire"
)

func TestPushAckAndRegistry(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.startConsole()
	v1 := e.publish("api", domainYAML("api", 10))

	n := e.connect(c.url, wire.Hello{NodeID: "n1", Labels: map[string]string{"zone": "a"}, Build: "b1"})
	snap := n.snapshot()
	if snap.Version != v1 || len(snap.Domains) != 1 || snap.Domains[0].Name != "api" {
		t.Fatalf("first snapshot %d %+v, want version %d with domain api", snap.Version, snap.Domains, v1)
	}
	n.ack(v1)
	waitFor(t, "n1 at v1 in the registry", func() bool {
		got := e.nodes(c.url)["n1"]
		return got.AppliedVersion == v1 && got.Status == "connected"
	})
	got := e.nodes(c.url)["n1"]
	if got.Labels["zone"] != "a" || got.Build != "b1" || got.Console == "" || got.NackVersion != nil {
		t.Errorf("registry row %+v, want labels, build, console and no nack", got)
	}

	// A new version is pushed at once; the versions API counts who runs it.
	v2 := e.publish("api", domainYAML("api", 20))
	if snap := n.snapshot(); snap.Version != v2 {
		t.Fatalf("pushed version %d, want %d", snap.Version, v2)
	}
	n.ack(v2)
	type counted struct {
		Version   int64 `json:"version"`
		AppliedBy *int  `json:"applied_by"`
		Connected *int  `json:"connected"`
	}
	waitFor(t, "versions to count n1 on v2", func() bool {
		var list struct {
			Versions []counted `json:"versions"`
		}
		e.getJSON(c.url+"/api/v1/versions", &list)
		var one struct {
			Version counted `json:"version"`
		}
		e.getJSON(c.url+"/api/v1/versions/1", &one)
		return len(list.Versions) == 2 && list.Versions[0].Version == v2 &&
			list.Versions[0].AppliedBy != nil && *list.Versions[0].AppliedBy == 1 && *list.Versions[0].Connected == 1 &&
			*list.Versions[1].AppliedBy == 0 && one.Version.AppliedBy != nil && *one.Version.AppliedBy == 0 && *one.Version.Connected == 1
	})

	// Reconnecting with the latest version gets nothing to apply: the next
	// message is the next version.
	n.ws.Close(websocket.StatusNormalClosure, "")
	waitFor(t, "n1 disconnected", func() bool { return e.nodes(c.url)["n1"].Status == "disconnected" })
	again := e.connect(c.url, wire.Hello{NodeID: "n1", AppliedVersion: v2})
	v3 := e.publish("api", domainYAML("api", 30))
	if snap := again.snapshot(); snap.Version != v3 {
		t.Fatalf("after reconnect at v%d: got version %d, want %d", v2, snap.Version, v3)
	}
}

func TestNackVisibleAndNotRepushed(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.startConsole()
	v1 := e.publish("api", domainYAML("api", 10))
	n := e.connect(c.url, wire.Hello{NodeID: "n1"})
	if snap := n.snapshot(); snap.Version != v1 {
		t.Fatalf("snapshot %d, want %d", snap.Version, v1)
	}
	n.send(wire.Nack{Type: wire.TypeNack, Version: v1, Error: "domain \"api\": unknown feature"})
	waitFor(t, "the nack in the registry", func() bool {
		got := e.nodes(c.url)["n1"]
		return got.NackVersion != nil && *got.NackVersion == v1 && strings.Contains(got.NackError, "unknown feature")
	})
	var list struct {
		Nodes []apiNode `json:"nodes"`
	}
	e.getJSON(c.url+"/api/v1/nodes?status=connected", &list)
	if len(list.Nodes) != 1 || list.Nodes[0].AppliedVersion != 0 {
		t.Errorf("connected nodes %+v, want n1 still on version 0", list.Nodes)
	}

	// The nacked version is not pushed again on this connection, even when
	// the replica is told about versions again; the next version is.
	e.notifyReplicas(v1)
	e.notifyReplicas(v1)
	v2 := e.publish("web", domainYAML("web", 5))
	if snap := n.snapshot(); snap.Version != v2 {
		t.Fatalf("after the nack got version %d, want %d (never %d again)", snap.Version, v2, v1)
	}
	n.ack(v2)
	waitFor(t, "the ack to clear the nack", func() bool {
		got := e.nodes(c.url)["n1"]
		return got.AppliedVersion == v2 && got.NackVersion == nil && got.NackError == ""
	})
}

func TestStatsRates(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.startConsole()
	e.publish("api", "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, name: per-key}\n")
	v := e.publish("web", "domain: web\ndescriptors:\n  - key: ip\n    rate_limit: {unit: second, requests_per_unit: 1, name: per-ip}\n")
	n := e.connect(c.url, wire.Hello{NodeID: "n1"})
	// A node that connects as v commits may get the version before it
	// first: the console pushes v once it hears of it (NOTIFY).
	snap := n.snapshot()
	for snap.Version < v {
		snap = n.snapshot()
	}
	if snap.Version != v {
		t.Fatalf("snapshot %d, want %d", snap.Version, v)
	}
	n.send(wire.Stats{Type: wire.TypeStats, IntervalMS: 2000, Rules: []wire.RuleStats{
		{Domain: "api", Rule: "per-key", Allowed: 90, Limited: 10, TopLimited: []wire.ValueCount{{Value: "k1", Count: 10}}},
		{Domain: "web", Rule: "per-ip", Allowed: 20},
	}})
	waitFor(t, "rates in the registry", func() bool {
		r := e.nodes(c.url)["n1"].Rates
		return r != nil && r.Decisions == 60 && r.Limited == 5
	})
}

func TestNodeStreamAuth(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.startConsole()
	tests := []struct {
		name   string
		token  string
		status int
	}{
		{"no token", "", http.StatusUnauthorized},
		{"wrong token", "slc_wrong", http.StatusUnauthorized},
		{"admin token", e.adminTok, http.StatusForbidden},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			ws, resp, err := dialWS(ctx, c.url, tt.token)
			if err == nil {
				ws.CloseNow()
				t.Fatal("websocket accepted")
			}
			if resp == nil || resp.StatusCode != tt.status {
				t.Fatalf("dial: %v (response %v), want HTTP %d before the upgrade", err, resp, tt.status)
			}
		})
	}
}

// TestBadNodesClosedAlone checks that each kind of bad node is closed with
// a clear code and reason while a good node on the same console goes on.
func TestBadNodesClosedAlone(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.startConsole()
	good := e.connect(c.url, wire.Hello{NodeID: "good"})

	big, _ := json.Marshal(wire.Stats{Type: wire.TypeStats, IntervalMS: 1000,
		Rules: []wire.RuleStats{{Domain: strings.Repeat("x", wire.MaxNodeMessageBytes)}}})
	tests := []struct {
		name   string
		hello  wire.Hello
		send   []byte // after hello; nil = nothing
		code   websocket.StatusCode
		reason string
	}{
		{"newer protocol", wire.Hello{NodeID: "p", Protocol: wire.ProtocolVersion + 1}, nil, wire.CloseUnsupportedProtocol, "unsupported protocol version 2"},
		{"hello without node id", wire.Hello{}, nil, websocket.StatusPolicyViolation, "node_id is required"},
		{"malformed json", wire.Hello{NodeID: "m"}, []byte(`{"type":"ack",`), websocket.StatusPolicyViolation, "malformed message"},
		{"ack of a version never sent", wire.Hello{NodeID: "a"}, []byte(`{"type":"ack","version":99}`), websocket.StatusPolicyViolation, "not sent"},
		{"hello twice", wire.Hello{NodeID: "h"}, []byte(`{"type":"hello","protocol":1,"node_id":"h"}`), websocket.StatusPolicyViolation, "unexpected hello"},
		{"bad stats", wire.Hello{NodeID: "s"}, []byte(`{"type":"stats","interval_ms":0}`), websocket.StatusPolicyViolation, "interval_ms"},
		{"frame over the limit", wire.Hello{NodeID: "b"}, big, websocket.StatusMessageTooBig, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := e.connect(c.url, tt.hello)
			if tt.send != nil {
				n.sendRawLenient(tt.send)
			}
			err := n.closed()
			var ce websocket.CloseError
			if !errors.As(err, &ce) || ce.Code != tt.code || !strings.Contains(ce.Reason, tt.reason) {
				t.Fatalf("closed with %v, want code %d and reason containing %q", err, tt.code, tt.reason)
			}
		})
	}

	v := e.publish("api", domainYAML("api", 1))
	if snap := good.snapshot(); snap.Version != v {
		t.Fatalf("good node got version %d, want %d", snap.Version, v)
	}
	good.ack(v)
}

// TestSameNodeReplaced checks that a second connection with a node's id
// replaces the first, which is told why.
func TestSameNodeReplaced(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.startConsole()
	first := e.connect(c.url, wire.Hello{NodeID: "n1"})
	waitFor(t, "n1 connected", func() bool { return e.nodes(c.url)["n1"].Status == "connected" })
	second := e.connect(c.url, wire.Hello{NodeID: "n1"})
	var ce websocket.CloseError
	if err := first.closed(); !errors.As(err, &ce) || ce.Code != wire.CloseReplaced {
		t.Fatalf("first connection closed with %v, want code %d", err, wire.CloseReplaced)
	}
	v := e.publish("api", domainYAML("api", 1))
	if snap := second.snapshot(); snap.Version != v {
		t.Fatalf("second connection got %d, want %d", snap.Version, v)
	}
	second.ack(v)
	// The first connection's disconnect must not mark the node offline.
	waitFor(t, "n1 at the new version", func() bool {
		got := e.nodes(c.url)["n1"]
		return got.AppliedVersion == v && got.Status == "connected"
	})
}

// TestSlowNodeDropped has one node that never reads while another acks
// every version: the console drops the stuck node and the other one never
// waits for it.
func TestSlowNodeDropped(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.startConsole()
	fast := e.connect(c.url, wire.Hello{NodeID: "fast"})
	slow := e.connectSilent(c.url, wire.Hello{NodeID: "slow"})
	waitFor(t, "both nodes connected", func() bool {
		nodes := e.nodes(c.url)
		return nodes["fast"].Status == "connected" && nodes["slow"].Status == "connected"
	})
	// Big snapshots fill the socket buffers towards the stuck node (a few
	// MB on loopback) in a few dozen versions; then versions pile up
	// behind a stuck write and it is dropped. 256 KiB each: every version
	// is written to Postgres and read by the fast node too.
	padding := "# " + strings.Repeat("x", 256<<10) + "\n"
	for i := 1; ; i++ {
		v := e.publish("api", padding+domainYAML("api", i))
		if snap := fast.snapshot(); snap.Version != v {
			t.Fatalf("fast node got version %d, want %d", snap.Version, v)
		}
		fast.ack(v)
		if e.nodes(c.url)["slow"].Status == "disconnected" {
			break
		}
		if i == 200 { // 50 MB
			t.Fatal("the stuck node was never dropped")
		}
	}
	_ = slow
}

// TestKeepalive checks that the console pings only quiet nodes: a node
// that neither reads (so never answers a ping) nor writes is dropped after
// its keepalive window and the ping timeout and shows disconnected, while
// one that never reads but sends stats stays, as its messages show it is
// alive, and so does one that sends nothing but its own keepalive pings,
// with a last_seen that follows them, and a quiet one that sends nothing
// but the pongs to the console's pings (as enforcer/subscriber does).
func TestKeepalive(t *testing.T) {
	// Not parallel: it sets the hub's keepalive, a package variable.
	e := newEnv(t)
	t.Cleanup(hub.SetKeepalive(200*time.Millisecond, 200*time.Millisecond)) // runs after the console stopped
	c := e.startConsole()
	mute := e.connectSilent(c.url, wire.Hello{NodeID: "mute"})
	talker := e.connectSilent(c.url, wire.Hello{NodeID: "talker"})
	idle := e.connect(c.url, wire.Hello{NodeID: "idle"}) // reads, so its pings get their pongs
	e.connect(c.url, wire.Hello{NodeID: "quiet"})        // reads, so it answers the console's pings
	stats, _ := json.Marshal(wire.Stats{Type: wire.TypeStats, IntervalMS: 1000})
	stop := make(chan struct{})
	talking := make(chan struct{})
	pings := make(chan error, 1)
	go func() {
		defer close(talking)
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
				talker.sendRawLenient(stats)
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				if err := idle.ws.Ping(ctx); err != nil {
					select {
					case pings <- err:
					default:
					}
				}
				cancel()
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-talking })
	_ = mute
	waitFor(t, "the mute node dropped", func() bool { return e.nodes(c.url)["mute"].Status == "disconnected" })
	// Ten keepalive windows: a ping to the talker would have gone
	// unanswered, and the idle node would have been dropped had its pings
	// not counted.
	time.Sleep(2 * time.Second)
	nodes := e.nodes(c.url)
	for _, id := range []string{"talker", "idle", "quiet"} {
		if got := nodes[id].Status; got != "connected" {
			t.Errorf("node %s is %q, want connected", id, got)
		}
	}
	if seen := time.Since(nodes["idle"].LastSeen); seen > time.Second {
		t.Errorf("the idle node was last seen %v ago, want its last ping (50 ms)", seen)
	}
	if seen := time.Since(nodes["quiet"].LastSeen); seen > time.Second {
		t.Errorf("the quiet node was last seen %v ago, want its last pong (at most 250 ms)", seen)
	}
	select {
	case err := <-pings:
		t.Errorf("the idle node's ping: %v", err)
	default:
	}
}
