//lint:file-ignore SA1019 Sluice uses nhooyr.io/websocket, deprecated in favour of its maintained twin github.com/coder/websocket

package subscriber_test

import (
	"testing"
	"time"

	"nhooyr.io/websocket"

	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/enforcer/subscriber"
	"github.com/sluicehq/sluice/rules/wire"
)

// TestSubscribeMovesToAnotherReplica gives the node two consoles: when its
// console dies it subscribes to the other, resuming from its version.
func TestSubscribeMovesToAnotherReplica(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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

// TestBackoffFullJitterCapped checks the reconnect delay: uniform in
// [0, min(max, min·2^attempt)], so it grows per attempt, never exceeds the
// cap, and spreads nodes out.
func TestBackoffFullJitterCapped(t *testing.T) {
	t.Parallel()
	const lo, hi = 100 * time.Millisecond, 10 * time.Second
	sub, err := subscriber.New(subscriber.Config{ConsoleURL: "http://c", MinBackoff: lo, MaxBackoff: hi}, engine.New(nil, ""), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, attempt := range []int{0, 1, 3, 6, 7, 20, 64, 1000} {
		ceiling := hi
		if attempt < 30 && lo<<attempt < hi {
			ceiling = lo << attempt
		}
		var smallest, largest time.Duration = ceiling, 0
		for range 2000 {
			d := sub.Backoff(attempt)
			if d < 0 || d > ceiling {
				t.Fatalf("attempt %d: delay %v outside [0, %v]", attempt, d, ceiling)
			}
			smallest, largest = min(smallest, d), max(largest, d)
		}
		// 2000 uniform draws cover most of the range.
		if smallest > ceiling/10 || largest < ceiling*9/10 {
			t.Errorf("attempt %d: delays in [%v, %v], want spread over [0, %v]", attempt, smallest, largest, ceiling)
		}
	}
}
