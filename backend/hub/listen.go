package hub

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluicehq/sluice/backend/store"
)

// Listener tunables.
const (
	// listenPoll is how long the listener waits for a notification before
	// checking the latest version anyway and pinging its connection.
	listenPoll       = 30 * time.Second
	listenMinBackoff = 100 * time.Millisecond
	listenMaxBackoff = 10 * time.Second
)

// listen pushes every version announced on store.VersionsChannel, from any
// replica, to this replica's nodes. It holds its own Postgres connection
// (LISTEN needs a session, not a pooled connection), reconnects with capped
// exponential backoff and full jitter, and after each (re)connect pushes the
// latest version in case one was published while it was not listening.
// It returns when ctx ends.
func (h *Hub) listen(ctx context.Context, databaseURL string) {
	attempt := 0
	for {
		listening, err := h.listenOnce(ctx, databaseURL)
		if ctx.Err() != nil {
			return
		}
		if listening {
			attempt = 0
		}
		ceiling := listenMaxBackoff
		if d := listenMinBackoff << min(attempt, 20); d < ceiling {
			ceiling = d
		}
		delay := rand.N(ceiling + 1)
		attempt++
		h.log.Warn("not listening for new versions; reconnecting", "retry_in", delay.Round(time.Millisecond).String(), "error", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
	}
}

// listenOnce runs one LISTEN session until it fails or ctx ends.
// listening reports whether LISTEN succeeded.
func (h *Hub) listenOnce(ctx context.Context, databaseURL string) (listening bool, err error) {
	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		return false, fmt.Errorf("connect: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		conn.Close(cctx)
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{store.VersionsChannel}.Sanitize()); err != nil {
		return false, fmt.Errorf("listen: %w", err)
	}
	h.catchUp(ctx)
	for {
		wctx, cancel := context.WithTimeout(ctx, listenPoll)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return true, nil
		case err == nil:
			h.log.Debug("version published", "version", n.Payload, "publisher_pid", n.PID)
			h.catchUp(ctx)
		case wctx.Err() != nil && !conn.IsClosed():
			// Quiet for a while: make sure the session is still alive and
			// nothing was missed.
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := conn.Ping(pctx)
			cancel()
			if err != nil {
				return true, fmt.Errorf("ping: %w", err)
			}
			h.catchUp(ctx)
		default:
			return true, fmt.Errorf("wait for notification: %w", err)
		}
	}
}

// catchUp pushes the latest version to the nodes that lack it.
func (h *Hub) catchUp(ctx context.Context) {
	if err := h.Notify(ctx); err != nil && ctx.Err() == nil {
		h.log.Warn("push latest version", "error", err)
	}
}
