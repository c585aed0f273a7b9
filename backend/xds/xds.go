// Package xds serves the console's rulesets to stock envoyproxy/ratelimit
// processes ("Lyft") over xDS: ADS, state of the world, resource type
// type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig, one
// resource per domain, on go-control-plane's server and snapshot cache.
//
// A client authenticates with gRPC metadata "authorization: Bearer <node
// token>" (a node token of the console; anything else is refused with
// Unauthenticated, or PermissionDenied for a token of another role). Its
// node.id is its registry id, bound to the token as a Sluice enforcer's is
// (store.ClaimNode); its node metadata are its labels, so a staged rollout
// selects it as it would an enforcer (store.PushState.Target, read by the
// hub on every publish, rollback, promote and halt: hub.SetPushHook). The
// snapshot version_info is the ruleset version; the client's ACK is its
// applied version and its NACK (error_detail.message) its nack error in
// the node registry (GET /api/v1/nodes, kind "xds"). As with an enforcer,
// a client is never sent a version at or below the one it runs, and a
// version it rejected is not sent to it again.
//
// What a client is sent is lyft.Translate's: a domain Lyft can express goes out
// in Lyft's semantics (fixed windows); a domain using what Lyft cannot
// express is left out, and the node's registry row names it and says why
// (unsupported_domains).
//
// Registry rows are written by one flusher (every flushInterval when
// something changed, and a heartbeat every heartbeatEvery so other
// replicas see the row is live); a token revoked while its client is
// connected ends the stream within recheckEvery.
package xds

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	xdslog "github.com/envoyproxy/go-control-plane/pkg/log"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	server "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/backend/xds/lyft"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/rules/wire"
)

// Tunables. Variables only so that tests can shorten them.
var (
	flushInterval  = 250 * time.Millisecond
	heartbeatEvery = 10 * time.Second
	recheckEvery   = 2 * time.Second
)

const (
	// helloTimeout bounds the database work of a client's first request.
	helloTimeout = 10 * time.Second
	// keepTranslated is how many versions' translations stay cached.
	keepTranslated = 4
	// keepNonces is how many responses per stream are remembered, to tell
	// which version an ACK or NACK answers.
	keepNonces = 8
	// maxNackError bounds the stored text of a NACK, as the hub's does.
	maxNackError = 2000
	// maxMessageBytes bounds a client's request message.
	maxMessageBytes = 1 << 20
	// maxStreamsPerConn bounds the streams of one client connection.
	maxStreamsPerConn = 8
)

// Config is what the xDS server needs.
type Config struct {
	Store *store.Store
	Log   *slog.Logger
	// Console is this console replica's id (hub.Hub.ID), shown as the
	// console of its xDS nodes.
	Console string
	// StaleAfter is how long a connected row may go unrefreshed before
	// another replica may take the node (hub.StaleAfter).
	StaleAfter time.Duration
}

// Server is the xDS config server of one console replica.
type Server struct {
	store      *store.Store
	log        *slog.Logger
	console    string
	staleAfter time.Duration
	cache      cache.SnapshotCache
	ctx        context.Context // ends the xDS streams when cancelled
	cancel     context.CancelFunc
	grpc       *grpc.Server

	mu      sync.Mutex
	streams map[int64]*stream  // by stream id
	nodes   map[string]*stream // by node id: the stream that holds the node
	gone    []store.Node       // final rows of closed streams, not yet written
	kick    chan struct{}

	trMu       sync.Mutex
	translated map[int64]*translation // by version, the few newest
}

