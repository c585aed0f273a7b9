// Package subscriber keeps an enforcer's ruleset in step with the console:
// it holds the node's websocket subscription (/api/v1/nodes/stream), applies
// each snapshot the console pushes to the engine atomically, answers with an
// ack or a nack, reports decision stats every second in which it decided
// something (an idle node sends nothing but the pongs to the console's
// keepalive pings, and a ping of its own to a console it heard nothing from
// for PingInterval), and keeps the last applied snapshot on disk so that a
// node restarted while the console is down enforces at once.
//
// Given several console replicas, it holds one subscription at a time and
// moves to the next replica when its own goes away or cannot be reached.
//
// A node keeps at most wire.MaxMessageBytes of one console message in
// memory. A snapshot longer than that is read to its end and discarded, and
// nacked with its size and the bound on the same connection (its version is
// read from the message's first bytes), so the node stays connected on its
// version and the console's registry shows why, instead of the node
// reconnecting and being sent the same snapshot forever. (The console
// refuses to publish a version over wire.MaxSnapshotBytes, so only a version
// written before that bound can be that large.)
//
// Quota usage for billing goes to the console every 10 s and at shutdown, and
// is resent until acknowledged (quota.go).
//
// It is the only package of the node that imports the websocket library.
package subscriber

//lint:file-ignore SA1019 Sluice uses nhooyr.io/websocket, deprecated in favour of its maintained twin github.com/coder/websocket

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"nhooyr.io/websocket"

	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/internal/hearing"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/rules/wire"
)

// StreamPath is the console's node subscription endpoint.
const StreamPath = "/api/v1/nodes/stream"

// stableSession is how long a session must last for its end to restart
// the reconnect backoff.
const stableSession = time.Second

// restartSpread is the window over which the nodes of a console that is
// going away reconnect (at most MaxBackoff).
const restartSpread = 5 * time.Second

// Timing defaults.
const (
	// DefaultPingInterval is how long the node waits to hear from the
	// console before it pings it. The console pings a node silent for
	// 30 s (backend/hub) on a 5 s tick, so an idle node hears its pings
	// first and pings nothing itself; a busy node (stats every second)
	// is never pinged, and pings the console every 40 s.
	DefaultPingInterval  = 40 * time.Second
	DefaultMinBackoff    = 100 * time.Millisecond
	DefaultMaxBackoff    = 10 * time.Second
	DefaultStatsInterval = time.Second
	// writeTimeout bounds sending one message (hello, ack, nack) and one
	// ping round trip.
	writeTimeout = 10 * time.Second
	// dialTimeout bounds the websocket handshake.
	dialTimeout = 15 * time.Second
)

// StatsSource returns the decisions counted since its previous call (since
// the node started, for the first call), one entry per rule that decided
// something. The subscriber calls it once per stats interval while it is
// connected and sends the result to the console.
type StatsSource func() []wire.RuleStats

// Config configures a Subscriber.
type Config struct {
	// ConsoleURL is the console's base URL (http, https, ws or wss), or
	// several replicas' base URLs separated by commas; the stream path is
	// appended to each one's path. Replicas are tried in order, starting
	// with the first.
	ConsoleURL string
	// NodeToken is sent as "Authorization: Bearer <token>".
	NodeToken string
	// NodeID, Labels, Build and Region are reported in Hello.
	NodeID string
	Labels map[string]string
	Build  string
	Region string
	// StateDir keeps snapshot.json, the last applied snapshot. Empty means
	// nothing is persisted.
	StateDir string

	// PingInterval is the node's keepalive window (DefaultPingInterval
	// when zero): it pings a console it heard nothing from (no message,
	// no ping) for that long, and reconnects when the pong does not come.
	// With an HTTPClient whose Transport is not an *http.Transport the
	// node cannot see the console's pings, and pings every PingInterval.
	PingInterval time.Duration
	// MinBackoff and MaxBackoff bound the reconnect delay (exponential with
	// full jitter; defaults DefaultMinBackoff and DefaultMaxBackoff).
	MinBackoff, MaxBackoff time.Duration
	// StatsSource, when set, is drained every StatsInterval
	// (DefaultStatsInterval when zero) and reported to the console when it
	// (or PreviewSource) returned something.
	StatsSource   StatsSource
	StatsInterval time.Duration
	// PreviewSource, when set, adds the impact preview's ended spans to
	// each stats report (engine.Engine.TakePreview).
	PreviewSource func() []wire.RulePreview
	// QuotaSource, when set, is sent to the console every QuotaInterval
	// (DefaultQuotaInterval when zero), whenever QuotaFull is signalled,
	// and at shutdown (see quota.go).
	QuotaSource   QuotaSource
	QuotaFull     <-chan struct{}
	QuotaInterval time.Duration
	// HTTPClient dials the websocket; nil means http.DefaultClient.
	HTTPClient *http.Client
}

