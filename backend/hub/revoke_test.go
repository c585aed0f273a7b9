//lint:file-ignore SA1019 Sluice uses nhooyr.io/websocket, deprecated in favour of its maintained twin github.com/coder/websocket

package hub_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"nhooyr.io/websocket"

	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/rules/wire"
)

// TestRevokedNodeTokenClosed: disabling or rotating a node token closes
// its open connection with CloseRevoked, and a version published after the
// disable never reaches it, while a node with a live token goes on.
func TestRevokedNodeTokenClosed(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.startConsole()
	v1 := e.publish("api", domainYAML("api", 10))
	ctx := context.Background()
	sys := store.Actor{Name: "test"}

	tokens := map[string]int64{}
	for _, id := range []string{"disabled", "rotated", "kept"} {
		tok, secret, err := e.st.CreateToken(ctx, "node "+id, store.RoleNode, nil, sys)
		if err != nil {
			t.Fatal(err)
		}
		tokens[id] = tok.ID
		e.tokens[id] = secret
	}
	nodes := map[string]*node{}
	for id := range tokens {
		nodes[id] = e.connect(c.url, wire.Hello{NodeID: id})
		if snap := nodes[id].snapshot(); snap.Version != v1 {
			t.Fatalf("%s: first snapshot %d, want %d", id, snap.Version, v1)
		}
		nodes[id].ack(v1)
	}

	if _, err := e.st.DisableToken(ctx, tokens["disabled"], sys); err != nil {
		t.Fatal(err)
	}
	// Published before the periodic check can have run: the push itself
	// must check first.
	v2 := e.publish("api", domainYAML("api", 20))
	if snap := nodes["kept"].snapshot(); snap.Version != v2 {
		t.Fatalf("kept: snapshot %d, want %d", snap.Version, v2)
	}
	if snap := nodes["rotated"].snapshot(); snap.Version != v2 {
		t.Fatalf("rotated: snapshot %d, want %d", snap.Version, v2)
	}
	assertRevoked(t, "disabled", nodes["disabled"])

	if _, _, err := e.st.RotateToken(ctx, tokens["rotated"], sys); err != nil {
		t.Fatal(err)
	}
	// No publish now: the periodic check closes it.
	assertRevoked(t, "rotated", nodes["rotated"])
	v3 := e.publish("api", domainYAML("api", 30))
	if snap := nodes["kept"].snapshot(); snap.Version != v3 {
		t.Fatalf("kept: snapshot %d, want %d", snap.Version, v3)
	}
}

// TestNodeTokenExpiryAndSQLChangesSeen: the periodic check reads every
// node's token only after a token or user change (or an expiry it knows
// of): a token that expires closes its connection, a connection opened
// after the last full check is checked too, and a change made through SQL
// (as by another replica or an admin's script) is seen.
func TestNodeTokenExpiryAndSQLChangesSeen(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.startConsole()
	v1 := e.publish("api", domainYAML("api", 10))
	ctx := context.Background()
	sys := store.Actor{Name: "test"}
	kept := e.connect(c.url, wire.Hello{NodeID: "kept"})
	kept.snapshot()
	// Its expiry is learnt by the check of the connections opened since
	// the last full one (or by a full one, whichever runs first).
	soon := time.Now().Add(2 * time.Second)
	_, expiring, err := e.st.CreateToken(ctx, "node expiring", store.RoleNode, &soon, sys)
	if err != nil {
		t.Fatal(err)
	}
	e.tokens["expiring"] = expiring
	exp := e.connect(c.url, wire.Hello{NodeID: "expiring"})
	if snap := exp.snapshot(); snap.Version != v1 {
		t.Fatalf("expiring: snapshot %d, want %d", snap.Version, v1)
	}
	assertRevoked(t, "expiring", exp)

	tok, sqlTok, err := e.st.CreateToken(ctx, "node sql", store.RoleNode, nil, sys)
	if err != nil {
		t.Fatal(err)
	}
	e.tokens["sql"] = sqlTok
	viaSQL := e.connect(c.url, wire.Hello{NodeID: "sql"})
	viaSQL.snapshot()
	db, err := sql.Open("pgx", e.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, "UPDATE api_tokens SET disabled = true WHERE id = $1", tok.ID); err != nil {
		t.Fatal(err)
	}
	assertRevoked(t, "sql", viaSQL)
	v2 := e.publish("api", domainYAML("api", 20))
	if snap := kept.snapshot(); snap.Version != v2 {
		t.Fatalf("kept: snapshot %d, want %d", snap.Version, v2)
	}
}

