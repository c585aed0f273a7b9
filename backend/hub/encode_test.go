//lint:file-ignore SA1019 Sluice uses nhooyr.io/websocket, deprecated in favour of its maintained twin github.com/coder/websocket

package hub

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"nhooyr.io/websocket"

	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules/wire"
)

// TestSnapshotEncodedOncePerVersion connects many nodes and publishes
// several versions: each version is serialized once, whatever the number
// of nodes and of concurrent connects.
func TestSnapshotEncodedOncePerVersion(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	dbURL := testenv.PostgresURL(t)
	st, err := store.Open(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	h := New(st, nil)
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	// Each connection gets a node token of its own: a token is bound to one node id.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok, secret, err := st.CreateToken(r.Context(), "node", store.RoleNode, nil, store.Actor{Name: "t"})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		h.Serve(w, r, tok.ID, secret, store.Actor{Name: "token:node"})
	}))
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		srv.Close()
	})
	publish := func(limit int) int64 {
		t.Helper()
		cur, err := st.CurrentVersion(ctx)
		if err != nil {
			t.Fatal(err)
		}
		v, err := st.Publish(ctx, store.Change{Domain: "api", BaseVersion: cur, Message: "m", Actor: store.Actor{Name: "t"},
			YAML: fmt.Sprintf("domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: %d}\n", limit)})
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	publish(1)

	// Every node acks what it gets and reports versions on acked.
	const nodes = 25
	acked := make(chan int64, nodes*4)
	var wg sync.WaitGroup
	for i := range nodes {
		ws, _, err := websocket.Dial(ctx, strings.Replace(srv.URL, "http", "ws", 1), nil)
		if err != nil {
			t.Fatal(err)
		}
		ws.SetReadLimit(wire.MaxMessageBytes)
		t.Cleanup(func() { ws.CloseNow() })
		hello, _ := json.Marshal(wire.Hello{Type: wire.TypeHello, Protocol: wire.ProtocolVersion, NodeID: fmt.Sprintf("n%d", i)})
		if err := ws.Write(ctx, websocket.MessageText, hello); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				_, data, err := ws.Read(ctx)
				if err != nil {
					return
				}
				var snap wire.Snapshot
				if err := json.Unmarshal(data, &snap); err != nil {
					t.Errorf("decode: %v", err)
					return
				}
				ack, _ := json.Marshal(wire.Ack{Type: wire.TypeAck, Version: snap.Version})
				if ws.Write(ctx, websocket.MessageText, ack) != nil {
					return
				}
				acked <- snap.Version
			}
		}()
	}
	waitAcks := func(v int64) {
		t.Helper()
		for got := 0; got < nodes; {
			select {
			case a := <-acked:
				if a == v {
					got++
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("%d of %d nodes acked version %d within 30s", got, nodes, v)
			}
		}
	}
	waitAcks(1)
	waitAcks(publish(2))
	waitAcks(publish(3))
	if got := h.encodes.Load(); got != 3 {
		t.Errorf("3 versions to %d nodes serialized %d times, want 3", nodes, got)
	}
}
