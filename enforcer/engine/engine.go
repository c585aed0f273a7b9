// Package engine is the enforcer's decision core: it holds the ruleset the
// node currently enforces and answers rate-limit checks against it.
//
// A check matches each request descriptor to at most one limit, then asks the
// counter store for all of them in a single all-or-nothing Take: a request
// that is over any one of its limits consumes nothing from the others, so a
// request rejected by its per-user limit never eats the global quota.
//
// When the store fails, or the circuit breaker around it (WithBreaker) is
// open, each limit's failure_mode answers: open allows, closed rejects, and
// local counts in the in-process limiter (a limiter.Local, WithLocal) with
// 1/N of the limit and of the burst, rounded up, where N is the node count
// the console sends (SetNodeCount). Error bound of local mode: the N nodes
// together admit at most N·⌈limit/N⌉ < limit + N requests per period (plus
// as much of the burst) when the load is spread evenly over them; when it is
// not, they admit less — down to ⌈limit/N⌉ if all of it reaches one node —
// never more. Local counting starts from a full bucket when the outage does.
//
// Each limit's own settings (rules.Limit) decide how it is counted: its
// algorithm, calendar windows, sharding of a hot key over several Redis
// keys (see storeRequest for the error bound) and the shaping of on_limit:
// delay limits (Request.Shape).
//
// The transports (HTTP, gRPC, the gateway and the Go middleware) turn
// their wire formats into a Request and a Result back into theirs; the engine
// knows nothing about them.
//
// # What one request may cost
//
// Check is the one place every transport goes through, so it bounds what a
// single request may cost before matching anything: at most MaxDescriptors
// (64) descriptors, MaxEntries (32) entries per descriptor, MaxKeyBytes
// (1 KiB) per entry key and per domain, MaxValueBytes (64 KiB) per entry
// value and MaxRequestBytes (1 MiB) for the domain, keys and values
// together. A request over any bound gets an error wrapping
// ErrInvalidRequest (HTTP 400, gRPC InvalidArgument) and costs the store
// nothing. The numbers are far above real configs: an Envoy route sends one
// descriptor per rate_limits action (a handful), rules nest at most
// rules.MaxDepth (16) levels, a domain's request_descriptors are at most
// rules.MaxRequestDescriptors (64), and 64 KiB holds any header value Envoy
// accepts by default (60 KiB of headers).
//
// A request over HeavyLimits counted limits is heavy. A heavy Take's
// failure is not held against the store by the breaker (breaker.Release):
// a caller sending requests at the bounds can slow its own checks, but
// cannot make the breaker open and switch every other caller's checks to
// their failure modes. Light checks alone tell the breaker whether the
// store is down; a heavy Take that succeeds still counts as a success.
//
// # Leases
//
// A limit whose rule sets lease: true may be served from local leases on a
// hot key (WithLeases; the full statement is in lease.go): the node takes
// part of the remaining quota R in one script call, consumed in Redis up
// front, admits against it locally and returns what it did not use. With N
// nodes, a grant is at most R/(2N), none when R < capacity/10, and lives at
// most min(period/10, 1 s), never past its window: the fleet never admits
// above a window's limit, and a node is refused while units sit in other
// nodes' leases for at most one lifetime. An unexpired lease keeps serving
// through a Redis outage; the failure mode applies once it is spent.
// token_bucket, policing leaky_bucket, fixed_window and
// sliding_window_counter; never sliding_window_log.
//
// # Regions
//
// With WithRegions the node is one region of several, each counting in its
// own Redis: a scope: global limit (fixed_window, sliding_window_counter)
// is checked against what the other regions left of it, learnt from the
// global store every interval off the request path, and at most
// limit + Σ_r λ_r·2·(interval + RTT) is admitted per window (λ_r: region
// r's rate on the key); with the global store unreachable, each region
// enforces its share, min(⌈limit/R⌉, limit − others). The full statement
// is in region.go.
//
// # Async counting
//
// A limit whose rule sets consistency: async (WithAsync; the full statement
// is in async.go) is admitted from the node's local view while the view
// is far from the limit — Redis's last remaining R minus the node's
// unflushed hits P, at least M = N·r·(a + T + 2d) + N·h + (N−1)·S above
// the check's hits — or, with no view yet or an old one, while P stays
// within the key's share S = ⌊C/(100·N)⌋ (1% of the capacity C over the
// fleet). Hits go to Redis in pipelined flushes of many keys, which also
// report the fleet's remaining: at the next interval T (100 ms) once P ≥ S,
// every 10 ms near the limit, and otherwise within 10 s; near the limit,
// checks go to Redis. It never under-admits, and admits at most limit +
// 2·N·S + F·(T + d + δ) per window (F the fleet's rate on the key, δ the
// timing error of a flushed hit: 1 ms plus a round trip), limit + 2·N·S +
// F·δ under load spread evenly over the nodes; a node that dies loses its
// unflushed hits (at most S + r·(T + d) per key). All five algorithms, not
// with on_limit: delay.
//
// # Inspecting
//
// Limits, Inspect and Reset (inspect.go) serve the console's support desk:
// the limits a request's descriptors match, matched as Check matches them
// and keyed as Check counts them, with their counters read by a read-only
// script (limiter.Redis.Peek: nothing is consumed or written), and the
// deletion of those counters. A sharded limit is summed over its shards;
// leased units count as used.
package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sluicehq/sluice/enforcer/breaker"
	"github.com/sluicehq/sluice/enforcer/limiter"
	"github.com/sluicehq/sluice/rules"
)