// assertRevoked waits for n to be closed with CloseRevoked, failing if a
// snapshot arrives first.
func assertRevoked(t *testing.T, name string, n *node) {
	t.Helper()
	deadline := time.After(15 * time.Second)
	for open := true; open; {
		select {
		case msg, ok := <-n.in:
			if snap, isSnap := msg.(*wire.Snapshot); ok && isSnap {
				t.Errorf("%s: got snapshot %d after its token was revoked", name, snap.Version)
			}
			open = ok
		case <-deadline:
			t.Fatalf("%s: still connected 15 s after its token was revoked", name)
		}
	}
	if got := websocket.CloseStatus(n.err); got != wire.CloseRevoked {
		t.Errorf("%s: closed with %v (%v), want %d", name, got, n.err, wire.CloseRevoked)
	}
}

// TestFleetToken: any node id may connect with a fleet node token, but not
// one that is connected already (to this replica or another), nor one
// bound to a token of its own; the registry names the token each node
// connected with.
func TestFleetToken(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.startConsole()
	c2 := e.startConsole() // a second replica on the same database
	v1 := e.publish("api", domainYAML("api", 10))
	ctx := context.Background()
	fleetTok, fleet, err := e.st.CreateScopedToken(ctx, store.TokenSpec{Name: "enforcers", Role: store.RoleNode, Fleet: true}, store.Actor{Name: "test"})
	if err != nil {
		t.Fatal(err)
	}
	a := e.connectWith(c.url, fleet, wire.Hello{NodeID: "pod-a"})
	b := e.connectWith(c.url, fleet, wire.Hello{NodeID: "pod-b"})
	pc := e.connectWith(c2.url, fleet, wire.Hello{NodeID: "pod-c"})
	for _, n := range []*node{a, b, pc} {
		if snap := n.snapshot(); snap.Version != v1 {
			t.Fatalf("snapshot %d, want %d", snap.Version, v1)
		}
	}
	dup := e.connectWith(c.url, fleet, wire.Hello{NodeID: "pod-a"})
	if err := dup.closed(); websocket.CloseStatus(err) != wire.CloseDuplicateNode {
		t.Errorf("second pod-a: closed with %v, want %d", err, wire.CloseDuplicateNode)
	}
	// pod-a is connected to the first replica: the second refuses it too,
	// once the registry shows it.
	waitFor(t, "pod-a in the registry", func() bool { n := e.nodes(c2.url)["pod-a"]; return n.Status == "connected" })
	dup2 := e.connectWith(c2.url, fleet, wire.Hello{NodeID: "pod-a"})
	if err := dup2.closed(); websocket.CloseStatus(err) != wire.CloseDuplicateNode {
		t.Errorf("pod-a on the other replica: closed with %v, want %d", err, wire.CloseDuplicateNode)
	}
	// The first pod-a is still there.
	v2 := e.publish("api", domainYAML("api", 20))
	if snap := a.snapshot(); snap.Version != v2 {
		t.Errorf("pod-a after the duplicates: snapshot %d, want %d", snap.Version, v2)
	}
	// An id bound to a dedicated token is not the fleet's.
	e.connect(c.url, wire.Hello{NodeID: "dedicated"}).snapshot()
	taken := e.connectWith(c.url, fleet, wire.Hello{NodeID: "dedicated"})
	if err := taken.closed(); websocket.CloseStatus(err) != wire.CloseNodeBound {
		t.Errorf("fleet token as a bound id: closed with %v, want %d", err, wire.CloseNodeBound)
	}
	// Both replicas name the token each node used: the fleet token for the
	// three pods, the dedicated node's own for it.
	for _, url := range []string{c.url, c2.url} {
		waitFor(t, "every node's token in the registry", func() bool {
			nodes := e.nodes(url)
			for _, id := range []string{"pod-a", "pod-b", "pod-c"} {
				if n := nodes[id]; n.TokenID == nil || *n.TokenID != fleetTok.ID || n.TokenName == nil || *n.TokenName != "enforcers" {
					return false
				}
			}
			d := nodes["dedicated"]
			return d.TokenID != nil && *d.TokenID != fleetTok.ID && d.TokenName != nil && *d.TokenName != "enforcers"
		})
	}
	// Once pod-b leaves, its id is free again.
	b.ws.Close(websocket.StatusNormalClosure, "")
	waitFor(t, "pod-b disconnected", func() bool { return e.nodes(c.url)["pod-b"].Status == "disconnected" })
	if snap := e.connectWith(c2.url, fleet, wire.Hello{NodeID: "pod-b", AppliedVersion: 0}).snapshot(); snap.Version != v2 {
		t.Errorf("pod-b again: snapshot %d, want %d", snap.Version, v2)
	}
	var listed struct {
		Tokens []struct {
			Fleet  bool    `json:"fleet"`
			NodeID *string `json:"node_id"`
		} `json:"tokens"`
	}
	e.getJSON(c.url+"/api/v1/tokens", &listed)
	for _, tok := range listed.Tokens {
		if tok.Fleet && tok.NodeID != nil {
			t.Errorf("fleet token bound to %q, want it never bound", *tok.NodeID)
		}
	}
	// Disabling the fleet token closes its nodes on every replica.
	if _, err := e.st.DisableToken(ctx, fleetTok.ID, store.Actor{Name: "test"}); err != nil {
		t.Fatal(err)
	}
	for name, n := range map[string]*node{"pod-a": a, "pod-c": pc} {
		if err := n.closed(); websocket.CloseStatus(err) != wire.CloseRevoked {
			t.Errorf("%s after its fleet token was disabled: closed with %v, want %d", name, err, wire.CloseRevoked)
		}
	}
}

