package hub

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"time"

	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/rules/wire"
)

// flushLoop writes the registry every flushInterval while changes are
// pending (or when kicked), and forgets long-gone nodes hourly, until ctx
// ends. Those flushes write the connections that changed (h.dirty); once
// a second a flush looks at every connection, for last_seen, rates and
// heartbeats (softFlushEvery and heartbeatEvery are seconds apart): a
// look at 10,000 connections four times a second was a tenth of the
// console's CPU during a publish.
func (h *Hub) flushLoop(ctx context.Context) {
	tick := time.NewTicker(flushInterval)
	defer tick.Stop()
	prune := time.NewTicker(time.Hour)
	defer prune.Stop()
	failing := false
	var lastAll time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if h.pending.Load() == 0 && time.Since(lastAll) < time.Second {
				continue
			}
		case <-h.kick:
		case <-prune.C:
			if n, err := h.store.DeleteNodesSeenBefore(ctx, time.Now().Add(-forgetAfter)); err != nil {
				h.log.Warn("forget old nodes", "error", err)
			} else if n > 0 {
				h.log.Info("forgot nodes not seen for a week", "nodes", n)
			}
			continue
		}
		now := time.Now()
		all := now.Sub(lastAll) >= time.Second
		if all {
			lastAll = now
		}
		// Log a failing database once, not four times a second.
		switch err := h.flush(ctx, now, all); {
		case err != nil && !failing && ctx.Err() == nil:
			h.log.Error("write node registry; will retry", "error", err)
			failing = true
		case err == nil && failing:
			h.log.Info("node registry written again")
			failing = false
		}
	}
}

// flush writes the registry rows that changed: every hard change (hello,
// ack, nack, disconnect) and, when all, last_seen and rates at most every
// softFlushEvery and a heartbeat for every connected node. On failure the
// changes stay pending for the next flush, except rows Postgres refused for
// their content (store.RefusedNodesError): they are logged and dropped, the
// others written.
func (h *Hub) flush(ctx context.Context, now time.Time, all bool) error {
	h.pending.Store(0)
	h.dirtyMu.Lock()
	dirty := h.dirty
	h.dirty = nil
	h.dirtyMu.Unlock()
	h.mu.Lock()
	gone := h.gone
	h.gone = nil
	var conns []*conn
	if all {
		conns = make([]*conn, 0, len(h.conns))
		for _, c := range h.conns {
			conns = append(conns, c)
		}
	} else {
		// The changed connections still registered: a closed one's
		// final row is in gone.
		conns = dirty[:0]
		for _, c := range dirty {
			if h.conns[c.node.ID] == c {
				conns = append(conns, c)
			}
		}
		clear(dirty[len(conns):])
	}
	// A node that reconnected here since its old connection closed is
	// described by the new connection. (Sized for the gone: most flushes
	// write a few of the connected rows, not all.)
	batch := make([]store.Node, 0, len(gone))
	for _, n := range gone {
		if _, back := h.conns[n.ID]; !back {
			batch = append(batch, n)
		}
	}
	h.mu.Unlock()
	gone = batch[:len(batch):len(batch)]

	// A connection whose row SaveNodes wrote since its hello has changed
	// only the columns its messages change: those rows go through the
	// cheaper UpdateNodes, and on to SaveNodes if the row is no longer
	// this connection's (SaveNodes then decides whether it may take it).
	var taken, fresh []*conn
	var update []store.Node
	for _, c := range conns {
		c.mu.Lock()
		if c.dirty || (c.soft && now.Sub(c.persisted) >= softFlushEvery) || now.Sub(c.persisted) >= heartbeatEvery {
			if c.written {
				update = append(update, c.row())
			} else {
				batch = append(batch, c.row())
				fresh = append(fresh, c)
			}
			c.dirty, c.soft, c.persisted = false, false, now
			taken = append(taken, c)
		}
		c.mu.Unlock()
	}
	if len(batch) == 0 && len(update) == 0 {
		return nil
	}
	// retry puts the taken changes back for the next flush.
	retry := func(err error) error {
		// Queued but not counted as pending: a failing database is
		// retried at the next look at every connection (a second), or
		// with the next changes.
		var again []*conn
		for _, c := range taken {
			c.mu.Lock()
			if !c.dirty {
				c.dirty = true
				again = append(again, c)
			}
			c.mu.Unlock()
		}
		h.dirtyMu.Lock()
		h.dirty = append(h.dirty, again...)
		h.dirtyMu.Unlock()
		h.mu.Lock()
		h.gone = append(gone, h.gone...)
		h.mu.Unlock()
		return err
	}
	rest, err := h.store.UpdateNodes(ctx, update)
	if err != nil {
		return retry(err)
	}
	batch = append(batch, rest...)
	if len(batch) == 0 {
		return nil
	}
	err = h.store.SaveNodes(ctx, batch, StaleAfter)
	var refused *store.RefusedNodesError
	if err != nil && !errors.As(err, &refused) {
		return retry(err)
	}
	if refused != nil {
		// Every other row was written; these would be refused again
		// and must not be retried forever.
		h.log.Error("node registry refused rows; dropped", "node_ids", refused.IDs, "error", refused.Err)
	}
	for _, c := range fresh {
		c.mu.Lock()
		c.written = refused == nil || !slices.Contains(refused.IDs, c.node.ID)
		c.mu.Unlock()
	}
	return nil
}