// DefaultKeyPrefix is the prefix of every counter key when none is configured.
const DefaultKeyPrefix = "sluice:"

// ErrNoRuleset is returned by Check before the first ruleset is applied.
var ErrNoRuleset = errors.New("no ruleset loaded yet")

// ErrInvalidRequest is wrapped by the errors Check returns for a request that
// cannot be answered as sent (empty domain, no descriptors, ...).
var ErrInvalidRequest = errors.New("invalid rate limit request")

// Bounds of one Request (see the package doc). Check refuses a request over
// any of them with an error wrapping ErrInvalidRequest.
const (
	MaxDescriptors  = 64
	MaxEntries      = 32
	MaxKeyBytes     = 1 << 10
	MaxValueBytes   = 64 << 10
	MaxRequestBytes = 1 << 20
)

// HeavyLimits is the most counted limits a light request touches; a Take
// for more is heavy and its failures do not count toward opening the
// breaker (see the package doc).
const HeavyLimits = 8

// Store is what the check path needs from a counter store: one all-or-nothing
// Take for every limit a request touches. limiter.Batcher (what an enforcer
// uses), limiter.Redis and limiter.Local satisfy it.
type Store interface {
	Take(ctx context.Context, reqs []limiter.Request) ([]limiter.Decision, error)
}

// Code is the answer for one descriptor or for a whole request.
type Code int

// Codes. They mirror the RLS proto's OK and OVER_LIMIT.
const (
	OK Code = iota + 1
	OverLimit
)

// String returns "ok" or "over_limit" (used as a metric label).
func (c Code) String() string {
	switch c {
	case OK:
		return "ok"
	case OverLimit:
		return "over_limit"
	}
	return "unknown"
}

// Request is one rate-limit check.
type Request struct {
	Domain      string
	Descriptors []Descriptor
	// Hits is how much the request adds to every matched limit. Following
	// Envoy, 0 means 1.
	Hits uint64
	// Shape asks for on_limit: delay limits (rules.Limit.OnLimit) to queue
	// instead of reject: a request that fits within the limit's max_delay
	// is admitted with Result.Delay, the time the caller must hold it
	// before letting it through (the slot is reserved for it). Only callers
	// that can hold a request (the gateway, the middleware) set it.
	Shape bool
}

// Descriptor is one ordered list of entries of a request.
type Descriptor struct {
	Entries []rules.Entry
	// Hits, when non-nil, overrides Request.Hits for this descriptor (Envoy's
	// per-descriptor hits_addend). An explicit 0 only looks at the counter
	// without consuming from it.
	Hits *uint64
	// Override, when non-nil, replaces the limit the rules would apply to
	// this descriptor (Envoy's per-descriptor limit override). It applies
	// only in a domain the ruleset configures.
	Override *Override
}

// Override is a limit given by the caller for one descriptor.
type Override struct {
	RequestsPerUnit uint32
	Unit            rules.Unit
	// Multiplier is the number of Units in the period; 0 means 1.
	Multiplier uint32
}

// Status is the answer for one descriptor of a request.
type Status struct {
	Code Code
	// Limit is the limit that applied, nil when none matched (or it was
	// replaced by another matched limit, Lyft's "replaces").
	Limit *rules.Limit
	// Remaining, ResetAfter and RetryAfter come from the store. They are
	// zero for an unlimited limit and when the store failed.
	Remaining  int64
	ResetAfter time.Duration
	RetryAfter time.Duration
	// Shadowed is set when a shadow-mode limit was over: the status is OK
	// but the decision counts as shadow-limited.
	Shadowed bool
	// StoreFailed is set when the store could not be asked and the limit's
	// failure mode decided Code.
	StoreFailed bool
	// Delay is the wait this limit imposes on an admitted, shaped request
	// (Request.Shape).
	Delay time.Duration
	// Local is set (with StoreFailed) when the in-process limiter decided
	// Code for a failure_mode: local limit; Remaining, ResetAfter and
	// RetryAfter are then the local limiter's.
	Local bool

	// unknown is set when the counter state of a limit within its limit
	// could not be read for a request another limit rejected.
	unknown bool
	// undecided marks a decision the store did not make (the Batcher's
	// over-limit cache answered for another limit of the Take).
	undecided bool
}

