package hub

import (
	"context"
	"math/rand/v2"
	"time"
)

// Reconnect backoff of the version listener.
const (
	listenMinBackoff = 100 * time.Millisecond
	listenMaxBackoff = 10 * time.Second
)

// listen pushes every version announced on store.VersionsChannel, from any
// replica, to this replica's nodes. It runs the store's LISTEN session,
// reconnects with capped exponential backoff and full jitter, and whenever
// the session asks (after each (re)connect, and when the channel has been
// quiet) pushes the latest version in case one was published while it was
// not listening. It returns when ctx ends.
func (h *Hub) listen(ctx context.Context) {
	attempt := 0
	for {
		listening := false
		err := h.store.ListenVersions(ctx, func(v int64) {
			listening = true
			if v > 0 {
				h.log.Debug("version published", "version", v)
			}
			h.catchUp(ctx)
		})
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

// catchUp pushes the latest version to the nodes that lack it.
func (h *Hub) catchUp(ctx context.Context) {
	if err := h.Notify(ctx); err != nil && ctx.Err() == nil {
		h.log.Warn("push latest version", "error", err)
	}
}