// Subscriber is a node's subscription to the console.
type Subscriber struct {
	cfg     Config
	urls    []string // stream URLs of the console replicas
	eng     *engine.Engine
	log     *slog.Logger
	started time.Time

	statsMu sync.Mutex
	statsAt time.Time // when StatsSource was last called

	mu       sync.Mutex // serialises applying snapshots
	applied  int64      // version applied, guarded by mu
	checksum string     // checksum of the applied snapshot, guarded by mu

	lastContact atomic.Int64 // unix nanoseconds, 0 = never
	connected   atomic.Bool

	// client dials the console; when hears, its connections touch
	// lastContact on every read, so the console's pings count.
	client *http.Client
	hears  bool
	pings  atomic.Int64 // keepalive pings sent

	quota *quotaState // quota batches (quota.go)
}

// New returns a Subscriber that applies snapshots to eng. It validates the
// console URL; nothing is dialled until Run.
func New(cfg Config, eng *engine.Engine, log *slog.Logger) (*Subscriber, error) {
	var urls []string
	for _, raw := range strings.Split(cfg.ConsoleURL, ",") {
		u, err := streamURL(raw)
		if err != nil {
			return nil, err
		}
		urls = append(urls, u)
	}
	if cfg.PingInterval <= 0 {
		cfg.PingInterval = DefaultPingInterval
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = DefaultMinBackoff
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = DefaultMaxBackoff
	}
	if cfg.MaxBackoff < cfg.MinBackoff {
		cfg.MaxBackoff = cfg.MinBackoff
	}
	if cfg.StatsInterval <= 0 {
		cfg.StatsInterval = DefaultStatsInterval
	}
	if cfg.QuotaInterval <= 0 {
		cfg.QuotaInterval = DefaultQuotaInterval
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	now := time.Now()
	s := &Subscriber{cfg: cfg, urls: urls, eng: eng, log: log, started: now, statsAt: now, quota: newQuotaState()}
	// Only a session's reads are the console's word (not a refused
	// handshake's response).
	s.client, s.hears = hearing.Client(cfg.HTTPClient, func() {
		if s.connected.Load() {
			s.touch()
		}
	})
	return s, nil
}

// streamURL turns the console base URL into the websocket URL of the stream.
func streamURL(raw string) (string, error) {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil {
		return "", fmt.Errorf("console url: %w", err)
	}
	switch u.Scheme {
	case "http", "ws":
		u.Scheme = "ws"
	case "https", "wss":
		u.Scheme = "wss"
	default:
		return "", fmt.Errorf("console url %q: scheme must be http, https, ws or wss", raw)
	}
	if u.Host == "" {
		return "", fmt.Errorf("console url %q: no host", raw)
	}
	u.Path = strings.TrimSuffix(u.Path, "/") + StreamPath
	u.RawPath = ""
	u.RawQuery, u.Fragment = "", ""
	return u.String(), nil
}

// AppliedVersion returns the ruleset version applied from a snapshot (from
// the console or the state file), 0 when none.
func (s *Subscriber) AppliedVersion() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.applied
}