// Limited reports whether s carries counter state worth reporting to a
// client (a matched, counted limit that the store answered for).
func (s Status) Limited() bool {
	return s.Limit != nil && !s.Limit.Unlimited && (!s.StoreFailed || s.Local) && !s.unknown
}

// Result is the answer to a Request.
type Result struct {
	// Code is OverLimit when any non-shadow descriptor is over its limit.
	Code Code
	// Statuses holds one Status per request descriptor, in request order.
	Statuses []Status
	// Version is the ruleset version the answer was computed with.
	Version int64
	// StoreErr is the store's error when it failed and failure modes
	// decided the answer; Check itself then still returns a nil error.
	StoreErr error
	// Delay is how long the caller must hold an allowed request before
	// letting it through (Request.Shape); 0 when it may go at once.
	Delay time.Duration
}

// MostRestrictive returns the index of the status a client should be told
// about in rate-limit headers: when the request is over limit, the rejecting
// status with the longest wait; otherwise the counted status with the fewest
// remaining hits (ties: the longest reset). Shadow-mode limits are never
// chosen, since they are not enforced. It returns -1 when no status
// qualifies.
func (r Result) MostRestrictive() int {
	best := -1
	for i, s := range r.Statuses {
		if !s.Limited() || s.Limit.ShadowMode {
			continue
		}
		if r.Code == OverLimit {
			if s.Code != OverLimit {
				continue
			}
			if best < 0 || s.RetryAfter > r.Statuses[best].RetryAfter {
				best = i
			}
			continue
		}
		if best < 0 {
			best = i
			continue
		}
		b := r.Statuses[best]
		if s.Remaining < b.Remaining || (s.Remaining == b.Remaining && s.ResetAfter > b.ResetAfter) {
			best = i
		}
	}
	return best
}

// ruleset is one applied version; swapped as a whole.
type ruleset struct {
	version int64
	set     *rules.Set
	domains map[string]bool
}

// Engine answers checks against the current ruleset. It is safe for
// concurrent use; Apply swaps the ruleset atomically, so a check sees either
// the old or the new ruleset, never a mix.
type Engine struct {
	store        Store
	local        *limiter.Local
	breaker      *breaker.Breaker
	storeTimeout time.Duration
	prefix       string
	current      atomic.Pointer[ruleset]
	nodeCount    atomic.Int64
	shardSeq     atomic.Uint64
	stats        stats // per-rule counts for the console (TakeStats)
	noStats      bool  // WithoutStats

	quota   quotas   // quota usage for billing (quota.go)
	leases  *leases  // WithLeases (lease.go)
	async   *asyncs  // WithAsync (async.go)
	regions *regions // WithRegions (region.go)
}

// Option changes a setting of New.
type Option func(*Engine)

// WithBreaker puts b around every call to the counter store: while b is
// open, checks do not wait on the store at all and the limits' failure
// modes answer at once.
func WithBreaker(b *breaker.Breaker) Option { return func(e *Engine) { e.breaker = b } }

// WithStoreTimeout bounds each store call (the whole Take, queueing and
// connecting included) with a deadline; 0 leaves only the store client's own
// timeouts. The enforcer uses the client's per-call timeout (50 ms).
func WithStoreTimeout(d time.Duration) Option { return func(e *Engine) { e.storeTimeout = d } }

// WithoutStats turns off the per-rule counts of TakeStats, for a node that
// reports to no console (and to measure what they cost).
func WithoutStats() Option { return func(e *Engine) { e.noStats = true } }

// WithLocal sets the in-process limiter that answers failure_mode: local
// limits while the store is unreachable; by default a new
// limiter.NewLocal(limiter.LocalOptions{}). SetNodeCount is passed on to it.
func WithLocal(l *limiter.Local) Option { return func(e *Engine) { e.local = l } }

// New returns an Engine that counts in store under keys starting with prefix
// (DefaultKeyPrefix when empty). No ruleset is loaded until Apply.
func New(store Store, prefix string, opts ...Option) *Engine {
	if prefix == "" {
		prefix = DefaultKeyPrefix
	}
	e := &Engine{store: store, prefix: prefix}
	e.quota.full = make(chan struct{}, 1)
	for _, o := range opts {
		o(e)
	}
	if e.local == nil {
		e.local = limiter.NewLocal(limiter.LocalOptions{})
	}
	e.nodeCount.Store(1)
	e.local.SetNodeCount(1)
	return e
}

// Apply makes set, compiled from ruleset version, the one checks use.
func (e *Engine) Apply(version int64, set *rules.Set) error {
	if set == nil {
		return errors.New("apply ruleset: nil set")
	}
	domains := make(map[string]bool)
	for _, d := range set.Domains() {
		domains[d] = true
	}
	e.current.Store(&ruleset{version: version, set: set, domains: domains})
	e.leases.changed(set)
	e.async.changed(set)
	return nil
}

