//lint:file-ignore SA1019 nhooyr.io/websocket is the websocket library the product card fixes (its maintained twin is github.com/coder/websocket)

package hub_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"

	"nhooyr.io/websocket"

	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/rules/wire"
)

// stored returns node id's row as Postgres holds it (not the hub's memory).
func (e *env) stored(id string) (nackError string, applied int64, ok bool) {
	e.t.Helper()
	nodes, err := e.st.ListNodes(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	for _, n := range nodes {
		if n.ID == id {
			return n.NackError, n.AppliedVersion, true
		}
	}
	return "", 0, false
}

// TestNULCannotPoisonTheRegistry (issue 13): a hello with U+0000 in any
// stored field is refused with a policy-violation close and the reason; a
// nack whose error holds NUL or invalid UTF-8 is stored cleaned; and the
// other nodes' acks keep reaching Postgres.
func TestNULCannotPoisonTheRegistry(t *testing.T) {
	e := newEnv(t)
	c := e.startConsole()
	v1 := e.publish("api", domainYAML("api", 10))

	for _, tt := range []struct {
		name   string
		hello  wire.Hello
		reason string
	}{
		{"node id", wire.Hello{NodeID: "evil\x00"}, "node_id must be valid UTF-8 without NUL"},
		{"label key", wire.Hello{NodeID: "evil", Labels: map[string]string{"zone\x00": "a"}}, "without NUL"},
		{"label value", wire.Hello{NodeID: "evil", Labels: map[string]string{"zone": "a\x00"}}, "without NUL"},
		{"build", wire.Hello{NodeID: "evil", Build: "b\x00"}, "build must be valid UTF-8 without NUL"},
	} {
		// No subtests: the node helpers fail the test they were made with.
		err := e.connect(c.url, tt.hello).closed()
		var ce websocket.CloseError
		if !errors.As(err, &ce) || ce.Code != websocket.StatusPolicyViolation || !strings.Contains(ce.Reason, tt.reason) {
			t.Errorf("NUL in the %s: closed with %v, want policy violation with reason containing %q", tt.name, err, tt.reason)
		}
	}

	bad := e.connect(c.url, wire.Hello{NodeID: "nacker"})
	if snap := bad.snapshot(); snap.Version != v1 {
		t.Fatalf("snapshot %d, want %d", snap.Version, v1)
	}
	bad.sendRaw([]byte(`{"type":"nack","version":1,"error":"bad\u0000yaml \ud800"}`))

	good := e.connect(c.url, wire.Hello{NodeID: "good", Labels: map[string]string{"zone": "a"}})
	if snap := good.snapshot(); snap.Version != v1 {
		t.Fatalf("snapshot %d, want %d", snap.Version, v1)
	}
	good.ack(v1)
	waitFor(t, "the good node's ack and the cleaned nack in Postgres", func() bool {
		_, applied, okGood := e.stored("good")
		nack, _, okBad := e.stored("nacker")
		return okGood && applied == v1 && okBad && nack == "bad\uFFFDyaml \uFFFD"
	})
	for id := range e.nodes(c.url) {
		if strings.HasPrefix(id, "evil") {
			t.Errorf("refused node %q is in the registry", id)
		}
	}
}

// TestNodeNacksOversizedSnapshot (issue 13): a version whose snapshot is
// over what nodes read (written before the console refused such publishes)
// is nacked by a real node with the reason, which the registry shows; the
// node stays connected on its version and takes the next one that fits.
func TestNodeNacksOversizedSnapshot(t *testing.T) {
	e := newEnv(t)
	c := e.startConsole()
	v1 := e.publish("api", domainYAML("api", 10))
	n := e.startNode(c.url, "n1", t.TempDir())
	waitFor(t, "n1 on v1", func() bool { return n.eng.Version() == v1 })

	// Version 2, as a console without the bound would have written it.
	db, err := sql.Open("pgx", e.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	domains := []wire.DomainConfig{{Name: "api", YAML: domainYAML("api", 10)}}
	for i := range 17 {
		d := wire.DomainConfig{Name: fmt.Sprintf("d%02d", i), YAML: domainYAML(fmt.Sprintf("d%02d", i), 1) + "# " + strings.Repeat("x", 1<<20)}
		domains = append(domains, d)
		if _, err := tx.Exec("INSERT INTO domain_revisions (version, domain, yaml) VALUES (2, $1, $2)", d.Name, d.YAML); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tx.Exec("INSERT INTO versions (version, author, message, checksum) VALUES (2, 'test', 'too big', $1)", wire.Checksum(domains)); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec("UPDATE ruleset_head SET version = 2"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}

	waitFor(t, "the nack of v2 in the registry", func() bool {
		got := e.nodes(c.url)["n1"]
		return got.NackVersion != nil && *got.NackVersion == 2 && strings.Contains(got.NackError, "this node accepts") &&
			got.Status == "connected" && got.AppliedVersion == v1
	})
	waitFor(t, "the nack's reason in Postgres", func() bool {
		nack, _, _ := e.stored("n1")
		return strings.Contains(nack, "snapshot of version 2 is")
	})
	if !n.sub.Connected() || n.eng.Version() != v1 {
		t.Errorf("node connected %v at version %d, want connected at %d", n.sub.Connected(), n.eng.Version(), v1)
	}

	v3, err := e.st.Publish(context.Background(), store.Change{Kind: store.KindRollback, RollbackTo: v1, Message: "back", Actor: store.Actor{Name: "test"}})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "n1 on v3", func() bool { return n.eng.Version() == v3 })
}

// TestNodeTokenBoundToOneNodeID (issue 13, defect 9): a node token is bound
// to the node id it first connects with. Its holder cannot connect as
// another node id, and a token bound elsewhere cannot take over a node id:
// both are closed with wire.CloseNodeBound and the reason, and the node that
// owns the id stays connected. Disabling the token frees the id for a new
// one, which is how an admin re-binds a node id.
func TestNodeTokenBoundToOneNodeID(t *testing.T) {
	e := newEnv(t)
	c := e.startConsole()
	v1 := e.publish("api", domainYAML("api", 10))

	tok := e.nodeToken("edge-1")
	first := e.connect(c.url, wire.Hello{NodeID: "edge-1"})
	if snap := first.snapshot(); snap.Version != v1 {
		t.Fatalf("snapshot %d, want %d", snap.Version, v1)
	}
	refused := func(what string, n *node, reason string) {
		t.Helper()
		err := n.closed()
		var ce websocket.CloseError
		if !errors.As(err, &ce) || ce.Code != wire.CloseNodeBound || !strings.Contains(ce.Reason, reason) {
			t.Errorf("%s: closed with %v, want code %d with reason containing %q", what, err, wire.CloseNodeBound, reason)
		}
	}
	refused("edge-1's token as edge-2", e.connectWith(c.url, tok, wire.Hello{NodeID: "edge-2"}),
		`this node token is bound to node id "edge-1", not "edge-2"`)
	other := e.nodeToken("edge-2")
	refused("edge-2's fresh token as edge-1", e.connectWith(c.url, other, wire.Hello{NodeID: "edge-1"}),
		`node id "edge-1" is bound to another node token`)

	// edge-1 kept its connection: it gets the next version.
	v2 := e.publish("api", domainYAML("api", 20))
	if snap := first.snapshot(); snap.Version != v2 {
		t.Fatalf("edge-1 after the refused takeovers: snapshot %d, want %d", snap.Version, v2)
	}
	first.ack(v2)
	if n := e.nodes(c.url)["edge-1"]; n.Status != store.NodeConnected {
		t.Errorf("edge-1 is %q, want connected", n.Status)
	}
	// The refused fresh token was not bound by its failed claim.
	second := e.connectWith(c.url, other, wire.Hello{NodeID: "edge-2"})
	if snap := second.snapshot(); snap.Version != v2 {
		t.Fatalf("edge-2 with its own token: snapshot %d, want %d", snap.Version, v2)
	}

	// Re-binding: disable edge-1's token, and a new token may claim edge-1.
	ctx := context.Background()
	toks, err := e.st.ListTokens(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, tk := range toks {
		if tk.NodeID != nil && *tk.NodeID == "edge-1" {
			if _, err := e.st.DisableToken(ctx, tk.ID, store.Actor{Name: "test"}); err != nil {
				t.Fatal(err)
			}
		}
	}
	_, fresh, err := e.st.CreateToken(ctx, "edge-1 again", store.RoleNode, nil, store.Actor{Name: "test"})
	if err != nil {
		t.Fatal(err)
	}
	again := e.connectWith(c.url, fresh, wire.Hello{NodeID: "edge-1"})
	if snap := again.snapshot(); snap.Version != v2 {
		t.Fatalf("edge-1 with a new token after the old one was disabled: snapshot %d, want %d", snap.Version, v2)
	}
}