// LastContact returns when anything (a message, a ping, a pong) last
// arrived from the console; the zero time when never.
func (s *Subscriber) LastContact() time.Time {
	n := s.lastContact.Load()
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

// ContactAge returns how long ago the console was last heard from; since
// the subscriber was created when it never was.
func (s *Subscriber) ContactAge() time.Duration {
	if t := s.LastContact(); !t.IsZero() {
		return time.Since(t)
	}
	return time.Since(s.started)
}

// Connected reports whether the subscription is currently established.
func (s *Subscriber) Connected() bool { return s.connected.Load() }

func (s *Subscriber) touch() { s.lastContact.Store(time.Now().UnixNano()) }

// Run keeps the subscription up until ctx is done. After each failure it
// moves to the next console replica and waits with exponential backoff
// and full jitter; the backoff restarts after a connection that got as far
// as sending Hello and stayed up for a second (unless the console then
// refused the node). A console
// that closes with "going away" (shutting down) tells all its nodes at
// once, so the first redial after it is drawn from [0, 5 s] (at most
// MaxBackoff) instead. It returns nil when ctx ends.
func (s *Subscriber) Run(ctx context.Context) error {
	attempt, next := 0, 0
	for {
		target := s.urls[next]
		next = (next + 1) % len(s.urls)
		began := time.Now()
		connected, err := s.session(ctx, target)
		if ctx.Err() != nil {
			return nil
		}
		switch websocket.CloseStatus(err) {
		case wire.CloseUnsupportedProtocol:
			s.log.ErrorContext(ctx, "console refused this node's protocol version; upgrade the node or the console",
				"console_url", target, "protocol", wire.ProtocolVersion, "error", err)
			connected = false
		case wire.CloseNodeBound:
			s.log.ErrorContext(ctx, "console refused this node id for this node token; each node needs a token of its own",
				"console_url", target, "node_id", s.cfg.NodeID, "error", err)
			connected = false
		case wire.CloseRevoked:
			s.log.ErrorContext(ctx, "console revoked this node's token; give the node a new one",
				"console_url", target, "node_id", s.cfg.NodeID, "error", err)
			connected = false
		case wire.CloseDuplicateNode:
			s.log.ErrorContext(ctx, "another node is connected with this node id; node ids must be unique",
				"console_url", target, "node_id", s.cfg.NodeID, "error", err)
			connected = false
		case wire.CloseReplaced:
			s.log.ErrorContext(ctx, "another node connected with the same node id; node ids must be unique",
				"console_url", target, "node_id", s.cfg.NodeID)
			connected = false
		}
		// Only a session that stayed up restarts the backoff: a path that
		// lets the hello through and then resets every connection (a
		// broken proxy) would otherwise be redialled at the shortest delay.
		if connected && time.Since(began) >= stableSession {
			attempt = 0
		}
		delay := s.backoff(attempt)
		if connected && websocket.CloseStatus(err) == websocket.StatusGoingAway {
			// The console is shutting down and tells all its nodes at
			// once: spread their reconnects over restartSpread, or ten
			// thousand nodes arrive within the first 100 ms.
			delay = rand.N(min(restartSpread, s.cfg.MaxBackoff) + 1)
		}
		attempt++
		s.log.WarnContext(ctx, "console subscription lost; reconnecting",
			"console_url", target, "next_console_url", s.urls[next], "retry_in", delay.Round(time.Millisecond).String(), "error", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(delay):
		}
	}
}

// backoff returns a delay uniformly drawn from [0, min(max, min·2^attempt)].
func (s *Subscriber) backoff(attempt int) time.Duration {
	ceiling := s.cfg.MaxBackoff
	if attempt < 30 {
		if d := s.cfg.MinBackoff << attempt; d > 0 && d < ceiling {
			ceiling = d
		}
	}
	return rand.N(ceiling + 1)
}

// session runs one connection until it fails or ctx ends. connected reports
// whether the handshake and Hello succeeded.
func (s *Subscriber) session(ctx context.Context, target string) (connected bool, err error) {
	dctx, cancel := context.WithTimeout(ctx, dialTimeout)
	conn, resp, err := websocket.Dial(dctx, target, &websocket.DialOptions{
		HTTPClient: s.client,
		HTTPHeader: http.Header{"Authorization": {"Bearer " + s.cfg.NodeToken}},
	})
	cancel()
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			return false, fmt.Errorf("dial console: HTTP %d: %w", resp.StatusCode, err)
		}
		return false, fmt.Errorf("dial console: %w", err)
	}
	defer conn.CloseNow()
	// The library's limit would close the connection on a message over it,
	// and the node would reconnect, be sent the same snapshot and loop.
	// readMessage bounds what is kept instead, and an oversized snapshot
	// is nacked.
	conn.SetReadLimit(-1)

	// The connection lives on its own context so that ending ctx can close
	// it with a proper close frame instead of tearing it down.
	cctx, stop := context.WithCancel(context.Background())
	defer stop()
	done, closed := make(chan struct{}), make(chan struct{})
	defer func() {
		close(done)
		<-closed // never leave a close handshake running behind us
	}()
	go func() {
		defer close(closed)
		select {
		case <-ctx.Done():
			if s.cfg.QuotaSource != nil && s.connected.Load() {
				s.flushQuota(cctx, conn)
			}
			conn.Close(websocket.StatusGoingAway, "node shutting down")
		case <-done:
		}
	}()

	if err := s.send(cctx, conn, wire.Hello{
		Type:           wire.TypeHello,
		Protocol:       wire.ProtocolVersion,
		NodeID:         s.cfg.NodeID,
		AppliedVersion: s.AppliedVersion(),
		Labels:         s.cfg.Labels,
		Build:          s.cfg.Build,
		Region:         s.cfg.Region,
	}); err != nil {
		return false, fmt.Errorf("send hello: %w", err)
	}
	s.touch()
	s.connected.Store(true)
	defer s.connected.Store(false)
	s.log.InfoContext(ctx, "subscribed to console", "console_url", target, "applied_version", s.AppliedVersion())

	go s.keepalive(cctx, conn)
	if s.cfg.StatsSource != nil {
		go s.reportStats(cctx, conn)
	}
	if s.cfg.QuotaSource != nil {
		go s.reportQuota(cctx, conn)
	}

	for {
		typ, data, size, err := readMessage(cctx, conn)
		if err != nil {
			return true, fmt.Errorf("read: %w", err)
		}
		s.touch()
		if typ != websocket.MessageText {
			continue
		}
		if size > wire.MaxMessageBytes {
			v, ok := snapshotVersion(data)
			if !ok {
				s.log.WarnContext(ctx, "ignoring oversized console message", "bytes", size, "max_bytes", wire.MaxMessageBytes)
				continue
			}
			err := fmt.Errorf("snapshot of version %d is %d bytes, over the %d bytes this node accepts", v, size, wire.MaxMessageBytes)
			s.log.WarnContext(ctx, "rejected ruleset snapshot", "version", v, "applied_version", s.AppliedVersion(), "error", err)
			if err := s.send(cctx, conn, wire.Nack{Type: wire.TypeNack, Version: v, Error: err.Error()}); err != nil {
				return true, fmt.Errorf("answer snapshot %d: %w", v, err)
			}
			continue
		}
		msg, err := wire.Decode(data)
		if errors.Is(err, wire.ErrUnknownType) {
			// A newer console may send messages this node does not know.
			continue
		}
		if err != nil {
			s.log.WarnContext(ctx, "ignoring malformed console message", "error", err)
			continue
		}
		if a, ok := msg.(*wire.QuotaAck); ok {
			s.quotaAcked(a)
			continue
		}
		snap, ok := msg.(*wire.Snapshot)
		if !ok {
			continue
		}
		if err := s.send(cctx, conn, s.handle(snap)); err != nil {
			return true, fmt.Errorf("answer snapshot %d: %w", snap.Version, err)
		}
	}
}

