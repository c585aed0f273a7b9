package subscriber_test

import (
	"testing"

	"nhooyr.io/websocket"

	"github.com/sluicehq/sluice/rules/wire"
)

// TestSubscribeMovesToAnotherReplica gives the node two consoles: when its
// console dies it subscribes to the other, resuming from its version.
func TestSubscribeMovesToAnotherReplica(t *testing.T) {
	c1, c2 := newConsole(t), newConsole(t)
	n := startNode(t, c1.srv.URL+","+c2.srv.URL, t.TempDir(), false)
	cc := c1.accept()
	cc.send(snapshot(4, api()))
	wantAck(t, cc.recv(), 4)

	// The first console dies: its connections drop and it refuses new ones.
	cc.ws.CloseNow()
	c1.srv.Close()
	moved := c2.accept()
	if moved.hello.AppliedVersion != 4 || moved.hello.NodeID != "node-1" {
		t.Fatalf("hello on the second console %+v, want node-1 at version 4", moved.hello)
	}
	moved.send(snapshot(5, api(), web()))
	wantAck(t, moved.recv(), 5)
	if n.eng.Version() != 5 {
		t.Errorf("engine version %d, want 5", n.eng.Version())
	}
}

// TestSubscribeSurvivesRefusal checks that a node the console refuses
// (protocol, duplicate id) keeps trying rather than giving up.
func TestSubscribeSurvivesRefusal(t *testing.T) {
	for _, code := range []websocket.StatusCode{wire.CloseUnsupportedProtocol, wire.CloseReplaced, websocket.StatusPolicyViolation} {
		c := newConsole(t)
		startNode(t, c.srv.URL, "", false)
		c.accept().ws.Close(code, "refused by the test")
		if hello := c.accept().hello; hello.NodeID != "node-1" {
			t.Errorf("after close %d: hello %+v", code, hello)
		}
	}
}

func TestNewAcceptsConsoleList(t *testing.T) {
	tests := []struct {
		urls string
		ok   bool
	}{
		{"http://a:8080,http://b:8080", true},
		{"http://a:8080, https://b", true},
		{"http://a:8080,", false},
		{"http://a:8080,ftp://b", false},
	}
	for _, tt := range tests {
		_, err := newSubscriber(tt.urls)
		if (err == nil) != tt.ok {
			t.Errorf("New(%q) error %v, want ok=%v", tt.urls, err, tt.ok)
		}
	}
}