// SetNodeCount tells the engine how many enforcer nodes share the counters
// (the console's node_count). A failure_mode: local limit gives each node
// 1/n of the limit while the store is down (the local limiter divides it).
// Values below 1 count as 1.
func (e *Engine) SetNodeCount(n int) {
	n = max(n, 1)
	e.nodeCount.Store(int64(n))
	e.local.SetNodeCount(n)
}

// NodeCount returns the node count set by SetNodeCount (1 by default).
func (e *Engine) NodeCount() int { return int(e.nodeCount.Load()) }

// Breaker returns the breaker around the store, nil when there is none.
func (e *Engine) Breaker() *breaker.Breaker { return e.breaker }

// Version returns the applied ruleset version, 0 when none is loaded.
func (e *Engine) Version() int64 {
	if rs := e.current.Load(); rs != nil {
		return rs.version
	}
	return 0
}

// Loaded reports whether a ruleset has been applied.
func (e *Engine) Loaded() bool { return e.current.Load() != nil }

// HasDomain reports whether the applied ruleset configures domain.
func (e *Engine) HasDomain(domain string) bool {
	rs := e.current.Load()
	return rs != nil && rs.domains[domain]
}

// Ruleset returns the applied compiled ruleset and its version (nil, 0
// before the first Apply).
func (e *Engine) Ruleset() (*rules.Set, int64) {
	if rs := e.current.Load(); rs != nil {
		return rs.set, rs.version
	}
	return nil, 0
}

// Check answers req. It returns ErrNoRuleset before the first Apply and an
// error wrapping ErrInvalidRequest for a malformed request. A store failure
// (or an open breaker) is not an error: each limit's failure mode decides
// (open → OK; closed → OVER_LIMIT; local → the in-process limiter, with the
// limit divided by the node count) and Result.StoreErr reports it.
//
// A limit of 0 requests_per_unit (rules.Limit.BlocksAll) rejects without
// asking the store; when it is not in shadow mode the store is not asked
// for the request's other limits either (they would consume nothing), and
// their statuses carry no counter state.
//
// Shadow-mode limits and all-or-nothing: the first Take asks for every
// counted limit at once. If only shadow-mode limits rejected it, nothing was
// consumed, yet the request is allowed; so Check takes again from the
// non-shadow limits alone (a second round trip, only in that case). The
// shadow limits therefore consume nothing for such a request (as a rejecting
// limit would not), while the real limits count it; if the second Take
// rejects (a concurrent request got there first), the answer is OVER_LIMIT.
func (e *Engine) Check(ctx context.Context, req Request) (Result, error) {
	res, err := e.check(ctx, req)
	if err == nil && !e.noStats {
		e.stats.count(&req, &res)
		e.quota.count(&req, &res)
	}
	return res, err
}