// readMessage reads the next message, keeping at most
// wire.MaxMessageBytes+1 bytes of it in memory: the rest of a longer one is
// read and discarded, so the connection stays usable. size is the
// message's full length.
func readMessage(ctx context.Context, conn *websocket.Conn) (typ websocket.MessageType, data []byte, size int64, err error) {
	typ, r, err := conn.Reader(ctx)
	if err != nil {
		return 0, nil, 0, err
	}
	data, err = io.ReadAll(io.LimitReader(r, wire.MaxMessageBytes+1))
	if err != nil {
		return 0, nil, 0, err
	}
	size = int64(len(data))
	if size > wire.MaxMessageBytes {
		n, err := io.Copy(io.Discard, r)
		if err != nil {
			return 0, nil, 0, err
		}
		size += n
	}
	return typ, data, size, nil
}

// snapshotVersion returns the version of a snapshot message from its first
// bytes (the console writes type and version before the domains), for a
// message too large to decode.
func snapshotVersion(prefix []byte) (int64, bool) {
	dec := json.NewDecoder(bytes.NewReader(prefix))
	dec.UseNumber()
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return 0, false
	}
	var (
		typ     string
		version int64
	)
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return 0, false
		}
		key, _ := t.(string)
		if key == "domains" {
			break // the long part; type and version come before it
		}
		var val any
		if err := dec.Decode(&val); err != nil {
			return 0, false
		}
		switch key {
		case "type":
			typ, _ = val.(string)
		case "version":
			if n, ok := val.(json.Number); ok {
				version, _ = n.Int64()
			}
		}
	}
	return version, typ == wire.TypeSnapshot && version > 0
}