// markDirty queues c, whose dirty flag its caller just set (holding c.mu),
// for the next flush and counts the change.
func (h *Hub) markDirty(c *conn) {
	h.dirtyMu.Lock()
	h.dirty = append(h.dirty, c)
	h.dirtyMu.Unlock()
	h.changed()
}

// changed counts a registry change and kicks the flusher when many are
// pending.
func (h *Hub) changed() {
	if h.pending.Add(1) >= flushBatch {
		select {
		case h.kick <- struct{}{}:
		default:
		}
	}
}

// What register did.
const (
	registered = iota
	registerStopped
	registerDuplicate
)

// register adds c to the hub, replacing (and closing) an older connection
// of the same node, or, when exclusive (a fleet token's node), refusing c
// if the node id is connected. It refuses every node once the hub is
// shutting down.
func (h *Hub) register(c *conn, exclusive bool) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stopped {
		return registerStopped
	}
	if old := h.conns[c.node.ID]; old != nil {
		if exclusive {
			return registerDuplicate
		}
		old.drop(wire.CloseReplaced, "replaced by a newer connection of the same node")
	}
	h.conns[c.node.ID] = c
	h.markDirty(c) // its hello set dirty
	return registered
}

// release writes row, a claimed row of a connection that was then
// refused, as disconnected, so the node id is free again at once and the
// connection that holds the id here may write its own row over it. It
// writes at once rather than through the flush, which skips the rows of
// ids connected here.
func (h *Hub) release(row store.Node) {
	row.Status = store.NodeDisconnected
	row.LastSeen = time.Now().UTC()
	ctx, cancel := context.WithTimeout(context.Background(), helloTimeout)
	defer cancel()
	if err := h.store.SaveNodes(ctx, []store.Node{row}, StaleAfter); err != nil {
		h.log.Warn("give back a refused node's registry row; it ages out", "node_id", row.ID, "error", err)
	}
}

// connectedHere reports whether node id is connected to this replica.
func (h *Hub) connectedHere(id string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.conns[id] != nil
}

// unregister removes c and queues its final row, unless a newer
// connection of the same node replaced it (that one's row wins).
func (h *Hub) unregister(c *conn) {
	c.mu.Lock()
	c.node.Status = store.NodeDisconnected
	c.node.LastSeen = time.Now().UTC()
	c.node.Rates = nil
	row := c.row()
	c.mu.Unlock()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.conns[row.ID] != c {
		return
	}
	delete(h.conns, row.ID)
	h.gone = append(h.gone, row)
	h.changed()
}

// rates turns one stats report into per-second rates.
func rates(s *wire.Stats, at time.Time) *store.NodeRates {
	secs := float64(s.IntervalMS) / 1000
	r := &store.NodeRates{At: at}
	for _, rule := range s.Rules {
		r.Allowed += float64(rule.Allowed)
		r.Limited += float64(rule.Limited)
		r.ShadowLimited += float64(rule.ShadowLimited)
		r.StoreErrors += float64(rule.StoreErrors)
	}
	r.Decisions = r.Allowed + r.Limited + r.ShadowLimited + r.StoreErrors
	r.Decisions /= secs
	r.Allowed /= secs
	r.Limited /= secs
	r.ShadowLimited /= secs
	r.StoreErrors /= secs
	return r
}

// Connected returns how many nodes are connected to this replica.
func (h *Hub) Connected() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.conns)
}

// connectedRegions counts the distinct regions the nodes connected to this
// replica named in their hellos.
func (h *Hub) connectedRegions() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	seen := map[string]bool{}
	for _, c := range h.conns {
		if r := c.region; r != "" {
			seen[r] = true
		}
	}
	return len(seen)
}

// Nodes returns the registry: every node Postgres knows, with the live
// state of the nodes connected to this replica. A node whose row says
// connected but that no replica has refreshed within StaleAfter (its
// replica died) is reported disconnected; a connected node's rates older
// than ratesIdleAfter (plus softFlushEvery for another replica's node) are
// zero: it decided nothing since.
func (h *Hub) Nodes(ctx context.Context) ([]store.Node, error) {
	stored, err := h.store.ListNodes(ctx)
	if err != nil {
		return nil, err
	}
	local := make(map[string]store.Node)
	h.mu.Lock()
	for id, c := range h.conns {
		c.mu.Lock()
		local[id] = c.row()
		c.mu.Unlock()
	}
	h.mu.Unlock()
	now := time.Now()
	out := stored[:0]
	for _, n := range stored {
		if l, ok := local[n.ID]; ok {
			n = l
			delete(local, n.ID)
		}
		out = append(out, n)
	}
	for _, n := range local { // connected, not yet written
		out = append(out, n)
	}
	for i := range out {
		n := &out[i]
		if n.Status == store.NodeConnected && now.Sub(n.LastSeen) > StaleAfter {
			n.Status = store.NodeDisconnected
		}
		// A node reports only the intervals in which it decided
		// something: rates that old mean it is idle since. Another
		// replica's rows are written every softFlushEvery at most.
		idle := ratesIdleAfter
		if n.Console != h.id {
			idle += softFlushEvery
		}
		switch {
		case n.Status != store.NodeConnected:
			n.Rates = nil
		case n.Rates != nil && now.Sub(n.Rates.At) > idle:
			n.Rates = &store.NodeRates{At: now}
		}
	}
	slices.SortFunc(out, func(a, b store.Node) int { return cmp.Compare(a.ID, b.ID) })
	return out, nil
}
