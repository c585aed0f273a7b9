// Package hub is the console's side of the push channel: it accepts enforcer
// websockets on /api/v1/nodes/stream, sends each node the snapshot it lacks,
// records acks, nacks and decision rates in the node registry, and fans out
// every new version to the nodes connected to this console replica.
//
// Replicas learn about new versions from Postgres: a trigger NOTIFYs
// store.VersionsChannel when a version commits, and every replica's hub
// LISTENs (reconnecting as needed), so a publish on one replica reaches the
// nodes of all of them.
//
// What a node should run comes from Postgres too (store.FindPushState,
// re-read on every notification): the latest version, or while a rollout
// is staged its version for the nodes whose hello labels match and its base
// version for the others. Ending a rollout notifies on the same channel. A
// node is never offered a version at or below the one it has or was sent,
// so it never goes back. Stats reports of nodes that run (or just moved
// onto or off) the staged version count in the canary cohort, and one
// replica (an advisory lock) judges a rollout's automatic halt every second
// (rollout.go).
//
// Sized for thousands of nodes per replica (BENCHMARKS.md: 10,000 nodes
// at about 25 KiB of console memory each). A connection holds one reader
// goroutine, started fresh after the upgrade so that it does not keep the
// HTTP handler's deep stack, plus the websocket library's own timeout
// goroutine. Nothing else waits per node: a snapshot is written by a
// short-lived goroutine started when one is offered (only the latest
// offered version is kept; older ones not yet written are skipped), and the
// keepalive ping is a timer. Nothing waits on a node either: a node whose
// writes or pings time out, or that is offered behindLimit versions while
// one write to it is stuck, is dropped and catches up with a full snapshot
// when it reconnects. A snapshot is serialized once per version and the
// same bytes go to every node. The compression extension is not negotiated
// (it would cost a compressor per connection), and the plan a connecting
// node needs is read from Postgres once per wave of reconnects, not once per
// node.
//
// The registry lives in memory for the nodes of this replica and is written
// to Postgres in batches by one flusher (every flushInterval, or sooner when
// many updates are pending), so acks from a thousand nodes cost a few
// statements, not a thousand. Stats reports go to a StatsSink (the live
// traffic aggregator), and ServeStream serves the browsers' live traffic
// streams: it is the only console package that imports the websocket
// library.
//
// Quota batches from nodes are stored in Postgres and acknowledged once
// stored; a resent batch adds nothing (quota.go).
//
// What a node sends is checked row by row against the rulesets the console
// sent it: rows of rules it was never sent, or that Postgres could not
// store, are dropped and counted, and the rest of the message is taken; the
// log lines a node causes are limited per node (input.go).
package hub

//lint:file-ignore SA1019 nhooyr.io/websocket is the websocket library the product card fixes (its maintained twin is github.com/coder/websocket)

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"nhooyr.io/websocket"

	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/rules/wire"
)

// The keepalive: a node that sent nothing for pingInterval is pinged, and
// dropped when the pong (or a write) takes writeTimeout. A hub takes them
// when it is made (New); they are variables only so that tests can shorten
// them.
var (
	writeTimeout = 10 * time.Second
	pingInterval = 15 * time.Second
	// recheckEvery is how often the node tokens of open connections are
	// checked again: a token disabled, rotated or expired, or whose owner
	// lost it (store.FindToken), ends its connection within this time, and
	// before any snapshot pushed later (Notify checks first).
	recheckEvery = 2 * time.Second
)

// Tunables of the push channel.
const (
	helloTimeout = 10 * time.Second

	// flushInterval is how often registry changes reach Postgres;
	// flushBatch pending changes trigger a flush before that.
	// behindLimit is how many versions may be offered to a node while one
	// write to it is in progress; a node further behind is dropped.
	behindLimit = 8

	flushInterval = 250 * time.Millisecond
	flushBatch    = 500
	// softFlushEvery bounds how often a node's last_seen and rates alone
	// are written; heartbeatEvery is how often a connected node's row is
	// rewritten even when nothing changed, so other replicas can tell a
	// live row from one left by a replica that died.
	softFlushEvery = 5 * time.Second
	heartbeatEvery = 20 * time.Second
	// StaleAfter is how long a row may say "connected" without being
	// rewritten before it is reported as disconnected.
	StaleAfter = 60 * time.Second
	// ratesStaleAfter is how old a node's rates may be before they are not
	// shown (the node stopped reporting).
	ratesStaleAfter = 10 * time.Second
	// forgetAfter is how long a node that went away stays in the registry.
	forgetAfter = 7 * 24 * time.Hour
	// shutdownWait bounds waiting for connections to close at shutdown.
	shutdownWait = 10 * time.Second
	// maxNackError bounds the stored text of a nack.
	maxNackError = 2000
)