// New returns a server; Serve runs it.
func New(cfg Config) *Server {
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{store: cfg.Store, log: log, console: cfg.Console, staleAfter: cmp.Or(cfg.StaleAfter, time.Minute),
		ctx: ctx, cancel: cancel, streams: make(map[int64]*stream), nodes: make(map[string]*stream),
		kick: make(chan struct{}, 1), translated: make(map[int64]*translation)}
	s.cache = cache.NewSnapshotCache(true, cache.IDHash{}, libLogger(log))
	xs := server.NewServer(ctx, nackAware{s.cache, s}, server.CallbackFuncs{
		StreamOpenFunc:     s.open,
		StreamClosedFunc:   s.closed,
		StreamRequestFunc:  s.request,
		StreamResponseFunc: s.response,
		DeltaStreamOpenFunc: func(context.Context, int64, string) error {
			return status.Error(codes.Unimplemented, "this server speaks state-of-the-world xDS only")
		},
		FetchRequestFunc: func(context.Context, *discovery.DiscoveryRequest) error {
			return status.Error(codes.Unimplemented, "this server speaks streaming ADS only")
		},
	})
	s.grpc = grpc.NewServer(
		grpc.ChainStreamInterceptor(s.authenticate),
		grpc.UnaryInterceptor(func(context.Context, any, *grpc.UnaryServerInfo, grpc.UnaryHandler) (any, error) {
			return nil, status.Error(codes.Unimplemented, "no unary methods")
		}),
		grpc.MaxRecvMsgSize(maxMessageBytes),
		// A client holds one ADS stream per connection.
		grpc.MaxConcurrentStreams(maxStreamsPerConn),
		// Dead clients are found by pings; clients may ping every 10 s.
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	)
	discovery.RegisterAggregatedDiscoveryServiceServer(s.grpc, xs)
	return s
}

// Serve serves xDS on ln until ctx ends, then closes every stream and
// writes the registry one last time.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	errc := make(chan error, 1)
	go func() { errc <- s.grpc.Serve(ln) }()
	var bg sync.WaitGroup
	loops, stopLoops := context.WithCancel(context.Background())
	bg.Go(func() { s.flushLoop(loops) })
	bg.Go(func() { s.recheckLoop(loops) })
	var err error
	select {
	case err = <-errc:
		err = fmt.Errorf("serve xds: %w", err)
	case <-ctx.Done():
	}
	s.cancel() // the streams end (their clients reconnect elsewhere)
	done := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		s.grpc.Stop()
	}
	stopLoops()
	bg.Wait()
	fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if ferr := s.flush(fctx, time.Now(), true); ferr != nil && err == nil {
		err = fmt.Errorf("xds: final registry flush: %w", ferr)
	}
	return err
}

// session is one authenticated gRPC stream, as the interceptor saw it.
type session struct {
	tokenID int64
	secret  string
	addr    string
	end     context.CancelCauseFunc // ends the RPC with a status error
}

type sessionKey struct{}

// authenticate checks the stream's node token and runs the stream so that
// end can close it from the server's side (a token revoked, a node
// replaced).
func (s *Server) authenticate(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	secret, err := bearer(ss.Context())
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ss.Context(), helloTimeout)
	tok, err := s.store.FindToken(ctx, secret)
	cancel()
	switch {
	case errors.Is(err, store.ErrNotFound):
		return status.Error(codes.Unauthenticated, "node token not valid (unknown, disabled or expired)")
	case err != nil:
		s.log.Error("check xds node token", "error", err)
		return status.Error(codes.Unavailable, "console cannot check the node token")
	case tok.EffectiveRole != store.RoleNode:
		return status.Error(codes.PermissionDenied, "not a node token: create one with role node")
	}
	sctx, end := context.WithCancelCause(ss.Context())
	defer end(nil)
	sess := &session{tokenID: tok.ID, secret: secret, end: end}
	if p, ok := peer.FromContext(ss.Context()); ok {
		sess.addr = p.Addr.String()
	}
	done := make(chan error, 1)
	go func() {
		done <- handler(srv, &sessionStream{ServerStream: ss, ctx: context.WithValue(sctx, sessionKey{}, sess)})
	}()
	select {
	case err := <-done:
		return err
	case <-sctx.Done():
		if ss.Context().Err() != nil {
			return <-done // the client went away
		}
		return context.Cause(sctx)
	}
}

// bearer returns the node token of a stream's metadata.
func bearer(ctx context.Context) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get("authorization")
	if len(vals) != 1 {
		return "", status.Error(codes.Unauthenticated, "send gRPC metadata authorization: Bearer <node token>")
	}
	scheme, secret, ok := strings.Cut(strings.TrimSpace(vals[0]), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(secret) == "" {
		return "", status.Error(codes.Unauthenticated, "authorization must be Bearer <node token>")
	}
	return strings.TrimSpace(secret), nil
}

// sessionStream is a stream whose context carries its session.
type sessionStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *sessionStream) Context() context.Context { return s.ctx }

// stream is one xDS client's stream.
type stream struct {
	id   int64
	sess *session

	pushMu sync.Mutex // serializes choosing and setting the node's snapshot

	mu     sync.Mutex
	labels map[string]string
	node   store.Node // ID empty until the first request
	fleet  bool
	sent   int64            // the newest version set as the node's snapshot, or that it runs
	nonces map[string]int64 // response nonce → its version, the last few
	order  []string         // nonces, oldest first
	dirty  bool
	saved  time.Time // when the row was last handed to the store
}