func (e *Engine) check(ctx context.Context, req Request) (Result, error) {
	rs := e.current.Load()
	if rs == nil {
		return Result{}, ErrNoRuleset
	}
	if err := checkRequest(&req); err != nil {
		return Result{}, err
	}
	// A request of one descriptor (most are) gets its status and its store
	// request in one allocation.
	var reqs []limiter.Request
	res := Result{Code: OK, Version: rs.version}
	if len(req.Descriptors) == 1 {
		one := new(oneCheck)
		res.Statuses, reqs = one.status[:], one.req[:0]
	} else {
		res.Statuses = make([]Status, len(req.Descriptors))
		reqs = make([]limiter.Request, 0, len(res.Statuses))
	}
	idx := make([]int, 0, len(res.Statuses)) // reqs[j] is for res.Statuses[idx[j]]

	for i, d := range req.Descriptors {
		l := rs.set.Match(req.Domain, d.Entries)
		if d.Override != nil && rs.domains[req.Domain] {
			ol, err := overrideLimit(req.Domain, d.Override, l, rs.set.DefaultAlgorithm(req.Domain))
			if err != nil {
				return Result{}, fmt.Errorf("%w: descriptors[%d]: %w", ErrInvalidRequest, i, err)
			}
			l = ol
		}
		res.Statuses[i] = Status{Code: OK, Limit: l}
	}
	dropReplaced(res.Statuses)

	// Limits that block every request answer without the store (the others
	// are only looked at, below, to report what remains of them).
	for i := range res.Statuses {
		s := &res.Statuses[i]
		if s.Limit == nil || !s.Limit.BlocksAll() {
			continue
		}
		// There is no time after which it admits: tell clients to come
		// back after a unit.
		s.RetryAfter, s.ResetAfter = s.Limit.Period, s.Limit.Period
		if s.Limit.ShadowMode {
			s.Shadowed = true
			continue
		}
		s.Code = OverLimit
		res.Code = OverLimit
	}

	// Build one store request per counted limit; idx maps them back.
	hits := clampHits(req.Hits)
	if req.Hits == 0 {
		hits = 1
	}
	var (
		adj []adjustment // per status; nil unless some limit is sharded or shaped
		// globals are the statuses of scope: global limits (WithRegions).
		globals []globalHit
		now     time.Time
	)
	for i, s := range res.Statuses {
		if s.Limit == nil || s.Limit.Unlimited || s.Limit.BlocksAll() {
			continue
		}
		h := hits
		if d := req.Descriptors[i]; d.Hits != nil {
			h = clampHits(*d.Hits)
		}
		// share_threshold: values matching a shared wildcard count on one
		// key (this allocates only for such limits).
		entries := s.Limit.CounterEntries(req.Descriptors[i].Entries, nil)
		var g *globalHit
		if e.regions != nil && s.Limit.Scope == rules.ScopeGlobal && req.Descriptors[i].Override == nil {
			if now.IsZero() {
				now = time.Now()
			}
			globals = append(globals, globalHit{status: i, hits: h})
			g = &globals[len(globals)-1]
		}
		r, a := e.storeRequest(req.Domain, entries, s.Limit, h, req.Shape, g, now)
		if g != nil && r.Limit < 1 {
			// The other regions used this window up: refuse without Redis.
			refuseGlobal(&res, i, g.left)
			globals = globals[:len(globals)-1]
			continue
		}
		if req.Descriptors[i].Override != nil && rs.domains[req.Domain] {
			r.Key = overrideKey(r.Key, s.Limit.Period)
		}
		if a != (adjustment{}) {
			if adj == nil {
				adj = make([]adjustment, len(res.Statuses))
			}
			adj[i] = a
		}
		reqs = append(reqs, r)
		idx = append(idx, i)
	}
	if len(reqs) == 0 {
		return res, nil
	}
	if globals != nil {
		defer e.recordGlobal(&res, globals)
	}

	if res.Code == OverLimit {
		// A blocking limit rejected: consume nothing, but say what remains
		// of the others, as Lyft does.
		e.peek(ctx, &res, reqs, idx, idx)
	} else if err := e.decideAsync(ctx, &res, reqs, idx, req.Descriptors, req.Shape); err != nil {
		res.StoreErr = err
		e.failureModes(ctx, &res, reqs, idx, adj)
	} else if res.Code == OverLimit {
		// The Batcher answers a Take with a limit it knows to be over
		// without asking Redis: read what remains of the others.
		var undecided []int
		for _, i := range idx {
			if res.Statuses[i].undecided {
				undecided = append(undecided, i)
			}
		}
		if undecided != nil {
			e.peek(ctx, &res, reqs, idx, undecided)
		}
	}
	if adj != nil {
		adjust(&res, adj)
	}
	if res.Code == OverLimit {
		// Nothing was consumed, so nothing is held.
		res.Delay = 0
		for i := range res.Statuses {
			res.Statuses[i].Delay = 0
		}
	}
	return res, nil
}

// oneCheck holds what Check allocates for a request of one descriptor.
type oneCheck struct {
	status [1]Status
	req    [1]limiter.Request
}

// peek reads, without consuming, the counter state of the statuses at which
// (a subset of idx, whose store requests are reqs) for a request that is
// over limit anyway, so that limits within their limit report what
// remains of them. Their codes stay OK. When the store cannot tell, they
// report nothing (Status.Limited is false).
func (e *Engine) peek(ctx context.Context, res *Result, reqs []limiter.Request, idx, which []int) {
	var (
		peeks   []limiter.Request
		peekIdx []int
	)
	for j, i := range idx {
		if !slices.Contains(which, i) || res.Statuses[i].Code == OverLimit {
			continue
		}
		r := reqs[j]
		r.Hits, r.MaxDelay = 0, 0
		peeks = append(peeks, r)
		peekIdx = append(peekIdx, i)
	}
	if len(peeks) == 0 {
		return
	}
	ds, err := e.take(ctx, false, peeks)
	for j, i := range peekIdx {
		s := &res.Statuses[i]
		s.undecided = false
		if err != nil || ds[j].Cached {
			s.unknown = true
			continue
		}
		s.Remaining = max(ds[j].Remaining, 0)
		s.ResetAfter = ds[j].ResetAfter
		s.RetryAfter, s.Delay = 0, 0
	}
}

// checkRequest refuses a request without a domain or descriptors, or over
// the bounds of one request.
func checkRequest(req *Request) error {
	if req.Domain == "" {
		return fmt.Errorf("%w: domain must not be empty", ErrInvalidRequest)
	}
	if len(req.Descriptors) == 0 {
		return fmt.Errorf("%w: descriptors must not be empty", ErrInvalidRequest)
	}
	return checkBounds(req)
}