// Hub tracks the nodes connected to this console replica and pushes
// snapshots to them. Run must be running for the registry to reach
// Postgres and for versions published on other replicas to arrive.
type Hub struct {
	store *store.Store
	log   *slog.Logger
	id    string // this replica, shown as a node's console

	mu      sync.Mutex
	running bool                 // Run was started
	stopped bool                 // Run is shutting down: no new nodes
	conns   map[string]*conn     // by node id
	gone    []store.Node         // final rows of closed connections, not yet written
	wg      sync.WaitGroup       // Serve calls in progress
	loadMu  sync.Mutex           // one snapshot load and encode at a time
	cache   map[int64]*encoded   // by version, the few newest; guarded by loadMu
	planMu  sync.Mutex           // one plan read for connecting nodes at a time
	push    atomic.Pointer[plan] // what the nodes should run, as last read
	gen     atomic.Uint64        // push state reads started
	pending atomic.Int64         // registry changes since the last flush
	kick    chan struct{}

	encodes atomic.Int64 // snapshots serialized, for tests

	pingInterval, writeTimeout, recheckEvery time.Duration // see the variables

	decodes      chan *decodeJob // to the decoders Run starts
	decoding     atomic.Bool     // Run started the decoders
	decodersStop chan struct{}   // closed when Run stops them

	stats StatsSink // nil: stats reports only feed the node rates

	catMu      sync.Mutex              // guards catalogs and catUse
	catalogs   map[int64]*catalogEntry // by version, the keepCatalogs last used (input.go)
	catUse     uint64                  // uses counted, for the eviction
	metrics    metrics                 // input.go
	logMu      sync.Mutex              // guards logBudgets and logPruned
	logBudgets map[string]*logBudget   // by node id (input.go)
	logPruned  time.Time
}

// StatsSink takes the nodes' stats reports (backend/stats.Aggregator).
type StatsSink interface {
	// Ingest adds a report received at at; an error refuses it whole.
	Ingest(s *wire.Stats, at time.Time) error
	// IngestCanary is Ingest for a report of a node that runs the staged
	// version of a rollout: it also counts in the canary cohort.
	IngestCanary(s *wire.Stats, at time.Time) error
	// Cohort returns, summed over the rules of domains in second t
	// (fleet-wide), the canary cohort's counts and everyone's.
	Cohort(domains []string, t int64) (canary, all store.Counts)
	// Refused counts a report the hub refused as malformed.
	Refused(reason string)
	// AddDomains makes reports naming these domains acceptable: the hub
	// calls it with a version's domains before any node can report
	// under that version.
	AddDomains(domains ...string)
}

// SetStatsSink makes every valid stats report reach s. Call it before
// Serve.
func (h *Hub) SetStatsSink(s StatsSink) { h.stats = s }

// encoded is one version's snapshot message, serialized once, and its
// catalog.
type encoded struct {
	version int64
	data    []byte
	catalog *wire.Catalog
}

// New returns a hub backed by st.
func New(st *store.Store, log *slog.Logger) *Hub {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	host, _ := os.Hostname()
	b := make([]byte, 4)
	rand.Read(b)
	return &Hub{
		store: st, log: log, id: cmp.Or(host, "console") + "-" + hex.EncodeToString(b),
		conns: make(map[string]*conn), kick: make(chan struct{}, 1), cache: make(map[int64]*encoded),
		pingInterval: pingInterval, writeTimeout: writeTimeout, recheckEvery: recheckEvery, decodes: make(chan *decodeJob),
		decodersStop: make(chan struct{}), catalogs: make(map[int64]*catalogEntry), metrics: newMetrics(),
		logBudgets: make(map[string]*logBudget),
	}
}

// ID returns this console replica's id (a node's "console" in the
// registry).
func (h *Hub) ID() string { return h.id }

// Run keeps the registry flushed to Postgres and listens for versions
// published by any replica and pushes them. It returns when ctx ends, after
// closing every node connection (going away, so nodes move to another
// replica) and writing the registry one last time.
func (h *Hub) Run(ctx context.Context) error {
	h.mu.Lock()
	if h.running {
		h.mu.Unlock()
		return errors.New("hub: already running")
	}
	h.running = true
	h.mu.Unlock()

	var bg, decoders sync.WaitGroup
	bg.Go(func() { h.listen(ctx) })
	bg.Go(func() { h.watchRollouts(ctx) })
	bg.Go(func() { h.expireOverrides(ctx) })
	bg.Go(func() { h.recheckLoop(ctx) })
	// The decoders outlive the connections: they stop after the last
	// read loop ended.
	for range runtime.GOMAXPROCS(0) {
		decoders.Go(h.decodeLoop)
	}
	h.decoding.Store(true)
	defer func() {
		close(h.decodersStop)
		decoders.Wait()
	}()
	h.flushLoop(ctx)
	bg.Wait()

	// Shut down: refuse new nodes, close the connected ones, write what
	// is left.
	h.mu.Lock()
	h.stopped = true
	conns := make([]*conn, 0, len(h.conns))
	for _, c := range h.conns {
		conns = append(conns, c)
	}
	h.mu.Unlock()
	for _, c := range conns {
		c.drop(websocket.StatusGoingAway, "console shutting down")
	}
	done := make(chan struct{})
	go func() {
		h.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(shutdownWait):
		h.log.Warn("node connections still closing at shutdown")
	}
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := h.flush(fctx, time.Now()); err != nil {
		return fmt.Errorf("hub: final registry flush: %w", err)
	}
	return nil
}