func (st *stream) nodeID() string {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.node.ID
}

// open registers a new stream.
func (s *Server) open(ctx context.Context, id int64, typeURL string) error {
	sess, _ := ctx.Value(sessionKey{}).(*session)
	if sess == nil {
		return status.Error(codes.Unauthenticated, "no session")
	}
	if typeURL != "" && typeURL != resource.RateLimitConfigType {
		return status.Errorf(codes.InvalidArgument, "this server serves %s only", resource.RateLimitConfigType)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.streams[id] = &stream{id: id, sess: sess, nonces: make(map[string]int64)}
	return nil
}

// request handles a client's request: the first says hello, the later
// ones ACK or NACK a response.
func (s *Server) request(id int64, req *discovery.DiscoveryRequest) error {
	s.mu.Lock()
	st := s.streams[id]
	s.mu.Unlock()
	if st == nil {
		return status.Error(codes.Internal, "unknown stream")
	}
	if t := req.GetTypeUrl(); t != resource.RateLimitConfigType {
		return status.Errorf(codes.InvalidArgument, "type %q: this server serves %s only", t, resource.RateLimitConfigType)
	}
	if st.nodeID() == "" {
		return s.hello(st, req)
	}
	if n := req.GetNode(); n != nil && n.GetId() != st.nodeID() {
		return status.Errorf(codes.InvalidArgument, "node.id changed from %q to %q on one stream", st.nodeID(), n.GetId())
	}
	if req.GetResponseNonce() == "" {
		return nil // a subscription, not an answer
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	v, known := st.nonces[req.GetResponseNonce()]
	if !known {
		return nil // stale: the server ignores it too
	}
	now := time.Now().UTC()
	st.node.LastSeen = now
	if detail := req.GetErrorDetail(); detail != nil {
		if v <= st.node.AppliedVersion {
			return nil
		}
		msg := wire.Cut(wire.CleanText(detail.GetMessage()), maxNackError)
		st.node.NackVersion, st.node.NackError, st.node.NackedAt = &v, msg, &now
		s.log.Warn("xds node rejected version", "node_id", st.node.ID, "version", v, "applied_version", st.node.AppliedVersion,
			"error", wire.Cut(msg, 500))
	} else {
		if v != st.node.AppliedVersion {
			s.log.Debug("xds node applied version", "node_id", st.node.ID, "version", v)
		}
		st.node.AppliedVersion = v
		if st.node.NackVersion != nil && *st.node.NackVersion <= v {
			st.node.NackVersion, st.node.NackError, st.node.NackedAt = nil, "", nil
		}
	}
	st.dirty = true
	s.changed()
	return nil
}

// hello handles a stream's first request: it checks the node, binds the
// token to its id, registers it and sets the snapshot it should run.
func (s *Server) hello(st *stream, req *discovery.DiscoveryRequest) error {
	n := req.GetNode()
	applied, _ := strconv.ParseInt(req.GetVersionInfo(), 10, 64) // not ours: send ours
	h := wire.Hello{NodeID: n.GetId(), AppliedVersion: max(applied, 0), Labels: labels(n), Build: build(n)}
	if err := h.Validate(); err != nil {
		return status.Error(codes.InvalidArgument, strings.Replace(err.Error(), "hello: node_id", "node.id", 1))
	}
	ctx, cancel := context.WithTimeout(context.Background(), helloTimeout)
	defer cancel()
	tok, err := s.store.ClaimNode(ctx, st.sess.tokenID, h.NodeID, store.Actor{Name: "node:" + h.NodeID, IP: host(st.sess.addr)})
	var nb *store.NodeBoundError
	switch {
	case errors.As(err, &nb):
		return status.Error(codes.PermissionDenied, nb.Error())
	case err != nil:
		s.log.Error("bind xds node token", "node_id", h.NodeID, "error", err)
		return status.Error(codes.Unavailable, "console cannot check the node token")
	}
	fleet := tok.Fleet
	now := time.Now().UTC()
	st.mu.Lock()
	st.fleet, st.labels, st.sent = fleet, h.Labels, h.AppliedVersion
	st.node = store.Node{ID: h.NodeID, AppliedVersion: h.AppliedVersion, Status: store.NodeConnected, Labels: h.Labels,
		Build: h.Build, Address: st.sess.addr, ConnectedSince: &now, LastSeen: now, Console: s.console,
		Session: newSession(), Kind: store.NodeXDS, TokenID: &tok.ID, TokenName: &tok.Name}
	st.dirty = true
	row := st.node
	st.mu.Unlock()
	if fleet {
		// A fleet token's node claims its id in the registry in one
		// statement, so no two nodes (on any replica) share one.
		s.mu.Lock()
		here := s.nodes[h.NodeID] != nil
		s.mu.Unlock()
		if here {
			return duplicate(h.NodeID)
		}
		claim, err := s.store.ClaimNodeRow(ctx, row, time.Now().Add(-s.staleAfter))
		switch {
		case err != nil:
			s.log.Error("claim fleet node id", "node_id", h.NodeID, "error", err)
			return status.Error(codes.Unavailable, "console cannot check the node id")
		case claim == store.NodeLiveElsewhere:
			return duplicate(h.NodeID)
		}
	}

	s.mu.Lock()
	old := s.nodes[h.NodeID]
	if old != nil && fleet {
		s.mu.Unlock()
		return duplicate(h.NodeID)
	}
	s.nodes[h.NodeID] = st
	s.mu.Unlock()
	if old != nil {
		old.sess.end(status.Error(codes.Aborted, "replaced by a newer stream of the same node"))
	}
	s.changed()
	s.log.Info("xds node connected", "node_id", h.NodeID, "applied_version", h.AppliedVersion, "address", st.sess.addr)

	ps, err := s.store.FindPushState(ctx)
	if err != nil {
		s.log.Error("read push state for xds node", "node_id", h.NodeID, "error", err)
		return status.Error(codes.Unavailable, "console cannot read the ruleset")
	}
	if err := s.offer(ctx, st, ps); err != nil {
		s.log.Error("load snapshot for xds node", "node_id", h.NodeID, "error", err)
		return status.Error(codes.Unavailable, "console cannot read the ruleset")
	}
	return nil
}

func duplicate(id string) error {
	return status.Errorf(codes.AlreadyExists, "node id %q is connected already; node ids must be unique", id)
}

// labels are a node's string metadata.
func labels(n *core.Node) map[string]string {
	out := make(map[string]string)
	for k, v := range n.GetMetadata().GetFields() {
		if sv, ok := v.GetKind().(*structpb.Value_StringValue); ok {
			out[k] = sv.StringValue
		}
	}
	return out
}

// build names the client software, as far as its node says.
func build(n *core.Node) string {
	name := strings.TrimSpace(n.GetUserAgentName() + " " + n.GetUserAgentVersion())
	return cmp.Or(name, "xds client")
}

func host(addr string) string {
	if h, _, err := net.SplitHostPort(addr); err == nil {
		return h
	}
	return addr
}

func newSession() string {
	b := make([]byte, 8)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// response remembers which version a response carries, for the ACK or NACK
// that answers it.
func (s *Server) response(_ context.Context, id int64, _ *discovery.DiscoveryRequest, resp *discovery.DiscoveryResponse) {
	s.mu.Lock()
	st := s.streams[id]
	s.mu.Unlock()
	if st == nil {
		return
	}
	v, _ := strconv.ParseInt(resp.GetVersionInfo(), 10, 64)
	st.mu.Lock()
	defer st.mu.Unlock()
	st.nonces[resp.GetNonce()] = v
	st.order = append(st.order, resp.GetNonce())
	for len(st.order) > keepNonces {
		delete(st.nonces, st.order[0])
		st.order = st.order[1:]
	}
}

// closed unregisters a stream and queues its node's final row.
func (s *Server) closed(id int64, _ *core.Node) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.streams[id]
	delete(s.streams, id)
	if st == nil {
		return
	}
	st.mu.Lock()
	row := st.node
	st.mu.Unlock()
	if row.ID == "" || s.nodes[row.ID] != st {
		return // never said hello, or replaced
	}
	delete(s.nodes, row.ID)
	s.cache.ClearSnapshot(row.ID)
	row.Status, row.LastSeen = store.NodeDisconnected, time.Now().UTC()
	s.gone = append(s.gone, row)
	s.log.Info("xds node disconnected", "node_id", row.ID)
	s.changed()
}

// Push sets, for every connected client, the snapshot ps says it should
// run, unless it runs or was sent that version or a newer one. The hub
// calls it on every Notify (hub.SetPushHook).
func (s *Server) Push(ctx context.Context, ps store.PushState) {
	s.mu.Lock()
	streams := slices.Collect(maps.Values(s.nodes))
	s.mu.Unlock()
	for _, st := range streams {
		if err := s.offer(ctx, st, ps); err != nil && ctx.Err() == nil {
			s.log.Warn("push to xds node", "node_id", st.nodeID(), "error", err)
		}
	}
}

// offer sets st's snapshot to the version ps targets for its labels if it
// is newer than what st runs or was sent, and records the domains of that
// version it cannot run.
func (s *Server) offer(ctx context.Context, st *stream, ps store.PushState) error {
	st.pushMu.Lock()
	defer st.pushMu.Unlock()
	st.mu.Lock()
	target, sent, id := ps.Target(st.labels), st.sent, st.node.ID
	st.mu.Unlock()
	if target <= 0 {
		return nil // nothing published yet
	}
	if target <= sent && st.unsupportedKnown() {
		return nil // it has it, or something newer
	}
	tr, err := s.translation(ctx, target)
	if err != nil {
		return err
	}
	st.mu.Lock()
	st.node.UnsupportedDomains = tr.unsupported
	st.dirty = true
	send := target > st.sent
	if send {
		st.sent = target
	}
	st.mu.Unlock()
	s.changed()
	if !send {
		return nil
	}
	return s.cache.SetSnapshot(ctx, id, tr.snapshot)
}

func (st *stream) unsupportedKnown() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.node.UnsupportedDomains != nil
}

// translation is one version as xDS clients get it.
type translation struct {
	snapshot    *cache.Snapshot
	unsupported []store.UnsupportedDomain // never nil
}

// translation returns version v translated, from the cache when it can.
func (s *Server) translation(ctx context.Context, v int64) (*translation, error) {
	s.trMu.Lock()
	defer s.trMu.Unlock()
	if tr := s.translated[v]; tr != nil {
		return tr, nil
	}
	snap, err := s.store.FindSnapshot(ctx, v)
	if err != nil {
		return nil, err
	}
	tr := &translation{unsupported: []store.UnsupportedDomain{}}
	var res []types.Resource
	for _, d := range snap.Domains {
		dom, err := rules.Parse(d.Name+".yaml", []byte(d.Enforced()))
		if err != nil {
			// Published versions parse; say so rather than send a guess.
			tr.unsupported = append(tr.unsupported, store.UnsupportedDomain{Domain: d.Name, Reasons: []string{"does not parse: " + wire.Cut(err.Error(), 500)}})
			continue
		}
		conf, reasons := lyft.Translate(dom)
		if reasons != nil {
			tr.unsupported = append(tr.unsupported, store.UnsupportedDomain{Domain: d.Name, Reasons: reasons})
			continue
		}
		res = append(res, conf)
	}
	tr.snapshot, err = cache.NewSnapshot(strconv.FormatInt(v, 10), map[resource.Type][]types.Resource{resource.RateLimitConfigType: res})
	if err != nil {
		return nil, fmt.Errorf("xds snapshot of version %d: %w", v, err)
	}
	s.translated[v] = tr
	for len(s.translated) > keepTranslated {
		delete(s.translated, slices.Min(slices.Collect(maps.Keys(s.translated))))
	}
	return tr, nil
}

// nackAware is the snapshot cache, except that a NACK holds the client's
// watch until a newer version comes, instead of sending the version it
// rejected straight back: the cache compares a request's version_info
// with the snapshot's, and a NACK carries the version the client kept.
type nackAware struct {
	cache.SnapshotCache
	s *Server
}

func (c nackAware) CreateWatch(req *cache.Request, sub cache.Subscription, value chan cache.Response) (func(), error) {
	if req.GetErrorDetail() != nil {
		if v, ok := c.s.answered(req.GetNode().GetId(), req.GetResponseNonce()); ok {
			r := proto.Clone(req).(*discovery.DiscoveryRequest)
			r.VersionInfo = strconv.FormatInt(v, 10)
			req = r
		}
	}
	return c.SnapshotCache.CreateWatch(req, sub, value)
}

// answered returns the version of the response with nonce sent to node.
func (s *Server) answered(node, nonce string) (int64, bool) {
	s.mu.Lock()
	st := s.nodes[node]
	s.mu.Unlock()
	if st == nil {
		return 0, false
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	v, ok := st.nonces[nonce]
	return v, ok
}

// Connected returns how many xDS nodes are connected to this replica.
func (s *Server) Connected() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.nodes)
}

