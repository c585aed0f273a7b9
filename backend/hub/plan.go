package hub

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"time"

	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/rules/wire"
)

// encoded is one version's snapshot message, serialized once, and its
// catalog.
type encoded struct {
	version int64
	frame   []byte // the snapshot message as one websocket frame (textFrame), for every node
	catalog *wire.Catalog
}

// planSince returns what the nodes should run, as read by a read that
// started after the hub's read counter was at gen (so after the caller
// registered its connection: a version committed before that is in it, one
// committed later reaches the connection through Notify). Nodes that
// connect together share one read: after a console restart, ten thousand
// hellos cost a few reads, not ten thousand.
func (h *Hub) planSince(ctx context.Context, gen uint64) (*plan, error) {
	if p := h.push.Load(); p != nil && p.gen > gen {
		return p, nil
	}
	h.planMu.Lock()
	defer h.planMu.Unlock()
	if p := h.push.Load(); p != nil && p.gen > gen {
		return p, nil // read by the connection before us
	}
	return h.latest(ctx)
}

// plan is what the nodes should run, with the snapshot messages to send.
type plan struct {
	gen   uint64 // reads started later have higher gens
	state store.PushState
	head  *encoded // the latest version
	base  *encoded // while a rollout is staged, its base version
}

// forNode returns the snapshot a node with labels should run.
func (p *plan) forNode(labels map[string]string) *encoded {
	if p.base != nil && p.state.Target(labels) == p.base.version {
		return p.base
	}
	return p.head
}

// keepEncoded is how many versions' snapshot messages stay cached.
const keepEncoded = 4

// latest reads what the nodes should run (the latest version, or the two
// versions of a staged rollout) and returns it with its snapshot messages,
// loading and serializing a version only once. Its reads give up after
// h.planTimeout.
func (h *Hub) latest(ctx context.Context) (*plan, error) {
	ctx, cancel := context.WithTimeout(ctx, h.planTimeout)
	defer cancel()
	gen := h.gen.Add(1)
	ps, err := h.store.FindPushState(ctx)
	if err != nil {
		return nil, err
	}
	p := &plan{gen: gen, state: ps}
	if p.head, err = h.encoded(ctx, ps.Head); err != nil {
		return nil, err
	}
	if ps.Staged != nil && ps.Staged.Version == ps.Head {
		if p.base, err = h.encoded(ctx, ps.Staged.BaseVersion); err != nil {
			return nil, err
		}
	}
	// A read that started later saw at least as much: never replace its
	// plan with an older one (the stats cohort depends on it).
	for {
		old := h.push.Load()
		if (old != nil && old.gen > p.gen) || h.push.CompareAndSwap(old, p) {
			break
		}
	}
	return p, nil
}

// encoded returns version v's snapshot message (empty for version 0).
func (h *Hub) encoded(ctx context.Context, v int64) (*encoded, error) {
	if v == 0 {
		// Nothing published yet: nothing to send, nothing to report.
		return &encoded{catalog: emptyCatalog}, nil
	}
	h.loadMu.Lock()
	defer h.loadMu.Unlock()
	if e := h.cache[v]; e != nil {
		return e, nil
	}
	snap, err := h.store.FindSnapshot(ctx, v)
	if err != nil {
		return nil, err
	}
	ws := wire.Snapshot{Type: wire.TypeSnapshot, Version: snap.Version, Checksum: snap.Checksum, Domains: snap.WireDomains()}
	h.catMu.Lock()
	cat := h.cacheCatalogLocked(v, h.compileCatalog(&ws))
	h.catMu.Unlock()
	nodes := h.Connected()
	if counts, err := h.store.AppliedCounts(ctx, time.Now().Add(-StaleAfter)); err == nil {
		nodes = max(nodes, counts.Connected)
	}
	ws.NodeCount = nodes
	ws.RegionCount = h.connectedRegions()
	if n, err := h.store.RegionCount(ctx, time.Now().Add(-StaleAfter)); err == nil {
		ws.RegionCount = max(ws.RegionCount, n)
	}
	data, err := json.Marshal(ws)
	if err != nil {
		return nil, fmt.Errorf("encode snapshot %d: %w", snap.Version, err)
	}
	h.encodes.Add(1)
	e := &encoded{version: snap.Version, frame: textFrame(data), catalog: cat}
	h.cache[v] = e
	for len(h.cache) > keepEncoded {
		delete(h.cache, slices.Min(slices.Collect(maps.Keys(h.cache))))
	}
	return e, nil
}

// cohortLinger is how long after a rollout ends its version's nodes still
// count as the canary cohort (they are moving to the next version).
const cohortLinger = time.Minute

// canary reports whether a node that ran version v is in the canary
// cohort: v is the version of the staged rollout, or of one that ended
// within cohortLinger.
func (h *Hub) canary(v int64, now time.Time) bool {
	p := h.push.Load()
	if p == nil || p.state.Last == nil || p.state.Last.Version != v {
		return false
	}
	r := p.state.Last
	return r.EndedAt == nil || now.Sub(*r.EndedAt) < cohortLinger
}

// inCanary reports whether a stats report of c covering intervalMS up to
// now counts in the canary cohort: the node runs the canary version, was
// sent it and did not reject it (it may apply it before its ack arrives),
// or ran it during that interval (it applied a version since). So the other
// nodes' cohort only ever holds decisions made under other versions.
// Caller holds c.mu.
func (h *Hub) inCanary(c *conn, intervalMS int64, now time.Time) bool {
	if h.canary(c.node.AppliedVersion, now) {
		return true
	}
	if sent := c.sent.Load(); sent > c.node.AppliedVersion && (c.node.NackVersion == nil || *c.node.NackVersion != sent) && h.canary(sent, now) {
		return true
	}
	switched := !c.switchedAt.IsZero() && now.Sub(c.switchedAt) <= time.Duration(intervalMS)*time.Millisecond
	return switched && h.canary(c.ranBefore, now)
}

// Notify pushes to every node of this replica the version it should run
// (the latest, or per its labels while a rollout is staged) unless it has
// it, was sent it, or runs something newer. It never waits on a node.
func (h *Hub) Notify(ctx context.Context) error {
	p, err := h.latest(ctx)
	if err != nil {
		return err
	}
	// A node whose token was revoked since the last check gets nothing
	// more. Checked after the version is read, so a token revoked before
	// that version was published is always seen revoked here (checked
	// before, a Notify already under way could read the token still live
	// and then a version published after the revocation).
	if err := h.recheck(ctx); err != nil {
		return err
	}
	h.mu.Lock()
	conns := make([]*conn, 0, len(h.conns))
	for _, c := range h.conns {
		conns = append(conns, c)
	}
	h.mu.Unlock()
	for i, c := range conns {
		c.offer(h, p.forNode(c.labels))
		if i%64 == 63 {
			// Let the writers just started run before starting more:
			// ten thousand started at once would each hold a goroutine
			// descriptor, which the runtime keeps for good.
			runtime.Gosched()
		}
	}
	if h.pushed != nil {
		h.pushed(ctx, p.state)
	}
	return nil
}