// checkBounds refuses a request over the bounds of one request.
func checkBounds(req *Request) error {
	if len(req.Descriptors) > MaxDescriptors {
		return fmt.Errorf("%w: %d descriptors, at most %d allowed", ErrInvalidRequest, len(req.Descriptors), MaxDescriptors)
	}
	if len(req.Domain) > MaxKeyBytes {
		return fmt.Errorf("%w: domain is %d bytes, at most %d allowed", ErrInvalidRequest, len(req.Domain), MaxKeyBytes)
	}
	total := len(req.Domain)
	for i, d := range req.Descriptors {
		if len(d.Entries) > MaxEntries {
			return fmt.Errorf("%w: descriptors[%d]: %d entries, at most %d allowed", ErrInvalidRequest, i, len(d.Entries), MaxEntries)
		}
		for j, e := range d.Entries {
			if len(e.Key) > MaxKeyBytes {
				return fmt.Errorf("%w: descriptors[%d].entries[%d]: key is %d bytes, at most %d allowed", ErrInvalidRequest, i, j, len(e.Key), MaxKeyBytes)
			}
			if len(e.Value) > MaxValueBytes {
				return fmt.Errorf("%w: descriptors[%d].entries[%d]: value is %d bytes, at most %d allowed", ErrInvalidRequest, i, j, len(e.Value), MaxValueBytes)
			}
			total += len(e.Key) + len(e.Value)
		}
	}
	if total > MaxRequestBytes {
		return fmt.Errorf("%w: domain, keys and values are %d bytes, at most %d allowed", ErrInvalidRequest, total, MaxRequestBytes)
	}
	return nil
}

// decide takes reqs (the store requests of res.Statuses[idx]) from the
// store, or from the local limiter when local is set, and records the
// decisions in res. It returns the store's error, having recorded nothing
// for the requests it could not decide.
func (e *Engine) decide(ctx context.Context, local bool, res *Result, reqs []limiter.Request, idx []int) error {
	decisions, err := e.take(ctx, local, reqs)
	if err != nil {
		return err
	}
	if onlyShadowRejected(res.Statuses, idx, decisions) {
		// Record the shadow verdicts, then count the request against the
		// real limits alone.
		record(res, idx, decisions, local)
		var (
			real    []limiter.Request
			realIdx []int
		)
		for j, i := range idx {
			if !res.Statuses[i].Limit.ShadowMode {
				real = append(real, reqs[j])
				realIdx = append(realIdx, i)
			}
		}
		if len(real) == 0 {
			return nil
		}
		decisions, err = e.take(ctx, local, real)
		if err != nil {
			return err
		}
		idx = realIdx
	}
	record(res, idx, decisions, local)
	return nil
}

// take runs one Take on the store (through the breaker, with the per-call
// deadline) or on the local limiter. The failure of a heavy Take (more than
// HeavyLimits requests) is released, not recorded, by the breaker.
func (e *Engine) take(ctx context.Context, local bool, reqs []limiter.Request) ([]limiter.Decision, error) {
	var (
		ds  []limiter.Decision
		err error
	)
	if local {
		ds, err = e.local.Take(ctx, reqs)
	} else {
		if e.store == nil {
			return nil, errNoStore
		}
		if e.breaker != nil {
			if err := e.breaker.Allow(); err != nil {
				return nil, err
			}
		}
		tctx, cancel := ctx, context.CancelFunc(nil)
		if e.storeTimeout > 0 {
			tctx, cancel = context.WithTimeout(ctx, e.storeTimeout)
		}
		ds, err = e.store.Take(tctx, reqs)
		if cancel != nil {
			cancel()
		}
		if e.breaker != nil {
			if herr := storeHealth(ctx, err); herr != nil && len(reqs) > HeavyLimits {
				// A heavy Take's failure says little about the store
				// and must not open the breaker for light checks.
				e.breaker.Release()
			} else {
				e.breaker.Record(herr)
			}
		}
	}
	if err == nil && len(ds) != len(reqs) {
		err = fmt.Errorf("store answered %d decisions for %d requests", len(ds), len(reqs))
	}
	return ds, err
}

var errNoStore = errors.New("no counter store configured")

// StoreDown reports whether a store error proves the store unreachable by
// itself — a refused, reset or closed connection — rather than slow (a
// timeout, which an overloaded but healthy store also causes). It is the
// breaker's Config.Hard for the enforcer.
func StoreDown(err error) bool {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return false
	}
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed)
}

// storeHealth turns a Take error into what the breaker should hear: nil
// when the store itself is fine (it refused the request as invalid, or the
// caller gave up before it answered).
func storeHealth(ctx context.Context, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, limiter.ErrInvalidRequest), errors.Is(err, limiter.ErrUnsupportedAlgorithm):
		return nil
	case ctx.Err() != nil:
		return nil
	}
	return err
}

// adjustment records how a status's store request differs from its limit,
// so the decision can be translated back.
type adjustment struct {
	shards int64 // > 1 when sharded
	// extra is the number of tokens added to the bucket to shape (queue) up
	// to MaxDelay of requests; interval is the time one token takes and
	// burst the bucket's real capacity (for this shard).
	extra    int64
	interval time.Duration
	burst    int64
}