// flushLoop writes the registry every flushInterval, or when kicked, and
// forgets long-gone nodes hourly, until ctx ends.
func (h *Hub) flushLoop(ctx context.Context) {
	tick := time.NewTicker(flushInterval)
	defer tick.Stop()
	prune := time.NewTicker(time.Hour)
	defer prune.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-h.kick:
		case <-prune.C:
			if n, err := h.store.DeleteNodesSeenBefore(ctx, time.Now().Add(-forgetAfter)); err != nil {
				h.log.Warn("forget old nodes", "error", err)
			} else if n > 0 {
				h.log.Info("forgot nodes not seen for a week", "nodes", n)
			}
			continue
		}
		// Log a failing database once, not four times a second.
		switch err := h.flush(ctx, time.Now()); {
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
// ack, nack, disconnect), last_seen and rates at most every softFlushEvery,
// and a heartbeat for every connected node. On failure the changes stay
// pending for the next flush, except rows Postgres refused for their content
// (store.RefusedNodesError): they are logged and dropped, the others written.
func (h *Hub) flush(ctx context.Context, now time.Time) error {
	h.pending.Store(0)
	h.mu.Lock()
	gone := h.gone
	h.gone = nil
	conns := make([]*conn, 0, len(h.conns))
	for _, c := range h.conns {
		conns = append(conns, c)
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
		for _, c := range taken {
			c.mu.Lock()
			c.dirty = true
			c.mu.Unlock()
		}
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

// conn is one node connection.
type conn struct {
	ws      *websocket.Conn
	out     *joinWriter       // under ws's write buffer
	tokenID int64             // the node token it authenticated with
	secret  string            // and that token's secret, checked again (recheck)
	labels  map[string]string // from hello; never changed
	// sent is the newest version offered to (or already held by) the node;
	// a version is never offered twice on one connection, so a nacked
	// version is not pushed again in a loop.
	sent atomic.Int64

	wmu     sync.Mutex
	next    *encoded // the latest version offered and not yet written; guarded by wmu
	writing bool     // a writer goroutine runs; guarded by wmu
	behind  int      // versions offered since the last write completed; guarded by wmu

	ctx        context.Context // ends when the connection is dropped: aborts writes and pings
	stopWriter context.CancelFunc
	pinger     *time.Timer // the next keepalive ping
	dropOnce   sync.Once
	cause      closeError    // why the console closed the connection; set once, before dropped
	dropped    atomic.Bool   // drop was called
	closed     chan struct{} // closed once the websocket is closed

	mu        sync.Mutex // guards the fields below
	node      store.Node
	dirty     bool      // a change that must be written at the next flush
	soft      bool      // only last_seen or rates changed
	persisted time.Time // when the row was last handed to the store
	written   bool      // SaveNodes wrote this connection's row
	heard     time.Time // when the node last sent a message or a pong (for pings)
	// ranBefore is the version the node ran before it applied its current
	// one at switchedAt (for stats cohorts).
	ranBefore  int64
	switchedAt time.Time

	// cats are the catalogs of the versions sent to the node (input.go);
	// catView lists them for Clean, replaced whenever they change.
	cats    []versionCatalog
	catView []*wire.Catalog

	job decodeJob // the read loop's message at the decoders
}

// closeError is how and why the console closed a connection.
type closeError struct {
	code   websocket.StatusCode
	reason string
}

func (e closeError) Error() string {
	if e.reason == "" {
		return fmt.Sprintf("closed (%d)", int(e.code))
	}
	return fmt.Sprintf("closed (%d): %s", int(e.code), e.reason)
}

// drop closes the connection with code and reason, once, without waiting:
// a writer blocked on a slow node is aborted, and the close handshake runs
// in the background.
func (c *conn) drop(code websocket.StatusCode, reason string) {
	c.dropOnce.Do(func() {
		c.cause = closeError{code: code, reason: wire.Cut(reason, 120)}
		c.dropped.Store(true)
		c.stopWriter()
		c.pinger.Stop()
		go func() {
			c.ws.Close(code, c.cause.reason)
			close(c.closed)
		}()
	})
}

// row returns a copy of the node's registry row; caller holds c.mu. The
// pointer fields are replaced, never modified in place, so sharing them
// is safe.
func (c *conn) row() store.Node { return c.node }

// Serve upgrades a request authenticated by node token tokenID with secret
// (as actor)
// to a node stream and returns; the stream runs in its own goroutine until
// the node goes away, the node is dropped or the hub stops (Run waits for
// it). The token is bound to the first node id it says hello with and
// refused for any other (store.ClaimNode).
func (h *Hub) Serve(w http.ResponseWriter, r *http.Request, tokenID int64, secret string, actor store.Actor) {
	h.mu.Lock()
	stopped := h.stopped
	if !stopped {
		h.wg.Add(1)
	}
	h.mu.Unlock()
	if stopped {
		http.Error(w, `{"error":{"code":"unavailable","message":"the console is not accepting nodes"}}`, http.StatusServiceUnavailable)
		return
	}
	// Compression stays off (the default, said here so it stays so): a
	// deflate context per connection would cost more than the snapshots
	// it saves.
	sb := &smallBuffers{ResponseWriter: w}
	ws, err := websocket.Accept(sb, r, &websocket.AcceptOptions{CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		h.wg.Done()
		return // Accept has written the HTTP error
	}
	ws.SetReadLimit(wire.MaxNodeMessageBytes)
	// The connection outlives the handler: a fresh goroutine holds a
	// shallow stack instead of the HTTP server's and the router's frames,
	// and the request (headers, router context) can be collected.
	go h.serve(ws, sb.out, r.RemoteAddr, tokenID, secret, actor)
}

// Buffer sizes of a node connection, held for its life. Node messages
// are small (an ack, a stats report); a longer one is read past the buffer
// in one more read. The console writes control frames (ping, pong, close:
// at most 127 bytes) and snapshots; a snapshot is longer than the write
// buffer whatever its size, and goes out in one write to the socket
// (see joinWriter).
const (
	readBufferSize  = 256
	writeBufferSize = 128
)

// smallBuffers hands the websocket library smaller buffers than the HTTP
// server's (4 KiB each way, held for the connection's life once hijacked).
// out is the writer under the library's write buffer, set by Hijack.
type smallBuffers struct {
	http.ResponseWriter
	out *joinWriter
}

// WriteHeaderNow makes the library send the handshake response through
// gin's writer, which delays it otherwise (the library looks for this
// method).
func (w *smallBuffers) WriteHeaderNow() {
	if g, ok := w.ResponseWriter.(interface{ WriteHeaderNow() }); ok {
		g.WriteHeaderNow()
	}
}

// Hijack takes over the connection with small buffers; the handshake
// response still waiting in the server's buffer is sent, and request bytes
// already read stay readable.
func (w *smallBuffers) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	hj, ok := w.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, errors.New("connection cannot be hijacked")
	}
	nc, brw, err := hj.Hijack()
	if err != nil {
		return nil, nil, err
	}
	if err := brw.Writer.Flush(); err != nil {
		nc.Close()
		return nil, nil, err
	}
	// The library resets the reader onto the connection, keeping only
	// what is buffered: the bytes read ahead must be in the new buffer.
	n := brw.Reader.Buffered()
	br := bufio.NewReaderSize(nc, readBufferSize)
	if n > 0 { // the node's hello often comes with the handshake
		ahead, _ := brw.Reader.Peek(n)
		br = bufio.NewReaderSize(&aheadReader{ahead: bytes.Clone(ahead), Conn: nc}, max(readBufferSize, n))
		if _, err := br.Peek(n); err != nil {
			nc.Close()
			return nil, nil, err
		}
	}
	w.out = &joinWriter{Conn: nc}
	return nc, bufio.NewReadWriter(br, bufio.NewWriterSize(w.out, writeBufferSize)), nil
}

// joinWriter is what the websocket library's write buffer flushes to. A
// message longer than the buffer reaches it as two writes: the buffer,
// filled with the frame header and the message's start, then the rest of
// the message straight from the caller. Each write is a packet for the
// node to take in, so once armed (just before such a message is written)
// joinWriter holds a first write that fills the buffer and sends it with
// the next in one writev. Any other write disarms it and goes out at once,
// so bytes never change order; what is still held when the message's write
// returns is sent by release.
type joinWriter struct {
	net.Conn
	mu    sync.Mutex
	armed bool
	held  *[writeBufferSize]byte // from heldBuffers; non-nil while holding
}

var heldBuffers = sync.Pool{New: func() any { return new([writeBufferSize]byte) }}

// arm makes the next write, if it fills the write buffer, wait for the one
// after it.
func (w *joinWriter) arm() {
	w.mu.Lock()
	w.armed = true
	w.mu.Unlock()
}

func (w *joinWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.armed && w.held == nil && len(p) == writeBufferSize {
		w.armed = false
		w.held = heldBuffers.Get().(*[writeBufferSize]byte)
		copy(w.held[:], p)
		return len(p), nil
	}
	w.armed = false
	if w.held == nil {
		return w.Conn.Write(p)
	}
	held := w.take()
	defer heldBuffers.Put(held)
	bufs := net.Buffers{held[:], p}
	n, err := bufs.WriteTo(w.Conn)
	return max(0, int(n)-writeBufferSize), err
}

// release disarms the writer and sends what it holds.
func (w *joinWriter) release() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.armed = false
	if w.held == nil {
		return nil
	}
	held := w.take()
	defer heldBuffers.Put(held)
	_, err := w.Conn.Write(held[:])
	return err
}

// take returns the held buffer and holds nothing; caller holds mu.
func (w *joinWriter) take() *[writeBufferSize]byte {
	held := w.held
	w.held = nil
	return held
}

// aheadReader reads the bytes the HTTP server read ahead of the handshake,
// then the connection; it lets go of those bytes once they are read.
type aheadReader struct {
	ahead []byte
	net.Conn
}

func (r *aheadReader) Read(p []byte) (int, error) {
	if len(r.ahead) == 0 {
		return r.Conn.Read(p)
	}
	n := copy(p, r.ahead)
	if r.ahead = r.ahead[n:]; len(r.ahead) == 0 {
		r.ahead = nil
	}
	return n, nil
}

// serve runs one accepted node stream until it closes.
func (h *Hub) serve(ws *websocket.Conn, out *joinWriter, addr string, tokenID int64, secret string, actor store.Actor) {
	wctx, stopWriter := context.WithCancel(context.Background())
	c := &conn{ws: ws, out: out, tokenID: tokenID, secret: secret, ctx: wctx, stopWriter: stopWriter, closed: make(chan struct{})}
	// Armed before anyone else sees c; the first ping comes after the
	// hello deadline.
	c.pinger = time.AfterFunc(h.pingInterval, func() { h.ping(c) })

	if err := h.open(c, addr, tokenID, actor); err != nil {
		h.finish(c, addr, err)
		return
	}
	// The read loop runs for the connection's life on a goroutine of its
	// own: the hello's database calls grew this one's stack, and a
	// goroutine keeps its stack while it runs.
	go func() {
		err := h.read(context.Background(), c) // reads end when the websocket closes
		h.unregister(c)
		h.finish(c, addr, err)
	}()
}

// finish closes a connection that ended with err (see open and read) and
// logs why.
func (h *Hub) finish(c *conn, addr string, err error) {
	defer h.wg.Done()
	var ce closeError
	if errors.As(err, &ce) {
		c.drop(ce.code, ce.reason)
	} else {
		// The node closed the connection, or it failed: nothing to tell.
		c.drop(websocket.StatusNormalClosure, "")
	}
	<-c.closed
	switch {
	case c.node.ID == "":
		h.nodeLog(tokenKey(c.tokenID), slog.LevelWarn, "node refused", "address", addr, "error", err)
	case err == nil:
		h.nodeLog(c.node.ID, slog.LevelInfo, "node disconnected", "node_id", c.node.ID)
	default:
		h.nodeLog(c.node.ID, slog.LevelInfo, "node disconnected", "node_id", c.node.ID, "reason", err.Error())
	}
}

// open handles a connection's hello: it binds the token, registers the
// node and offers it the snapshot it should run. Like read, it returns a
// closeError when the console must close with a specific code, or another
// error when the connection failed; the node is registered only when it
// returns nil.
func (h *Hub) open(c *conn, addr string, tokenID int64, actor store.Actor) error {
	hello, err := readHello(c.ws)
	if err != nil {
		return err
	}
	// Before register: a token bound to another node id must not replace
	// (and so kick off) the connection of the node that has this id.
	fleet, err := h.claim(tokenID, hello.NodeID, actor)
	if err != nil {
		return err
	}
	if fleet { // connected to another replica?
		ctx, cancel := context.WithTimeout(context.Background(), helloTimeout)
		live, err := h.store.NodeLive(ctx, hello.NodeID, h.id, time.Now().Add(-StaleAfter))
		cancel()
		if err != nil {
			h.log.Error("check fleet node id", "node_id", hello.NodeID, "error", err)
			return closeError{code: websocket.StatusTryAgainLater, reason: "console cannot check the node id"}
		}
		if live {
			return duplicateNode(hello.NodeID)
		}
	}
	// What the node runs decides what its reports may name.
	cctx, cancel := context.WithTimeout(context.Background(), helloTimeout)
	cat, err := h.catalog(cctx, hello.AppliedVersion)
	cancel()
	if err != nil {
		h.log.Error("load the ruleset a node runs", "node_id", hello.NodeID, "applied_version", hello.AppliedVersion, "error", err)
		return closeError{code: websocket.StatusTryAgainLater, reason: "console cannot read the ruleset"}
	}
	c.mu.Lock() // the pinger may run already
	c.heard = time.Now()
	now := c.heard.UTC()
	c.node = store.Node{ID: hello.NodeID, AppliedVersion: hello.AppliedVersion, Status: store.NodeConnected,
		Labels: hello.Labels, Build: hello.Build, Address: addr, Protocol: hello.Protocol,
		ConnectedSince: &now, LastSeen: now, Console: h.id, Session: newSession()}
	c.labels = hello.Labels
	c.dirty = true
	c.addCatalog(hello.AppliedVersion, cat)
	c.mu.Unlock()
	c.sent.Store(hello.AppliedVersion)

	// Register before reading the latest version, so that a version
	// published meanwhile is offered by Notify if not by us. A fleet
	// token's node never replaces a connected node of the same id.
	switch h.register(c, fleet) {
	case registerStopped:
		return closeError{code: websocket.StatusGoingAway, reason: "console shutting down"}
	case registerDuplicate:
		return duplicateNode(hello.NodeID)
	}

	registered := h.gen.Load()
	h.nodeLog(hello.NodeID, slog.LevelInfo, "node connected", "node_id", hello.NodeID, "applied_version", hello.AppliedVersion,
		"address", addr, "build", hello.Build)

	pl, err := h.planSince(context.Background(), registered)
	if err != nil {
		h.unregister(c)
		h.log.Error("load snapshot for node", "node_id", hello.NodeID, "error", err)
		return closeError{code: websocket.StatusTryAgainLater, reason: "console cannot read the ruleset"}
	}
	if hello.AppliedVersion > pl.state.Head {
		h.nodeLog(hello.NodeID, slog.LevelWarn, "node runs a version newer than the console's latest", "node_id", hello.NodeID,
			"applied_version", hello.AppliedVersion, "latest_version", pl.state.Head)
	}
	c.offer(h, pl.forNode(c.labels))
	return nil
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

// claim binds the node token to nodeID (see store.ClaimNode); fleet is
// true for a fleet token, which is never bound.
func (h *Hub) claim(tokenID int64, nodeID string, actor store.Actor) (fleet bool, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), helloTimeout)
	defer cancel()
	fleet, err = h.store.ClaimNode(ctx, tokenID, nodeID, actor)
	var nb *store.NodeBoundError
	switch {
	case errors.As(err, &nb):
		return fleet, closeError{code: wire.CloseNodeBound, reason: nb.Error()}
	case err != nil:
		h.log.Error("bind node token", "node_id", nodeID, "error", err)
		return fleet, closeError{code: websocket.StatusTryAgainLater, reason: "console cannot check the node token"}
	}
	return fleet, nil
}