// changed asks the flusher to write soon.
func (s *Server) changed() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// flushLoop writes changed rows until ctx ends: at most every
// flushInterval, and every connected row every heartbeatEvery.
func (s *Server) flushLoop(ctx context.Context) {
	tick := time.NewTicker(flushInterval)
	defer tick.Stop()
	dirty, failing := false, false
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.kick:
			dirty = true
			continue
		case <-tick.C:
		}
		now := time.Now()
		if !dirty && !s.heartbeatDue(now) {
			continue
		}
		dirty = false
		switch err := s.flush(ctx, now, false); {
		case err != nil && !failing && ctx.Err() == nil:
			s.log.Error("write xds node registry; will retry", "error", err)
			failing, dirty = true, true
		case err != nil:
			dirty = true
		case failing:
			s.log.Info("xds node registry written again")
			failing = false
		}
	}
}

func (s *Server) heartbeatDue(now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, st := range s.nodes {
		st.mu.Lock()
		due := now.Sub(st.saved) >= heartbeatEvery
		st.mu.Unlock()
		if due {
			return true
		}
	}
	return false
}

// flush writes the rows of closed streams and of connected nodes that
// changed or whose heartbeat is due; final writes every connected node as
// disconnected (shutdown). What fails to be written is written next time.
func (s *Server) flush(ctx context.Context, now time.Time, final bool) error {
	s.mu.Lock()
	gone := s.gone
	s.gone = nil
	batch := slices.Clone(gone)
	var taken []*stream
	for _, st := range s.nodes {
		st.mu.Lock()
		if final || st.dirty || now.Sub(st.saved) >= heartbeatEvery {
			st.node.LastSeen = now.UTC() // the stream is open: gRPC keepalive ends dead ones
			row := st.node
			if final {
				row.Status = store.NodeDisconnected
			}
			batch = append(batch, row)
			st.dirty, st.saved = false, now
			taken = append(taken, st)
		}
		st.mu.Unlock()
	}
	s.mu.Unlock()
	if len(batch) == 0 {
		return nil
	}
	err := s.store.SaveNodes(ctx, batch, s.staleAfter)
	var refused *store.RefusedNodesError
	switch {
	case errors.As(err, &refused):
		// Every other row was written; these would be refused again.
		s.log.Error("node registry refused xds rows; dropped", "node_ids", refused.IDs, "error", refused.Err)
	case err != nil:
		s.mu.Lock()
		s.gone = append(gone, s.gone...)
		s.mu.Unlock()
		for _, st := range taken {
			st.mu.Lock()
			st.dirty = true
			st.mu.Unlock()
		}
		return err
	}
	return nil
}