// storeRequest builds the store request for one descriptor's limit from
// the limit's own settings: algorithm, burst, calendar windows
// (fixed_window), shards and on_limit.
//
// For a limit split into N shards it picks one shard, round robin, and asks
// for that shard's key and share of the limit. Error bound: the shards
// together admit at most N × ⌈limit/N⌉ < limit + N requests per period (and
// likewise for the burst), so a sharded limit over-admits by fewer than N
// requests; it can under-admit while load is uneven across shards (a
// request is rejected when its shard is empty even if another has room),
// which round robin keeps to about N early rejections per period.
//
// When shape is set and the limit's on_limit action is delay, a request
// over the limit may queue for up to max_delay instead of being rejected:
// a leaky_bucket shapes in the limiter itself (Request.MaxDelay, reported
// as Decision.Delay); a token_bucket is deepened by max_delay's worth of
// tokens, and a request that fits only in that extra depth is admitted
// with a delay (GCRA with a larger tolerance, translated back by adjust).
//
// For a scope: global limit (g not nil, WithRegions) the limit is what the
// other regions left of it (regions.globalLimit), recorded in g with the
// key and window its hits are sent to the global store under; a limit
// below 1 means none is left, and the request must not reach the store.
func (e *Engine) storeRequest(domain string, entries []rules.Entry, l *rules.Limit, hits int64, shape bool, g *globalHit, now time.Time) (limiter.Request, adjustment) {
	r := e.counterRequest(domain, entries, l, hits)
	if g != nil {
		g.key = r.Key
		r.Limit, g.start, g.left = e.regions.globalLimit(r.Key, l, r.Limit, r.Period, now)
		r.Burst = max(r.Limit, 0)
		if r.Limit < 1 {
			return r, adjustment{}
		}
	}
	var a adjustment
	if n := int64(l.Shards); n > 1 {
		r = shardRequest(r, n, e.shardSeq.Add(1)%uint64(n))
		a.shards = n
	}
	if !shape || l.OnLimit.Action != rules.Delay || l.OnLimit.MaxDelay <= 0 {
		return r, a
	}
	switch l.Algorithm {
	case rules.LeakyBucket:
		r.MaxDelay = l.OnLimit.MaxDelay
	case "", rules.TokenBucket:
		interval := max(r.Period/time.Duration(r.Limit), time.Microsecond)
		if extra := int64(l.OnLimit.MaxDelay / interval); extra > 0 {
			a.extra, a.interval, a.burst = extra, interval, r.Burst
			r.Burst += extra
		}
	}
	return r, a
}

// counterRequest is the store request for one descriptor's limit, before
// sharding and shaping: its key (from the counter entries) and its
// algorithm, limit, period, burst and calendar.
func (e *Engine) counterRequest(domain string, entries []rules.Entry, l *rules.Limit, hits int64) limiter.Request {
	period := l.Period
	if period <= 0 {
		period = l.Unit.Period()
	}
	limit := int64(l.RequestsPerUnit)
	burst := int64(l.Burst)
	if burst == 0 {
		burst = limit
	}
	return limiter.Request{
		Key:       limiter.Key(e.prefix, domain, entries),
		Algorithm: l.Algorithm,
		Limit:     limit,
		Period:    period,
		Burst:     burst,
		Hits:      hits,
		Calendar:  l.Calendar,
	}
}

// shardRequest is shard number shard of n of the counter request r: its
// key and its share of the limit and of the burst.
func shardRequest(r limiter.Request, n int64, shard uint64) limiter.Request {
	r.Key = shardKey(r.Key, shard)
	r.Limit = limiter.Share(r.Limit, n)
	r.Burst = limiter.Share(r.Burst, n)
	return r
}

// overrideKey returns the key of a limit override's counter: each override
// period (Envoy's unit times its multiplier) counts on a key of its own,
// apart from the configured limit and from overrides of other periods, as
// each unit has its own window in envoyproxy/ratelimit. Overrides of one
// period share it (there, a 10/DAY and a 20/DAY override count together).
// Like shardKey, the suffix goes inside the hash tag after ":#", which no
// descriptor's key can contain there; "o" is no hex digit, so it cannot
// collide with a hashed part or a shard.
func overrideKey(key string, period time.Duration) string {
	suffix := ":#o" + strconv.FormatInt(int64(period/time.Second), 10)
	if base, ok := strings.CutSuffix(key, "}"); ok {
		return base + suffix + "}"
	}
	return key + suffix
}

// shardKey returns the key of one shard of key: the shard number goes
// inside the hash tag, so on Redis Cluster the shards spread over slots.
// limiter.Key escapes '#' in every part and only writes it at the start of
// a hashed part (followed by 32 hex digits and never after a bare ':' at
// the end), so ":#<n>" before the closing brace cannot collide with any
// descriptor's key.
func shardKey(key string, shard uint64) string {
	base, ok := strings.CutSuffix(key, "}")
	if !ok {
		return key + ":#" + strconv.FormatUint(shard, 10)
	}
	return base + ":#" + strconv.FormatUint(shard, 10) + "}"
}

