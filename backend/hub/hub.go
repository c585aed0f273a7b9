// Package hub is the console's side of the push channel: it accepts enforcer
// websockets on /api/v1/nodes/stream, sends each node the snapshot it lacks,
// records acks and nacks in the node registry, and fans out every new version.
// It is the only console package that imports the websocket library.
package hub

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"nhooyr.io/websocket"

	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/rules/wire"
)

// Tunables of the push channel.
const (
	helloTimeout = 10 * time.Second
	writeTimeout = 10 * time.Second
	pingInterval = 15 * time.Second
	queueSize    = 8 // messages waiting per node; a node further behind is dropped
)

// Hub tracks connected nodes and pushes snapshots to them.
type Hub struct {
	store *store.Store
	log   *slog.Logger

	mu    sync.Mutex
	conns map[*conn]struct{}
	cache encoded // latest snapshot, serialized once for all connections
}

type encoded struct {
	version int64
	data    []byte
}

// New returns a hub backed by st.
func New(st *store.Store, log *slog.Logger) *Hub {
	return &Hub{store: st, log: log, conns: make(map[*conn]struct{})}
}

type conn struct {
	ws     *websocket.Conn
	queue  chan encoded
	cancel context.CancelFunc

	node    store.Node   // owned by the connection's reader goroutine
	applied atomic.Int64 // node.AppliedVersion, readable by Notify
}

// Serve upgrades an already-authenticated request to a node stream and runs
// it until the node goes away or ctx ends.
func (h *Hub) Serve(w http.ResponseWriter, r *http.Request) {
	ws, err := websocket.Accept(w, r, nil)
	if err != nil {
		return // Accept has written the HTTP error
	}
	ws.SetReadLimit(wire.MaxMessageBytes)
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	c := &conn{ws: ws, queue: make(chan encoded, queueSize), cancel: cancel}
	err = h.run(ctx, c, r.RemoteAddr)
	status := websocket.CloseStatus(err)
	switch {
	case err == nil, status == websocket.StatusNormalClosure, status == websocket.StatusGoingAway, errors.Is(err, context.Canceled):
		ws.Close(websocket.StatusNormalClosure, "")
	default:
		h.log.Warn("node stream closed", "node_id", c.node.ID, "error", err)
		ws.Close(websocket.StatusPolicyViolation, truncate(err.Error(), 120))
	}
}

func (h *Hub) run(ctx context.Context, c *conn, addr string) error {
	helloCtx, cancel := context.WithTimeout(ctx, helloTimeout)
	_, data, err := c.ws.Read(helloCtx)
	cancel()
	if err != nil {
		return fmt.Errorf("read hello: %w", err)
	}
	msg, err := wire.Decode(data)
	if err != nil {
		return err
	}
	hello, ok := msg.(*wire.Hello)
	if !ok || hello.NodeID == "" {
		return errors.New("first message must be a hello with a node_id")
	}
	now := time.Now().UTC()
	c.node = store.Node{ID: hello.NodeID, AppliedVersion: hello.AppliedVersion, Status: store.NodeConnected,
		Labels: hello.Labels, Build: hello.Build, Address: addr, ConnectedSince: &now, LastSeen: now}
	if err := h.store.SaveNode(ctx, c.node); err != nil {
		return err
	}
	c.applied.Store(hello.AppliedVersion)
	h.mu.Lock()
	h.conns[c] = struct{}{}
	h.mu.Unlock()
	defer h.disconnect(c)
	h.log.Info("node connected", "node_id", c.node.ID, "applied_version", hello.AppliedVersion, "address", addr)

	if snap, err := h.latest(ctx); err != nil {
		return err
	} else if snap.version > hello.AppliedVersion {
		c.queue <- snap
	}
	errc := make(chan error, 1)
	go func() { errc <- h.write(ctx, c) }()
	rerr := h.read(ctx, c)
	c.cancel()
	if werr := <-errc; rerr == nil {
		rerr = werr
	}
	return rerr
}

