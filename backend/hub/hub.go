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
// offered version is kept; older ones not yet written are skipped), and one
// ticker pings the nodes that went silent. Nothing waits on a node either:
// a node whose writes or pings time out, or that is offered behindLimit
// versions while one write to it is stuck, is dropped and catches up with a
// full snapshot when it reconnects. A snapshot is serialized once per version and the
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
//
// The files: hub.go holds the Hub and Run; conn.go a node connection (hello,
// reads, snapshot writes, keepalive, token rechecks) and buffers.go its
// small websocket buffers; plan.go what each node should run and the
// snapshot messages; registry.go the node registry and its writes to
// Postgres.
package hub

//lint:file-ignore SA1019 Sluice uses nhooyr.io/websocket, deprecated in favour of its maintained twin github.com/coder/websocket

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"nhooyr.io/websocket"

	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/rules/wire"
)

// The keepalive: the console pings a node it heard nothing from for
// pingInterval and drops it when the pong (or a write) takes writeTimeout:
// a node gone silent shows disconnected at most a minute later (the
// window, the ping timeout, two 5 s ticks of keepaliveLoop and the
// registry's next flush). An idle enforcer pings only a console it heard
// nothing from for 40 s (subscriber.DefaultPingInterval), so it hears the
// console's pings first and sends nothing but their pongs.
//
// The period is what an idle fleet costs: each keepalive is a ping frame
// written and a pong read, so its console CPU is proportional to
// 1/pingInterval. A node that crashed or closed its socket is seen at once
// (its TCP connection ends), so the window only matters for a node cut off
// without a word (a dead host, a partition). A hub takes these when it is
// made (New); they are variables only so that tests can shorten them.
var (
	writeTimeout = 10 * time.Second
	pingInterval = 30 * time.Second
	// recheckEvery is how often the node tokens of open connections are
	// checked again: a token disabled, rotated or expired, or whose owner
	// lost it (store.FindToken), ends its connection within this time, and
	// before any snapshot pushed later (Notify checks first).
	recheckEvery = 2 * time.Second
)

// Tunables of the push channel.
const (
	helloTimeout = 10 * time.Second
	// planTimeout bounds the Postgres reads of one plan (latest). They
	// hold planMu or loadMu, which every connecting node waits on: a
	// stalled Postgres must cost the nodes a failed hello, not the hub
	// for good.
	planTimeout = 10 * time.Second

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
	// ratesIdleAfter is how old a connected node's rates may be before
	// they read as zero: a node reports every second in which it decided
	// something, and nothing while idle.
	ratesIdleAfter = 3 * time.Second
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
	dirtyMu sync.Mutex           // guards dirty
	dirty   []*conn              // connections whose dirty flag was set since the last flush
	tokens  tokenChecks          // what recheck knows of the node tokens (conn.go)
	kick    chan struct{}

	encodes atomic.Int64 // snapshots serialized, for tests

	pingInterval, writeTimeout, recheckEvery time.Duration // see the variables
	planTimeout                              time.Duration // see the constant; tests shorten it

	decodes      chan *decodeJob // to the decoders Run starts
	decoding     atomic.Bool     // Run started the decoders
	decodersStop chan struct{}   // closed when Run stops them

	stats StatsSink // nil: stats reports only feed the node rates
	// pushed, when set, gets every push state Notify reads (SetPushHook).
	pushed func(context.Context, store.PushState)

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

// SetPushHook makes every Notify (each version published, rolled back or
// promoted on any replica, each rollout halted, and the periodic catch-up)
// call fn with the push state it read, after offering it to this replica's
// nodes: the xDS server (backend/xds) serves its nodes from the same state,
// with the same staged-rollout choice (store.PushState.Target). fn must not
// wait on a node. Call it before Run.
func (h *Hub) SetPushHook(fn func(context.Context, store.PushState)) { h.pushed = fn }

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
		pingInterval: pingInterval, writeTimeout: writeTimeout, recheckEvery: recheckEvery, planTimeout: planTimeout,
		decodes:      make(chan *decodeJob),
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
	bg.Go(func() { h.keepaliveLoop(ctx) })
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
	if err := h.flush(fctx, time.Now(), true); err != nil {
		return fmt.Errorf("hub: final registry flush: %w", err)
	}
	return nil
}