// adjust translates the decisions of sharded and shaped limits back to
// their limits: a sharded limit's remaining is estimated as the picked
// shard's remaining times the shard count (never above the bucket); a
// shaped limit's extra depth is taken out of remaining and reset, and an
// admitted request that used it gets the Delay to hold it for.
func adjust(res *Result, adj []adjustment) {
	for i, a := range adj {
		s := &res.Statuses[i]
		if !s.Limited() || s.Local {
			continue
		}
		if a.extra > 0 {
			tolerance := time.Duration(a.burst) * a.interval
			s.Remaining = max(s.Remaining-a.extra, 0)
			if s.Code == OK && !s.Shadowed && s.ResetAfter > tolerance {
				s.Delay = s.ResetAfter - tolerance
				res.Delay = max(res.Delay, s.Delay)
			}
			s.ResetAfter = min(s.ResetAfter, tolerance)
		}
		if a.shards > 1 {
			capacity := int64(s.Limit.Burst)
			if capacity == 0 {
				capacity = int64(s.Limit.RequestsPerUnit)
			}
			s.Remaining = min(s.Remaining*a.shards, capacity)
		}
	}
}

// record copies decisions into the statuses they belong to and derives the
// codes: a rejected shadow limit is OK but Shadowed; any other rejection
// makes the whole request OverLimit. local marks decisions of the
// in-process limiter.
func record(res *Result, idx []int, decisions []limiter.Decision, local bool) {
	for j, i := range idx {
		d := decisions[j]
		s := &res.Statuses[i]
		s.Remaining = max(d.Remaining, 0)
		s.ResetAfter = d.ResetAfter
		s.RetryAfter = d.RetryAfter
		s.Delay = d.Delay // a shaping leaky bucket's queue ahead
		res.Delay = max(res.Delay, d.Delay)
		s.Code = OK
		s.Shadowed = false
		s.Local = local
		s.undecided = d.Cached && d.Allowed
		if d.Allowed {
			continue
		}
		if s.Limit.ShadowMode {
			s.Shadowed = true
			continue
		}
		s.Code = OverLimit
		res.Code = OverLimit
	}
}

// failureModes decides the statuses at idx after a store failure: open
// limits allow, closed limits reject, and local limits are taken from the
// in-process limiter with 1/NodeCount of their limit (all-or-nothing among
// them, and nothing is taken when a closed limit already rejects). If the
// local limiter fails too, local limits allow. The local limiter does not
// shape: a delay limit's extra depth (adj) is taken off again.
func (e *Engine) failureModes(ctx context.Context, res *Result, reqs []limiter.Request, idx []int, adj []adjustment) {
	var (
		localReqs []limiter.Request
		localIdx  []int
	)
	res.Delay = 0
	for j, i := range idx {
		s := &res.Statuses[i]
		s.StoreFailed = true
		s.Local = false
		s.Shadowed = false
		s.Remaining, s.ResetAfter, s.RetryAfter, s.Delay = 0, 0, 0, 0
		s.Code = OK
		switch s.Limit.FailureMode {
		case rules.FailClosed:
			if !s.Limit.ShadowMode {
				s.Code = OverLimit
				res.Code = OverLimit
			}
		case rules.FailLocal:
			r := reqs[j]
			if adj != nil && adj[i].extra > 0 {
				r.Burst = adj[i].burst
			}
			// The local limiter divides Limit and Burst by the node count.
			localReqs = append(localReqs, r)
			localIdx = append(localIdx, i)
		}
	}
	if len(localReqs) == 0 || res.Code == OverLimit {
		return
	}
	// The local limiter fails only for an invalid request (which the
	// store refused too); that leaves these open.
	_ = e.decide(ctx, true, res, localReqs, localIdx)
}

// onlyShadowRejected reports whether some decision rejected and every
// rejection came from a shadow-mode limit.
func onlyShadowRejected(statuses []Status, idx []int, decisions []limiter.Decision) bool {
	rejected := false
	for j, i := range idx {
		if decisions[j].Allowed {
			continue
		}
		if !statuses[i].Limit.ShadowMode {
			return false
		}
		rejected = true
	}
	return rejected
}

// dropReplaced applies Lyft's "replaces": a matched limit whose name another
// matched limit replaces does not apply to this request.
func dropReplaced(statuses []Status) {
	var replaced map[string]bool
	for _, s := range statuses {
		if s.Limit == nil {
			continue
		}
		for _, name := range s.Limit.Replaces {
			if replaced == nil {
				replaced = make(map[string]bool)
			}
			replaced[name] = true
		}
	}
	if replaced == nil {
		return
	}
	for i := range statuses {
		if l := statuses[i].Limit; l != nil && l.Name != "" && replaced[l.Name] {
			statuses[i].Limit = nil
		}
	}
}

func clampHits(h uint64) int64 {
	if h > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(h)
}
