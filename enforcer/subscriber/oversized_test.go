package subscriber_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/rules/wire"
)

// TestOversizedSnapshotNacked: a snapshot over
// wire.MaxMessageBytes is nacked with the reason, on the same connection,
// instead of the node reconnecting (and being sent it again) forever; the
// next snapshot that fits is applied.
func TestOversizedSnapshotNacked(t *testing.T) {
	t.Parallel()
	c := newConsole(t)
	n := startNode(t, c.srv.URL, t.TempDir(), false)
	cc := c.accept()
	cc.send(snapshot(1, api()))
	wantAck(t, cc.recv(), 1)

	var big []wire.DomainConfig
	for i := range 17 {
		name := fmt.Sprintf("d%02d", i)
		big = append(big, wire.DomainConfig{Name: name, YAML: "domain: " + name + "\n# " + strings.Repeat("x", 1<<20)})
	}
	cc.send(snapshot(2, big...))
	wantNack(t, cc.recv(), 2, fmt.Sprintf("over the %d bytes this node accepts", wire.MaxMessageBytes))
	if n.eng.Version() != 1 {
		t.Errorf("engine at version %d after an oversized snapshot, want 1", n.eng.Version())
	}

	cc.send(snapshot(3, api(), web()))
	wantAck(t, cc.recv(), 3)
	select {
	case again := <-c.conns:
		t.Errorf("the node reconnected (hello %+v), want it to stay on its connection", again.hello)
	default:
	}
}
