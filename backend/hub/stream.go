//lint:file-ignore SA1019 nhooyr.io/websocket is the websocket library the product card fixes (its maintained twin is github.com/coder/websocket)

package hub

import (
	"context"
	"net/http"
	"time"

	"nhooyr.io/websocket"

	"github.com/sluicehq/sluice/rules/wire"
)

// Feed is the source of one browser's live stream (a
// backend/stats.Subscription): JSON messages, and a signal that the
// browser fell too far behind.
type Feed interface {
	Messages() <-chan []byte
	Dropped() <-chan struct{}
	Close()
}

// streamWriteTimeout bounds one write to a browser.
const streamWriteTimeout = 5 * time.Second

// Check reports why a stream's credential stopped working (signed out,
// session expired, user disabled or their role changed, token revoked),
// or "" while it works. A check that cannot tell (the database does not
// answer) reports "": the stream goes on and the next check decides.
type Check func(ctx context.Context) (revoked string)

// ServeStream upgrades an already-authenticated request to a browser's
// live stream and sends feed's messages until the browser leaves, a write
// times out, the feed drops it (1008 with the reason: reconnect and load
// the window again), check reports the credential revoked (it runs every
// recheckEvery; wire.CloseRevoked with the reason: sign in again) or ctx
// ends (1001). Messages from the browser are not expected; their size is
// bounded.
func ServeStream(ctx context.Context, w http.ResponseWriter, r *http.Request, feed Feed, check Check) {
	defer feed.Close()
	ws, err := websocket.Accept(w, r, nil)
	if err != nil {
		return // Accept has written the HTTP error
	}
	ws.SetReadLimit(4 << 10)
	rctx := ws.CloseRead(context.Background()) // ends when the browser closes
	tick := time.NewTicker(recheckEvery)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			cctx, cancel := context.WithTimeout(ctx, streamWriteTimeout)
			reason := check(cctx)
			cancel()
			if reason != "" {
				ws.Close(wire.CloseRevoked, wire.Cut(reason, 120))
				return
			}
		case <-ctx.Done():
			ws.Close(websocket.StatusGoingAway, "console shutting down")
			return
		case <-rctx.Done():
			ws.CloseNow()
			return
		case <-feed.Dropped():
			ws.Close(websocket.StatusPolicyViolation, "too slow: reconnect for the latest window")
			return
		case m := <-feed.Messages():
			wctx, cancel := context.WithTimeout(ctx, streamWriteTimeout)
			err := ws.Write(wctx, websocket.MessageText, m)
			cancel()
			if err != nil {
				ws.CloseNow()
				return
			}
		}
	}
}
