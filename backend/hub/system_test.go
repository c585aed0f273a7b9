package hub_test

// End-to-end tests of the push channel: real consoles (backend.Run, in
// process or in a child process), real enforcer subscribers and engines,
// one real Postgres. They import the node's subscriber only as a test
// client; the console code never does.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/enforcer/subscriber"
)

// enforcerNode is a real subscriber applying to a real engine.
type enforcerNode struct {
	eng  *engine.Engine
	sub  *subscriber.Subscriber
	stop func()
}

func (e *env) startNode(consoleURLs, id, stateDir string) *enforcerNode {
	e.t.Helper()
	eng := engine.New(nil, "")
	sub, err := subscriber.New(subscriber.Config{ConsoleURL: consoleURLs, NodeToken: e.nodeToken(id), NodeID: id,
		StateDir: stateDir, MinBackoff: 10 * time.Millisecond, MaxBackoff: 200 * time.Millisecond}, eng, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := sub.LoadState(); err != nil && err != subscriber.ErrNoState {
		e.t.Fatalf("load state: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx) }()
	var once sync.Once
	n := &enforcerNode{eng: eng, sub: sub}
	n.stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				e.t.Errorf("node %s: %v", id, err)
			}
		})
	}
	e.t.Cleanup(n.stop)
	return n
}

