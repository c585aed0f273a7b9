package hub

//lint:file-ignore SA1019 Sluice uses nhooyr.io/websocket, deprecated in favour of its maintained twin github.com/coder/websocket

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
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

// conn is one node connection.
type conn struct {
	ws      *websocket.Conn
	out     *frameWriter      // under ws's write buffer; the hub's own frames too
	in      *lastRead         // under ws's read buffer: when the node was last heard
	tokenID int64             // the node token it authenticated with
	secret  string            // and that token's secret, checked again (recheck)
	labels  map[string]string // from hello; never changed
	region  string            // from hello; never changed
	// sent is the newest version offered to (or already held by) the node;
	// a version is never offered twice on one connection, so a nacked
	// version is not pushed again in a loop.
	sent atomic.Int64
	// tokenChecked: a recheck found its token live (the hub's tokenChecks
	// then covers it).
	tokenChecked atomic.Bool

	wmu     sync.Mutex
	next    *encoded // the latest version offered and not yet written; guarded by wmu
	writing bool     // a writer goroutine runs; guarded by wmu
	behind  int      // versions offered since the last write completed; guarded by wmu

	pinged   atomic.Int64 // when the unanswered keepalive ping was sent (unix ns), or 0 (keepaliveLoop)
	dropOnce sync.Once
	cause    closeError    // why the console closed the connection; set once, before dropped
	dropped  atomic.Bool   // drop was called
	closed   chan struct{} // closed once the websocket is closed

	mu        sync.Mutex // guards the fields below
	node      store.Node
	dirty     bool      // a change that must be written at the next flush
	soft      bool      // only last_seen or rates changed
	persisted time.Time // when the row was last handed to the store
	written   bool      // SaveNodes wrote this connection's row
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
// the close handshake runs in the background. A write in progress is let
// finish (the close frame waits for it, at most 5 s, before the library
// closes the socket); abort is for a node that stopped taking writes.
func (c *conn) drop(code websocket.StatusCode, reason string) {
	c.dropOnce.Do(func() {
		c.cause = closeError{code: code, reason: wire.Cut(reason, 120)}
		c.dropped.Store(true)
		go func() {
			c.out.closing() // no frame of the hub's after the close frame
			c.ws.Close(code, c.cause.reason)
			close(c.closed)
		}()
	})
}

// abort drops the connection and closes its socket at once: a write
// blocked on a node that stopped reading returns now, not when the close
// handshake gives up. The hub's writes have no deadline of their own (see
// send), so closing the socket is how they are cancelled.
func (c *conn) abort(code websocket.StatusCode, reason string) {
	c.drop(code, reason)
	c.out.Conn.Close()
}

// row returns a copy of the node's registry row; caller holds c.mu. The
// pointer fields are replaced, never modified in place, so sharing them
// is safe. Its last_seen is when anything last came from the node, a
// keepalive ping included.
func (c *conn) row() store.Node {
	n := c.node
	if heard := c.in.heard().UTC(); n.Status == store.NodeConnected && heard.After(n.LastSeen) {
		n.LastSeen = heard
	}
	return n
}

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
	go h.serve(ws, sb.out, sb.in, r.RemoteAddr, tokenID, secret, actor)
}