// TestFleetNodeIDOnTwoReplicasAtOnce: two nodes saying hello with one
// fleet token as one node id to two replicas, the second right after the
// first (well before a registry flush): exactly one is served, the other
// refused with 4005. The id is claimed in the registry within the hello,
// so neither replica can miss the other's node.
func TestFleetNodeIDOnTwoReplicasAtOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	replicas := []*console{e.startConsole(), e.startConsole()}
	v := e.publish("api", domainYAML("api", 10))
	_, fleet, err := e.st.CreateScopedToken(context.Background(), store.TokenSpec{Name: "enforcers", Role: store.RoleNode, Fleet: true}, store.Actor{Name: "test"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 8 {
		id := fmt.Sprintf("pod-%d", i)
		first, second := replicas[i%2], replicas[(i+1)%2]
		nodes := []*node{e.connectWith(first.url, fleet, wire.Hello{NodeID: id}), e.connectWith(second.url, fleet, wire.Hello{NodeID: id})}
		served, refused := 0, 0
		for _, n := range nodes {
			select {
			case msg, ok := <-n.in:
				switch {
				case ok:
					if snap, isSnap := msg.(*wire.Snapshot); !isSnap || snap.Version != v {
						t.Fatalf("%s: got %+v, want snapshot %d", id, msg, v)
					}
					served++
				case websocket.CloseStatus(n.err) == wire.CloseDuplicateNode:
					refused++
				default:
					t.Fatalf("%s: closed with %v", id, n.err)
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("%s: no answer within 30 s", id)
			}
		}
		if served != 1 || refused != 1 {
			t.Errorf("%s on two replicas at once: %d served, %d refused; want one each", id, served, refused)
		}
	}
}
