//lint:file-ignore SA1019 Sluice uses nhooyr.io/websocket, deprecated in favour of its maintained twin github.com/coder/websocket

package hub

import (
	"bytes"
	"context"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"nhooyr.io/websocket"
)

// TestFramesReadByTheLibrary writes the hub's own frames (textFrame, of
// every length encoding, and pingFrame) to a real websocket client while
// the client pings the console, so that the library writes pongs to the
// same socket, and checks that the client reads every message whole and
// in order and answers the console's pings.
func TestFramesReadByTheLibrary(t *testing.T) {
	t.Parallel()
	accepted := make(chan *smallBuffers, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sb := &smallBuffers{ResponseWriter: w}
		ws, err := websocket.Accept(sb, r, nil)
		if err != nil {
			t.Error(err)
			return
		}
		ws.CloseRead(context.Background()) // answers the client's pings, notes its pongs
		accepted <- sb
	}))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client, _, err := websocket.Dial(ctx, strings.Replace(srv.URL, "http://", "ws://", 1), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer client.CloseNow()
	client.SetReadLimit(-1)
	sb := <-accepted

	r := rand.New(rand.NewPCG(1, 2))
	sizes := []int{0, 1, 125, 126, 127, 4000, 0xFFFF, 0x10000, 300_000}
	for range 50 {
		sizes = append(sizes, r.IntN(5000))
	}
	want := make([][]byte, len(sizes))
	for i, n := range sizes {
		want[i] = make([]byte, n)
		for j := range want[i] {
			want[i][j] = 'a' + byte(r.IntN(26))
		}
	}
	pinging := make(chan error, 1)
	go func() {
		for range 50 {
			if err := client.Ping(ctx); err != nil {
				pinging <- err
				return
			}
		}
		pinging <- nil
	}()
	go func() {
		for i, p := range want {
			if i%10 == 0 { // the client's library answers it between messages
				if err := sb.out.writeFrame(pingFrame); err != nil {
					t.Error(err)
				}
			}
			frame := textFrame(p)
			if !bytes.Equal(frame[len(frame)-len(p):], p) {
				t.Errorf("frame of %d bytes does not end with its payload", len(p))
			}
			if err := sb.out.writeFrame(frame); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for i, p := range want {
		typ, got, err := client.Read(ctx)
		if err != nil {
			t.Fatalf("message %d (%d bytes): %v", i, len(p), err)
		}
		if typ != websocket.MessageText || !bytes.Equal(got, p) {
			t.Fatalf("message %d: %v of %d bytes, want text of %d", i, typ, len(got), len(p))
		}
	}
	go client.Read(ctx) // the client takes pongs and answers pings while it reads
	if err := <-pinging; err != nil {
		t.Errorf("client ping: %v", err)
	}

	// The console's ping is answered: the pong is read like any frame.
	before := sb.in.at.Load()
	if err := sb.out.writeFrame(pingFrame); err != nil {
		t.Fatal(err)
	}
	for sb.in.at.Load() == before {
		if ctx.Err() != nil {
			t.Fatal("the console's ping got no pong")
		}
		time.Sleep(time.Millisecond)
	}

	// Once closing, the hub writes nothing more.
	sb.out.closing()
	if err := sb.out.writeFrame(textFrame([]byte("late"))); err == nil {
		t.Error("a frame was written after closing")
	}
}

// TestFrameWriterShowsAStuckWrite checks that a write the node does not
// take shows when it began (keepaliveLoop aborts it after writeTimeout),
// and shows none once closing the socket ended it.
func TestFrameWriterShowsAStuckWrite(t *testing.T) {
	t.Parallel()
	console, node := net.Pipe() // a write waits for its reader
	defer node.Close()
	w := &frameWriter{Conn: console}
	done := make(chan error, 1)
	start := time.Now().UnixNano()
	go func() { done <- w.writeFrame(textFrame([]byte("never read"))) }()
	for w.since.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	if since := w.since.Load(); since < start {
		t.Errorf("the stuck write began at %d, before the call (%d)", since, start)
	}
	console.Close() // what abort does
	if err := <-done; err == nil {
		t.Error("the aborted write succeeded")
	}
	if w.since.Load() != 0 {
		t.Error("a write still shows in progress after it returned")
	}
}
