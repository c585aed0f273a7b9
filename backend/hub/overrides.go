package hub

import (
	"context"
	"time"
)

// Expiry of temporary overrides.
const (
	// expireLock is the advisory lock of the replica that expires
	// overrides ("sluice" and 0x27): one replica publishes the expiries.
	// The store's status guard makes each expiry happen once even if two
	// replicas tried (a leader that lost its lock without knowing yet).
	expireLock int64 = 0x736c756963650027
	// expireEvery is how often the leader looks for overrides past their
	// expiry, and how soon a replica takes over when the leader goes: an
	// override ends within about two of these after its expires_at.
	expireEvery = time.Second
)

// expireOverrides runs, on the one replica holding expireLock, the expiry
// of temporary overrides until ctx ends. It expires what is past due as
// soon as it leads, so a console restarted after an expiry catches up.
func (h *Hub) expireOverrides(ctx context.Context) {
	h.store.Lead(ctx, expireLock, expireEvery, func(ctx context.Context) {
		tick := time.NewTicker(expireEvery)
		defer tick.Stop()
		for {
			h.expireDue(ctx, time.Now())
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	})
}

// expireDue publishes a version without each override whose expiry is at
// or before now, and pushes the result to this replica's nodes (the others
// hear of it through NOTIFY).
func (h *Hub) expireDue(ctx context.Context, now time.Time) {
	versions, err := h.store.ExpireOverrides(ctx, now)
	if err != nil && ctx.Err() == nil {
		h.log.Warn("expire overrides", "error", err)
	}
	if len(versions) == 0 {
		return
	}
	h.log.Info("expired overrides", "versions", versions)
	if err := h.Notify(ctx); err != nil && ctx.Err() == nil {
		h.log.Warn("push versions without expired overrides", "error", err)
	}
}