// serve runs one accepted node stream until it closes.
func (h *Hub) serve(ws *websocket.Conn, out *frameWriter, in *lastRead, addr string, tokenID int64, secret string, actor store.Actor) {
	c := &conn{ws: ws, out: out, in: in, tokenID: tokenID, secret: secret, closed: make(chan struct{})}

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
	tok, err := h.claim(tokenID, hello.NodeID, actor)
	if err != nil {
		return err
	}
	fleet := tok.Fleet
	// What the node runs decides what its reports may name.
	cctx, cancel := context.WithTimeout(context.Background(), helloTimeout)
	cat, err := h.catalog(cctx, hello.AppliedVersion)
	cancel()
	if err != nil {
		h.log.Error("load the ruleset a node runs", "node_id", hello.NodeID, "applied_version", hello.AppliedVersion, "error", err)
		return closeError{code: websocket.StatusTryAgainLater, reason: "console cannot read the ruleset"}
	}
	c.mu.Lock()
	now := time.Now().UTC()
	c.node = store.Node{ID: hello.NodeID, AppliedVersion: hello.AppliedVersion, Status: store.NodeConnected,
		Labels: hello.Labels, Region: hello.Region, Build: hello.Build, Address: addr, Protocol: hello.Protocol,
		ConnectedSince: &now, LastSeen: now, Console: h.id, Session: newSession(), Kind: store.NodeSluice, TokenID: &tok.ID, TokenName: &tok.Name}
	c.labels = hello.Labels
	c.region = hello.Region
	c.dirty = true
	c.addCatalog(hello.AppliedVersion, cat)
	row := c.row()
	c.mu.Unlock()
	c.sent.Store(hello.AppliedVersion)

	// A fleet token's node never replaces a connected node of the same
	// id: not one of another replica (the registry row, claimed in one
	// statement, so two replicas never both take an id), nor one of
	// this replica (register).
	claimed := false
	if fleet {
		if h.connectedHere(hello.NodeID) {
			return duplicateNode(hello.NodeID)
		}
		ctx, cancel := context.WithTimeout(context.Background(), helloTimeout)
		claim, err := h.store.ClaimNodeRow(ctx, row, time.Now().Add(-StaleAfter))
		cancel()
		switch {
		case err != nil:
			h.log.Error("claim fleet node id", "node_id", hello.NodeID, "error", err)
			return closeError{code: websocket.StatusTryAgainLater, reason: "console cannot check the node id"}
		case claim == store.NodeLiveElsewhere:
			return duplicateNode(hello.NodeID)
		}
		claimed = claim == store.NodeClaimed
	}

	// Register before reading the latest version, so that a version
	// published meanwhile is offered by Notify if not by us.
	var refused error
	switch h.register(c, fleet) {
	case registerStopped:
		refused = closeError{code: websocket.StatusGoingAway, reason: "console shutting down"}
	case registerDuplicate:
		refused = duplicateNode(hello.NodeID)
	}
	if refused != nil {
		if claimed { // give the row back: this connection will not serve it
			h.release(row)
		}
		return refused
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

// claim binds the node token to nodeID (see store.ClaimNode) and returns
// the token; a fleet token is never bound.
func (h *Hub) claim(tokenID int64, nodeID string, actor store.Actor) (store.Token, error) {
	ctx, cancel := context.WithTimeout(context.Background(), helloTimeout)
	defer cancel()
	tok, err := h.store.ClaimNode(ctx, tokenID, nodeID, actor)
	var nb *store.NodeBoundError
	switch {
	case errors.As(err, &nb):
		return tok, closeError{code: wire.CloseNodeBound, reason: nb.Error()}
	case err != nil:
		h.log.Error("bind node token", "node_id", nodeID, "error", err)
		return tok, closeError{code: websocket.StatusTryAgainLater, reason: "console cannot check the node token"}
	}
	return tok, nil
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
		c.abort(websocket.StatusTryAgainLater, "too far behind; reconnect for the latest snapshot")
	}
}

// write sends the offered snapshots until none is waiting, or the
// connection is dropped. A write that times out aborts the node.
func (h *Hub) write(c *conn) {
	for {
		c.wmu.Lock()
		m := c.next
		c.next = nil
		if m == nil || c.dropped.Load() {
			c.writing = false
			c.wmu.Unlock()
			return
		}
		c.wmu.Unlock()
		err := h.send(c, m.frame, "send snapshot", "version", m.version)
		c.wmu.Lock()
		c.behind = 0
		if err != nil {
			c.writing = false
			c.wmu.Unlock()
			return
		}
		c.wmu.Unlock()
	}
}

// send writes one frame (what, with attributes args, for the logs) to c and drops
// the node when it fails. A write still going on writeTimeout after it
// began is aborted by keepaliveLoop (a tick late at most): a timer per
// write would cost every write, and a deadline on the socket would hold
// the library's own writes to it too.
func (h *Hub) send(c *conn, frame []byte, what string, args ...any) error {
	err := c.out.writeFrame(frame)
	if err != nil && !c.dropped.Load() {
		h.nodeLog(c.node.ID, slog.LevelInfo, what+" failed; dropping the node", append([]any{"node_id", c.node.ID, "error", err}, args...)...)
		c.drop(websocket.StatusTryAgainLater, "write failed")
	}
	return err
}

// keepaliveLoop keeps the console and its nodes sure of each other until
// ctx ends: every tick it pings the registered nodes it heard nothing
// from for pingInterval, and drops those that have not answered a ping
// within writeTimeout, which the registry then shows disconnected (a node
// gone silent at most pingInterval + writeTimeout + two ticks earlier),
// and those with a write (frameWriter) going on for writeTimeout.
// The pings are the node's proof that the console is there too: an idle
// enforcer/subscriber pings only a console it heard nothing from for its
// own, longer window (subscriber.DefaultPingInterval), so in a quiet
// fleet only the console pings.
//
// One ticker serves every connection, and a node that reports stats costs
// it one atomic load a tick and no timer. A tick is a sixth of the window
// (5 s of 30 s): a scan of 10,000 connections takes a few milliseconds.
// An idle node is pinged on a tick, so the pings come in bursts (a fleet
// that acked a publish together is pinged together): the console's
// threads stay awake through a burst instead of waking for every ping,
// and a ping is one write of a frame built once, its pong one frame read.
func (h *Hub) keepaliveLoop(ctx context.Context) {
	tick := time.NewTicker(keepaliveTick(h.pingInterval))
	defer tick.Stop()
	var quiet []*conn
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		now := time.Now()
		since := now.Add(-h.pingInterval).UnixNano()
		late := now.Add(-h.writeTimeout).UnixNano()
		quiet = quiet[:0]
		h.mu.Lock()
		for _, c := range h.conns {
			if w := c.out.since.Load(); w != 0 && w <= late {
				h.nodeLog(c.node.ID, slog.LevelInfo, "write to node timed out; dropping the node", "node_id", c.node.ID)
				c.abort(websocket.StatusTryAgainLater, "write timed out")
				continue
			}
			heard := c.in.at.Load()
			if p := c.pinged.Load(); p != 0 {
				if heard < p { // not answered yet
					if p <= late {
						h.nodeLog(c.node.ID, slog.LevelInfo, "keepalive ping unanswered; dropping the node", "node_id", c.node.ID)
						c.abort(websocket.StatusGoingAway, "ping timed out")
					}
					continue
				}
				c.pinged.Store(0)
			}
			if heard <= since {
				quiet = append(quiet, c)
			}
		}
		h.mu.Unlock()
		for _, c := range quiet {
			c.pinged.Store(now.UnixNano())
			go h.ping(c)
		}
		clear(quiet) // holds no connection until the next tick
	}
}