// recheckLoop ends, every recheckEvery, the streams whose node token
// stopped working (disabled, rotated, expired, or its owner lost it).
func (s *Server) recheckLoop(ctx context.Context) {
	tick := time.NewTicker(recheckEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		s.mu.Lock()
		streams := slices.Collect(maps.Values(s.streams))
		s.mu.Unlock()
		if len(streams) == 0 {
			continue
		}
		secrets := make([]string, 0, len(streams))
		for _, st := range streams {
			secrets = append(secrets, st.sess.secret)
		}
		live, err := s.store.LiveTokens(ctx, secrets)
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("check xds node tokens", "error", err)
			}
			continue
		}
		for _, st := range streams {
			if t, ok := live[st.sess.secret]; !ok || t.EffectiveRole != store.RoleNode {
				s.log.Info("node token revoked; closing its xds stream", "node_id", st.nodeID(), "token_id", st.sess.tokenID)
				st.sess.end(status.Error(codes.Unauthenticated, "node token revoked"))
			}
		}
	}
}

// libLogger passes go-control-plane's messages to log at debug level
// (errors as warnings): they are about single streams.
func libLogger(log *slog.Logger) xdslog.Logger {
	debug := func(format string, args ...any) {
		if log.Enabled(context.Background(), slog.LevelDebug) {
			log.Debug("xds: " + fmt.Sprintf(format, args...))
		}
	}
	return xdslog.LoggerFuncs{DebugFunc: debug, InfoFunc: debug, WarnFunc: debug,
		ErrorFunc: func(format string, args ...any) { log.Warn("xds: " + fmt.Sprintf(format, args...)) }}
}