// put publishes through a console's API, as an operator would.
func (e *env) put(baseURL, domain, yaml string, base int64) int64 {
	e.t.Helper()
	body, _ := json.Marshal(map[string]any{"yaml": yaml, "message": "test", "base_version": base})
	req, _ := http.NewRequest("PUT", baseURL+"/api/v1/domains/"+domain, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+e.adminTok)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out struct {
		Version int64 `json:"version"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &out) != nil {
		e.t.Fatalf("PUT %s: %d %s", domain, resp.StatusCode, b)
	}
	return out.Version
}

// TestConsoleKilledAndRestarted SIGKILLs the console while versions are
// being published: the node keeps enforcing, reconnects when the console
// is back and catches up with what was published meanwhile.
func TestConsoleKilledAndRestarted(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p := e.startConsoleProcess("127.0.0.1:0")
	v1 := e.publish("api", domainYAML("api", 1))
	n := e.startNode(p.url, "n1", t.TempDir())
	waitFor(t, "n1 on v1", func() bool { return n.eng.Version() == v1 })

	// Killed mid-stream: a version is on its way as the console dies.
	e.publish("api", domainYAML("api", 2))
	p.kill()
	e.publish("api", domainYAML("api", 3))
	v4 := e.publish("web", domainYAML("web", 4))
	if n.eng.Version() < v1 || !n.eng.HasDomain("api") {
		t.Fatalf("node lost its rules with the console down: version %d", n.eng.Version())
	}

	restarted := e.startConsoleProcess(p.addr)
	waitFor(t, "n1 to catch up to v4", func() bool { return n.eng.Version() == v4 && n.eng.HasDomain("web") })
	waitFor(t, "the restarted console to show n1 on v4", func() bool {
		got := e.nodes(restarted.url)["n1"]
		return got.AppliedVersion == v4 && got.Status == "connected"
	})
}

// TestConsoleRestartReacksEveryNode restarts a console gracefully under
// restartNodes real subscribers, with a version published while it is
// down: every node comes back to the new console, applies that version,
// and the registry shows every one connected on it (each ack reached
// Postgres). BenchmarkPush's restart/nodes=10000 runs the same at fleet
// size and reports its time.
func TestConsoleRestartReacksEveryNode(t *testing.T) {
	t.Parallel()
	const restartNodes = 1000
	e := newEnv(t)
	log := slog.New(slog.DiscardHandler)
	c := e.startConsoleAt("127.0.0.1:0", log)
	v1 := e.publish("api", domainYAML("api", 1))
	nodes := make([]*enforcerNode, restartNodes)
	for i := range nodes {
		nodes[i] = e.startNode(c.url, fmt.Sprintf("n%03d", i), "")
	}
	allOn := func(v int64) func() bool {
		return func() bool {
			for _, n := range nodes {
				if n.eng.Version() != v {
					return false
				}
			}
			return true
		}
	}
	waitFor(t, "every node on v1", allOn(v1))

	c.stop() // going away: the nodes reconnect within their backoff
	v2 := e.publish("api", domainYAML("api", 2))
	back := e.startConsoleAt(strings.TrimPrefix(c.url, "http://"), log)
	waitFor(t, "every node on v2", allOn(v2))
	waitFor(t, "the registry to show every node connected on v2", func() bool {
		reg := e.nodes(back.url)
		for i := range nodes {
			if n := reg[fmt.Sprintf("n%03d", i)]; n.Status != "connected" || n.AppliedVersion != v2 {
				return false
			}
		}
		return true
	})
}

// TestNodeOfflineCatchesUp stops a node for three publishes: restarted, it
// enforces its saved version at once and then moves to the latest.
func TestNodeOfflineCatchesUp(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.startConsole()
	dir := t.TempDir()
	v1 := e.publish("api", domainYAML("api", 1))
	n := e.startNode(c.url, "n1", dir)
	waitFor(t, "n1 on v1", func() bool { return n.eng.Version() == v1 })
	n.stop()
	waitFor(t, "n1 disconnected", func() bool { return e.nodes(c.url)["n1"].Status == "disconnected" })

	e.publish("api", domainYAML("api", 2))
	e.publish("web", domainYAML("web", 3))
	v4 := e.publish("api", domainYAML("api", 4))

	back := e.startNode(c.url, "n1", dir)
	if v := back.eng.Version(); v < v1 {
		t.Fatalf("restarted node enforces version %d, want its saved %d at once", v, v1)
	}
	waitFor(t, "n1 to catch up to v4", func() bool { return back.eng.Version() == v4 && back.eng.HasDomain("web") })
	waitFor(t, "the registry to show n1 on v4", func() bool {
		got := e.nodes(c.url)["n1"]
		return got.AppliedVersion == v4 && got.Status == "connected"
	})
}

// TestTwoReplicas runs two consoles on one database with nodes on each and
// one node that knows both: a publish on either replica reaches every node,
// and when a replica stops, its nodes that know the other move there.
func TestTwoReplicas(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c1, c2 := e.startConsole(), e.startConsole()
	a := e.startNode(c1.url, "a", t.TempDir())
	b := e.startNode(c2.url, "b", t.TempDir())
	both := e.startNode(c1.url+","+c2.url, "both", t.TempDir())

	v1 := e.put(c1.url, "api", domainYAML("api", 1), 0)
	waitFor(t, "every node on v1", func() bool {
		return a.eng.Version() == v1 && b.eng.Version() == v1 && both.eng.Version() == v1
	})
	var first map[string]apiNode
	waitFor(t, "the second replica to show every node on v1", func() bool {
		first = e.nodes(c2.url)
		for _, id := range []string{"a", "b", "both"} {
			if n := first[id]; n.AppliedVersion != v1 || n.Status != "connected" {
				return false
			}
		}
		return true
	})
	if first["a"].Console == first["b"].Console || first["both"].Console != first["a"].Console {
		t.Fatalf("consoles a=%q b=%q both=%q, want a and both on the first replica, b on the second",
			first["a"].Console, first["b"].Console, first["both"].Console)
	}

	c1.stop()
	waitFor(t, "node both to move to the second replica", func() bool {
		n := e.nodes(c2.url)["both"]
		return n.Status == "connected" && n.Console == first["b"].Console
	})
	v2 := e.put(c2.url, "api", domainYAML("api", 2), v1)
	waitFor(t, "b and both on v2", func() bool { return b.eng.Version() == v2 && both.eng.Version() == v2 })
	if a.eng.Version() != v1 {
		t.Errorf("node a, whose only console is down, runs %d; want it to keep v%d", a.eng.Version(), v1)
	}
	waitFor(t, "the registry: a offline on v1, the others on v2, counted by version", func() bool {
		nodes := e.nodes(c2.url)
		var versions struct {
			Versions []struct {
				Version   int64 `json:"version"`
				AppliedBy *int  `json:"applied_by"`
				Connected *int  `json:"connected"`
			} `json:"versions"`
		}
		e.getJSON(c2.url+"/api/v1/versions", &versions)
		latest := versions.Versions[0]
		return nodes["a"].Status == "disconnected" && nodes["a"].AppliedVersion == v1 &&
			nodes["b"].AppliedVersion == v2 && nodes["both"].AppliedVersion == v2 &&
			latest.Version == v2 && latest.AppliedBy != nil && *latest.AppliedBy == 2 && *latest.Connected == 2
	})
}
