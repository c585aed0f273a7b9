package hub_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"nhooyr.io/websocket"

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