// keepalive pings the console when the node heard nothing from it for
// PingInterval (every PingInterval when it cannot tell: see hears); a
// ping that gets no pong in time closes the connection, which ends the
// session's read loop.
func (s *Subscriber) keepalive(ctx context.Context, conn *websocket.Conn) {
	every := s.cfg.PingInterval
	if s.hears {
		every = max(every/8, time.Millisecond)
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if s.hears && time.Since(s.LastContact()) < s.cfg.PingInterval {
			continue
		}
		s.pings.Add(1)
		pctx, cancel := context.WithTimeout(ctx, writeTimeout)
		err := conn.Ping(pctx)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				conn.Close(websocket.StatusGoingAway, "ping timeout")
			}
			return
		}
		s.touch()
	}
}

// reportStats sends the StatsSource's counts every StatsInterval until ctx
// ends. An interval in which the node decided nothing sends nothing: an
// idle node costs the console only its keepalive pings, and the next
// report still covers one interval (the source is drained every
// interval), so the console's per-second series and the node's rates stay
// exact. A failed send closes the connection, which ends the session.
func (s *Subscriber) reportStats(ctx context.Context, conn *websocket.Conn) {
	t := time.NewTicker(s.cfg.StatsInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		st := s.stats()
		if len(st.Rules) == 0 && len(st.Preview) == 0 {
			continue
		}
		data, err := encodeStats(st)
		if err == nil {
			wctx, cancel := context.WithTimeout(ctx, writeTimeout)
			err = conn.Write(wctx, websocket.MessageText, data)
			cancel()
		}
		if err != nil {
			if ctx.Err() == nil {
				conn.Close(websocket.StatusGoingAway, "cannot send stats")
			}
			return
		}
	}
}

// stats drains the StatsSource into one message covering the time since
// the previous drain.
func (s *Subscriber) stats() wire.Stats {
	s.statsMu.Lock()
	defer s.statsMu.Unlock()
	rules := s.cfg.StatsSource()
	now := time.Now()
	ms := max(now.Sub(s.statsAt).Milliseconds(), 1)
	s.statsAt = now
	st := wire.Stats{Type: wire.TypeStats, IntervalMS: ms, Rules: rules}
	if s.cfg.PreviewSource != nil {
		st.Preview = s.cfg.PreviewSource()
	}
	return st
}

func (s *Subscriber) send(ctx context.Context, conn *websocket.Conn, msg any) error {
	data, err := json.Marshal(msg)
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, writeTimeout)
	defer cancel()
	return conn.Write(wctx, websocket.MessageText, data)
}

// handle applies snap if it is newer than the applied version and returns
// the answer for the console: a wire.Ack once the engine enforces it (or
// already did), a wire.Nack with the reason when it cannot be applied; the
// engine then keeps its old rules. A snapshot is persisted to the state dir
// after it is applied; a persist failure is logged but still acked, since
// the node does enforce the version.
func (s *Subscriber) handle(snap *wire.Snapshot) any {
	s.mu.Lock()
	defer s.mu.Unlock()
	nack := func(err error) any {
		s.log.Warn("rejected ruleset snapshot", "version", snap.Version, "applied_version", s.applied, "error", err)
		return wire.Nack{Type: wire.TypeNack, Version: snap.Version, Error: err.Error()}
	}
	switch {
	case snap.Version <= 0:
		return nack(fmt.Errorf("invalid version %d", snap.Version))
	case snap.Version == s.applied && snap.Checksum == s.checksum:
		return wire.Ack{Type: wire.TypeAck, Version: snap.Version}
	case snap.Version <= s.applied:
		return nack(fmt.Errorf("version %d is not newer than the applied version %d", snap.Version, s.applied))
	}
	if err := s.apply(snap); err != nil {
		return nack(err)
	}
	if err := s.persist(snap); err != nil {
		s.log.Error("persist ruleset snapshot", "version", snap.Version, "state_dir", s.cfg.StateDir, "error", err)
	}
	s.log.Info("applied ruleset", "version", snap.Version, "domains", len(snap.Domains))
	return wire.Ack{Type: wire.TypeAck, Version: snap.Version}
}

// apply verifies, parses and compiles snap and swaps it into the engine.
// Caller holds s.mu.
func (s *Subscriber) apply(snap *wire.Snapshot) error {
	set, err := Compile(snap)
	if err != nil {
		return err
	}
	if err := s.eng.Apply(snap.Version, set); err != nil {
		return err
	}
	s.eng.SetNodeCount(snap.NodeCount)
	s.eng.SetRegionCount(snap.RegionCount)
	s.applied, s.checksum = snap.Version, snap.Checksum
	return nil
}

// Compile verifies snap's checksum and compiles its domains into one
// ruleset (wire.Compile).
func Compile(snap *wire.Snapshot) (*rules.Set, error) { return wire.Compile(snap) }