// keepaliveTick is keepaliveLoop's tick for a keepalive window.
func keepaliveTick(window time.Duration) time.Duration { return min(5*time.Second, window/6) }

// ping sends a keepalive ping to c; keepaliveLoop waits for its pong,
// which is read like any frame, so lastRead has its time: last_seen
// reaches Postgres with the next heartbeat (heartbeatEvery).
func (h *Hub) ping(c *conn) {
	if err := c.out.writeFrame(pingFrame); err != nil && !c.dropped.Load() {
		c.drop(websocket.StatusGoingAway, "ping failed")
	}
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
		var q *wire.Quota
		if v, ok := plainAck(buf.Bytes()); ok {
			// Here: an ack is most of what a publish brings back, and
			// applying it is shallow (no decode to keep off this stack).
			err = h.handle(c, &wire.Ack{Type: wire.TypeAck, Version: v})
		} else {
			q, err = h.apply(c, buf)
		}
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

// ackPrefix starts an ack as encoding/json writes wire.Ack, which is how
// every node sends one.
const ackPrefix = `{"type":"` + wire.TypeAck + `","version":`

// plainAck returns the version of an ack written exactly as encoding/json
// writes wire.Ack (a decimal version of at most 18 digits and nothing
// else); anything else, an ack written another way included, is for
// wire.Decode.
func plainAck(data []byte) (int64, bool) {
	digits, ok := bytes.CutPrefix(data, []byte(ackPrefix))
	if !ok {
		return 0, false
	}
	digits, ok = bytes.CutSuffix(digits, []byte("}"))
	if !ok || len(digits) == 0 || len(digits) > 18 || (digits[0] == '0' && len(digits) > 1) {
		return 0, false
	}
	var v int64
	for _, d := range digits {
		if d < '0' || d > '9' {
			return 0, false
		}
		v = v*10 + int64(d-'0')
	}
	return v, true
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
	now := time.Now().UTC()
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
		h.markDirty(c)
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

// recheckLoop checks the tokens of the open connections every
// recheckEvery until ctx ends (see recheck: cheap while no token changes).
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

// tokenChecks is what recheck knows of the node tokens: the count of
// token changes (store.AuthChanges) when it last checked every
// connection, and the earliest expiry among the tokens it found live.
type tokenChecks struct {
	mu         sync.Mutex // held through a recheck: one at a time
	valid      bool       // changes and expires are set
	changes    int64
	nextExpiry time.Time // zero: none expires
}

// recheck closes, with wire.CloseRevoked, every connection whose node
// token stopped working. Every connection is checked when a token or user
// change was committed since the last full check (store.AuthChanges) or a
// token it found live has expired since; otherwise only the connections
// that opened since are: an idle check is one single-row query, not a
// read of every node's token. One query covers the connections checked.
func (h *Hub) recheck(ctx context.Context) error {
	tc := &h.tokens
	tc.mu.Lock()
	defer tc.mu.Unlock()
	// Read before the tokens: a change committed after this read is seen
	// by the next recheck.
	changes, err := h.store.AuthChanges(ctx)
	if err != nil {
		return err
	}
	now := time.Now()
	full := !tc.valid || changes != tc.changes || (!tc.nextExpiry.IsZero() && !now.Before(tc.nextExpiry))
	h.mu.Lock()
	conns := make([]*conn, 0, len(h.conns))
	for _, c := range h.conns {
		if full || !c.tokenChecked.Load() {
			conns = append(conns, c)
		}
	}
	h.mu.Unlock()
	if len(conns) == 0 {
		if full {
			tc.valid, tc.changes, tc.nextExpiry = true, changes, time.Time{}
		}
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
	next := tc.nextExpiry
	if full {
		next = time.Time{}
	}
	for _, c := range conns {
		t, ok := live[c.secret]
		if !ok || t.EffectiveRole != store.RoleNode {
			h.log.Info("node token revoked; closing its connection", "node_id", c.node.ID, "token_id", c.tokenID)
			c.drop(wire.CloseRevoked, "node token revoked")
			continue
		}
		c.tokenChecked.Store(true)
		if t.ExpiresAt != nil && (next.IsZero() || t.ExpiresAt.Before(next)) {
			next = *t.ExpiresAt
		}
	}
	tc.nextExpiry = next
	if full {
		tc.valid, tc.changes = true, changes
	}
	return nil
}