func (h *Hub) disconnect(c *conn) {
	h.mu.Lock()
	delete(h.conns, c)
	h.mu.Unlock()
	c.node.Status = store.NodeDisconnected
	c.node.LastSeen = time.Now().UTC()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := h.store.SaveNode(ctx, c.node); err != nil {
		h.log.Warn("record node disconnect", "node_id", c.node.ID, "error", err)
	}
}

// write sends queued snapshots and keepalive pings.
func (h *Hub) write(ctx context.Context, c *conn) error {
	ping := time.NewTicker(pingInterval)
	defer ping.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case m := <-c.queue:
			wctx, cancel := context.WithTimeout(ctx, writeTimeout)
			err := c.ws.Write(wctx, websocket.MessageText, m.data)
			cancel()
			if err != nil {
				return fmt.Errorf("send snapshot %d: %w", m.version, err)
			}
		case <-ping.C:
			pctx, cancel := context.WithTimeout(ctx, writeTimeout)
			err := c.ws.Ping(pctx)
			cancel()
			if err != nil {
				return fmt.Errorf("ping: %w", err)
			}
		}
	}
}

// read handles acks, nacks and stats from the node.
func (h *Hub) read(ctx context.Context, c *conn) error {
	for {
		_, data, err := c.ws.Read(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		msg, err := wire.Decode(data)
		if err != nil {
			return err
		}
		now := time.Now().UTC()
		c.node.LastSeen = now
		switch m := msg.(type) {
		case *wire.Ack:
			c.node.AppliedVersion = m.Version
			c.applied.Store(m.Version)
			c.node.NackVersion, c.node.NackError = nil, ""
			h.log.Info("node applied version", "node_id", c.node.ID, "version", m.Version)
		case *wire.Nack:
			v := m.Version
			c.node.NackVersion, c.node.NackError = &v, truncate(m.Error, 2000)
			h.log.Warn("node rejected version", "node_id", c.node.ID, "version", m.Version, "error", m.Error)
		case *wire.Stats:
			// Live stats aggregation lands with the traffic dashboard; the
			// message still counts as contact.
		default:
			return fmt.Errorf("unexpected %T from node", msg)
		}
		if err := h.store.SaveNode(ctx, c.node); err != nil {
			return err
		}
	}
}

// latest returns the newest snapshot, serialized once and cached.
func (h *Hub) latest(ctx context.Context) (encoded, error) {
	current, err := h.store.CurrentVersion(ctx)
	if err != nil {
		return encoded{}, err
	}
	h.mu.Lock()
	cached := h.cache
	n := len(h.conns)
	h.mu.Unlock()
	if cached.version == current && cached.data != nil {
		return cached, nil
	}
	snap, err := h.store.FindSnapshot(ctx, current)
	if err != nil {
		return encoded{}, err
	}
	data, err := json.Marshal(wire.Snapshot{Type: wire.TypeSnapshot, Version: snap.Version,
		Checksum: snap.Checksum, Domains: snap.WireDomains(), NodeCount: n})
	if err != nil {
		return encoded{}, fmt.Errorf("encode snapshot: %w", err)
	}
	e := encoded{version: snap.Version, data: data}
	h.mu.Lock()
	if e.version > h.cache.version {
		h.cache = e
	}
	h.mu.Unlock()
	return e, nil
}

// Notify pushes the latest version to every connected node that is behind.
// A node whose queue is full is disconnected rather than blocking the others;
// it catches up with a full snapshot when it reconnects.
func (h *Hub) Notify(ctx context.Context) error {
	snap, err := h.latest(ctx)
	if err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for c := range h.conns {
		if c.applied.Load() >= snap.version {
			continue
		}
		select {
		case c.queue <- snap:
		default:
			h.log.Warn("node too far behind, dropping connection")
			c.cancel()
		}
	}
	return nil
}

// Connected returns how many nodes are connected to this console.
func (h *Hub) Connected() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.conns)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