func duplicateNode(id string) closeError {
	return closeError{code: wire.CloseDuplicateNode, reason: fmt.Sprintf("node id %q is connected already; node ids must be unique", id)}
}

// readHello reads and checks the first message.
func readHello(ws *websocket.Conn) (*wire.Hello, error) {
	ctx, cancel := context.WithTimeout(context.Background(), helloTimeout)
	defer cancel()
	typ, data, err := ws.Read(ctx)
	if err != nil {
		return nil, fmt.Errorf("read hello: %w", err)
	}
	if typ != websocket.MessageText {
		return nil, closeError{code: websocket.StatusUnsupportedData, reason: "messages must be JSON text"}
	}
	msg, err := wire.Decode(data)
	if err != nil {
		return nil, closeError{code: websocket.StatusPolicyViolation, reason: "malformed hello: " + err.Error()}
	}
	hello, ok := msg.(*wire.Hello)
	if !ok {
		return nil, closeError{code: websocket.StatusPolicyViolation, reason: "the first message must be a hello"}
	}
	if err := wire.CheckProtocol(hello.Protocol); err != nil {
		return nil, closeError{code: wire.CloseUnsupportedProtocol, reason: err.Error()}
	}
	if err := hello.Validate(); err != nil {
		return nil, closeError{code: websocket.StatusPolicyViolation, reason: err.Error()}
	}
	return hello, nil
}

func newSession() string {
	b := make([]byte, 8)
	rand.Read(b)
	return hex.EncodeToString(b)
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
	h.changed()
	return registered
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

// offer sends snap to c unless c has it or was offered it already, without
// waiting: a writer goroutine runs while there is something to write, and
// a version offered while an older one is still waiting replaces it. A
// node offered more than behindLimit versions while one write to it is in
// progress is dropped: it reconnects and gets the latest snapshot then.
func (c *conn) offer(h *Hub, snap *encoded) {
	for {
		sent := c.sent.Load()
		if snap.version <= sent {
			return
		}
		if c.sent.CompareAndSwap(sent, snap.version) {
			break
		}
	}
	c.mu.Lock()
	c.addCatalog(snap.version, snap.catalog)
	c.mu.Unlock()
	c.wmu.Lock()
	c.next = snap
	start := !c.writing
	c.writing = true
	c.behind++
	behind := c.behind
	c.wmu.Unlock()
	if start {
		go h.write(c)
	}
	if behind > behindLimit {
		h.nodeLog(c.node.ID, slog.LevelWarn, "node too far behind; dropping its connection", "node_id", c.node.ID, "version", snap.version)
		c.drop(websocket.StatusTryAgainLater, "too far behind; reconnect for the latest snapshot")
	}
}

// write sends the offered snapshots until none is waiting, or the
// connection is dropped. A write that times out drops the node.
func (h *Hub) write(c *conn) {
	for {
		c.wmu.Lock()
		m := c.next
		c.next = nil
		if m == nil || c.ctx.Err() != nil {
			c.writing = false
			c.wmu.Unlock()
			return
		}
		c.wmu.Unlock()
		// The deadline is a timer that drops the node, not a context
		// derived from c.ctx: each derived context would leave a children
		// map on c.ctx for the connection's life.
		deadline := time.AfterFunc(h.writeTimeout, func() {
			h.nodeLog(c.node.ID, slog.LevelInfo, "send snapshot timed out; dropping the node", "node_id", c.node.ID, "version", m.version)
			c.drop(websocket.StatusTryAgainLater, "write timed out")
		})
		if len(m.data) > writeBufferSize {
			c.out.arm()
		}
		err := c.ws.Write(c.ctx, websocket.MessageText, m.data)
		if rerr := c.out.release(); err == nil {
			err = rerr
		}
		deadline.Stop()
		c.wmu.Lock()
		c.behind = 0
		c.wmu.Unlock()
		if err != nil {
			if c.ctx.Err() == nil {
				h.nodeLog(c.node.ID, slog.LevelInfo, "send snapshot failed; dropping the node", "node_id", c.node.ID, "version", m.version, "error", err)
				c.drop(websocket.StatusTryAgainLater, "write failed")
			}
			c.wmu.Lock()
			c.writing = false
			c.wmu.Unlock()
			return
		}
	}
}

// ping sends a keepalive ping to a node that sent nothing for
// pingInterval and waits for its pong (writes go on meanwhile), then arms
// the next one; a ping that times out drops the node. A node that reports
// stats every second is never pinged: its messages show it is there. It
// runs on the pinger timer's goroutine, so a connection holds no goroutine
// for its keepalive between pings.
func (h *Hub) ping(c *conn) {
	c.mu.Lock()
	quiet := time.Since(c.heard)
	c.mu.Unlock()
	if quiet < h.pingInterval {
		c.pinger.Reset(h.pingInterval - quiet)
		return
	}
	deadline := time.AfterFunc(h.writeTimeout, func() { c.drop(websocket.StatusGoingAway, "ping timed out") })
	err := c.ws.Ping(c.ctx)
	deadline.Stop()
	if c.ctx.Err() != nil {
		return // dropped
	}
	if err != nil {
		c.drop(websocket.StatusGoingAway, "ping failed")
		return
	}
	c.mu.Lock()
	c.heard = time.Now()
	c.node.LastSeen = c.heard.UTC()
	c.soft = true
	c.mu.Unlock()
	c.pinger.Reset(h.pingInterval)
}

// readBuffers hold node messages while they are decoded: a connection
// holds no read buffer of its own between messages, and ten thousand
// stats reports a second allocate none. Decoded messages share no memory
// with the buffer.
var readBuffers = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// putReadBuffer returns buf to readBuffers; a rare big one is dropped.
func putReadBuffer(buf *bytes.Buffer) {
	if buf != nil && buf.Cap() <= 64<<10 {
		buf.Reset()
		readBuffers.Put(buf)
	}
}

// read handles acks, nacks and stats until the connection closes.
func (h *Hub) read(ctx context.Context, c *conn) error {
	for {
		typ, r, err := c.ws.Reader(ctx)
		if err == nil && typ != websocket.MessageText {
			return closeError{code: websocket.StatusUnsupportedData, reason: "messages must be JSON text"}
		}
		var buf *bytes.Buffer
		if err == nil {
			buf = readBuffers.Get().(*bytes.Buffer)
			_, err = buf.ReadFrom(r)
		}
		if err != nil {
			putReadBuffer(buf)
			if c.dropped.Load() {
				return c.cause // the console closed it
			}
			switch websocket.CloseStatus(err) {
			case websocket.StatusNormalClosure, websocket.StatusGoingAway:
				return nil
			}
			return fmt.Errorf("read: %w", err)
		}
		q, err := h.apply(c, buf)
		putReadBuffer(buf)
		if err == nil && q != nil {
			// On a goroutine of its own, for the same reason as decodeJob:
			// recording a quota report takes database calls, deep.
			done := make(chan error, 1)
			go func() { done <- h.quota(ctx, c, q) }()
			err = <-done
		}
		if err != nil {
			return err
		}
	}
}

// decodeJob is one node message handed to the decoders: a connection's
// read loop waits while its message is decoded and applied elsewhere, so
// its own stack stays as shallow as reading needs (a decode grew it to
// 8 KiB, which it kept while parked for the next message: 40 % of what a
// connection costs the console).
type decodeJob struct {
	c     *conn
	data  *bytes.Buffer
	quota *wire.Quota // out: a quota report, for the read loop (it writes)
	err   error       // out
	done  chan struct{}
}

// decodeLoop decodes and applies the jobs it receives until Run ends.
func (h *Hub) decodeLoop() {
	for {
		select {
		case <-h.decodersStop:
			return
		case j := <-h.decodes:
			j.quota, j.err = h.decode(j.c, j.data.Bytes())
			j.done <- struct{}{}
		}
	}
}

// apply decodes and applies one message of c, on a decoder while Run's
// decoders run (here otherwise); it returns a quota report for the caller
// to handle.
func (h *Hub) apply(c *conn, data *bytes.Buffer) (*wire.Quota, error) {
	if !h.decoding.Load() {
		return h.decode(c, data.Bytes())
	}
	if c.job.done == nil {
		c.job = decodeJob{c: c, done: make(chan struct{}, 1)}
	}
	c.job.data = data
	select {
	case h.decodes <- &c.job:
		<-c.job.done
		return c.job.quota, c.job.err
	case <-h.decodersStop:
		return h.decode(c, data.Bytes())
	}
}

// decode decodes one message of c and applies it, except a quota report,
// which it returns. Its error is the one to close the connection with.
func (h *Hub) decode(c *conn, data []byte) (*wire.Quota, error) {
	msg, err := wire.Decode(data)
	if errors.Is(err, wire.ErrUnknownType) {
		// A newer node may send messages this console does not know.
		h.nodeLog(c.node.ID, slog.LevelDebug, "ignoring unknown message from node", "node_id", c.node.ID, "error", err)
		return nil, nil
	}
	if err != nil {
		return nil, closeError{code: websocket.StatusPolicyViolation, reason: "malformed message: " + err.Error()}
	}
	if q, ok := msg.(*wire.Quota); ok {
		return q, nil
	}
	return nil, h.handle(c, msg)
}

// handle applies one message from a node to its registry entry.
func (h *Hub) handle(c *conn, msg any) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.heard = time.Now()
	now := c.heard.UTC()
	c.node.LastSeen = now
	c.soft = true
	switch m := msg.(type) {
	case *wire.Ack:
		if m.Version <= 0 || m.Version > c.sent.Load() {
			return closeError{code: websocket.StatusPolicyViolation, reason: fmt.Sprintf("ack for version %d, which was not sent", m.Version)}
		}
		if m.Version != c.node.AppliedVersion && h.log.Enabled(context.Background(), slog.LevelDebug) {
			// Debug: a rollout to a thousand nodes is a thousand acks; the
			// registry and the versions API tell the story.
			h.log.Debug("node applied version", "node_id", c.node.ID, "version", m.Version)
		}
		if m.Version != c.node.AppliedVersion {
			c.ranBefore, c.switchedAt = c.node.AppliedVersion, now
		}
		c.node.AppliedVersion = m.Version
		c.pruneCatalogs()
		if c.node.NackVersion != nil && *c.node.NackVersion <= m.Version {
			c.node.NackVersion, c.node.NackError, c.node.NackedAt = nil, "", nil
		}
	case *wire.Nack:
		if m.Version <= 0 || m.Version > c.sent.Load() {
			return closeError{code: websocket.StatusPolicyViolation, reason: fmt.Sprintf("nack for version %d, which was not sent", m.Version)}
		}
		if m.Version <= c.node.AppliedVersion {
			return nil // it runs something newer already
		}
		v := m.Version
		// The error is the node's free text: NUL or invalid UTF-8 in it
		// must not make its registry row unwritable.
		m.Error = wire.CleanText(m.Error)
		c.node.NackVersion, c.node.NackError, c.node.NackedAt = &v, wire.Cut(m.Error, maxNackError), &now
		h.nodeLog(c.node.ID, slog.LevelWarn, "node rejected version", "node_id", c.node.ID, "version", m.Version,
			"applied_version", c.node.AppliedVersion, "error", wire.Cut(m.Error, 500))
	case *wire.Stats:
		// Rows the node's versions do not have, or that could not be
		// stored, are dropped; a malformed report as a whole is refused.
		cl, err := m.Clean(c.catView...)
		if err != nil {
			if h.stats != nil {
				h.stats.Refused("invalid")
			}
			return closeError{code: websocket.StatusPolicyViolation, reason: err.Error()}
		}
		h.noteCleaning(c, "stats", cl)
		c.node.Rates = rates(m, now)
		if h.stats != nil {
			// A refused report is counted by the sink and never
			// aggregated; the node stays connected for its snapshots.
			ingest := h.stats.Ingest
			if h.inCanary(c, m.IntervalMS, now) {
				ingest = h.stats.IngestCanary
			}
			if err := ingest(m, now); err != nil {
				h.nodeLog(c.node.ID, slog.LevelDebug, "stats report refused", "node_id", c.node.ID, "error", err)
			}
		}
		return nil // soft: written at most every softFlushEvery
	default:
		return closeError{code: websocket.StatusPolicyViolation, reason: fmt.Sprintf("unexpected %s message from a node", wireType(msg))}
	}
	if !c.dirty {
		c.dirty = true
		h.changed()
	}
	return nil
}

func wireType(msg any) string {
	switch msg.(type) {
	case *wire.Hello:
		return wire.TypeHello
	case *wire.Snapshot:
		return wire.TypeSnapshot
	}
	return fmt.Sprintf("%T", msg)
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
// loading and serializing a version only once.
func (h *Hub) latest(ctx context.Context) (*plan, error) {
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
	data, err := json.Marshal(ws)
	if err != nil {
		return nil, fmt.Errorf("encode snapshot %d: %w", snap.Version, err)
	}
	h.encodes.Add(1)
	e := &encoded{version: snap.Version, data: data, catalog: cat}
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
	// A node whose token was revoked since the last check gets nothing
	// more.
	if err := h.recheck(ctx); err != nil {
		return err
	}
	p, err := h.latest(ctx)
	if err != nil {
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
	return nil
}

// recheckLoop checks the tokens of the open connections every
// recheckEvery until ctx ends.
func (h *Hub) recheckLoop(ctx context.Context) {
	tick := time.NewTicker(h.recheckEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if err := h.recheck(ctx); err != nil && ctx.Err() == nil {
				h.log.Warn("check node tokens", "error", err)
			}
		}
	}
}

// recheck closes, with wire.CloseRevoked, every connection whose node
// token stopped working. One query covers every connection of the replica.
func (h *Hub) recheck(ctx context.Context) error {
	h.mu.Lock()
	conns := make([]*conn, 0, len(h.conns))
	for _, c := range h.conns {
		conns = append(conns, c)
	}
	h.mu.Unlock()
	if len(conns) == 0 {
		return nil
	}
	secrets := make([]string, 0, len(conns))
	seen := make(map[string]bool, len(conns))
	for _, c := range conns {
		if !seen[c.secret] {
			seen[c.secret] = true
			secrets = append(secrets, c.secret)
		}
	}
	live, err := h.store.LiveTokens(ctx, secrets)
	if err != nil {
		return err
	}
	for _, c := range conns {
		if t, ok := live[c.secret]; !ok || t.EffectiveRole != store.RoleNode {
			h.log.Info("node token revoked; closing its connection", "node_id", c.node.ID, "token_id", c.tokenID)
			c.drop(wire.CloseRevoked, "node token revoked")
		}
	}
	return nil
}

// Connected returns how many nodes are connected to this replica.
func (h *Hub) Connected() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.conns)
}

// Nodes returns the registry: every node Postgres knows, with the live
// state of the nodes connected to this replica. A node whose row says
// connected but that no replica has refreshed within StaleAfter (its
// replica died) is reported disconnected; rates older than a few seconds
// are left out.
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
		if n.Status != store.NodeConnected || (n.Rates != nil && now.Sub(n.Rates.At) > ratesStaleAfter) {
			n.Rates = nil
		}
	}
	slices.SortFunc(out, func(a, b store.Node) int { return cmp.Compare(a.ID, b.ID) })
	return out, nil
}
