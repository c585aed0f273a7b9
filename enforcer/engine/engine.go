// Package engine is the enforcer's decision core: it holds the ruleset the
// node currently enforces and answers rate-limit checks against it.
//
// A check matches each request descriptor to at most one limit, then asks the
// counter store for all of them in a single all-or-nothing Take: a request
// that is over any one of its limits consumes nothing from the others, so a
// request rejected by its per-user limit never eats the global quota.
//
// The transports (HTTP, gRPC, later the gateway and the Go middleware) turn
// their wire formats into a Request and a Result back into theirs; the engine
// knows nothing about them.
package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"

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

// Store is what the check path needs from a counter store: one all-or-nothing
// Take for every limit a request touches. The Redis limiter and the local
// fallback limiter both satisfy it.
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
}

// Descriptor is one ordered list of entries of a request.
type Descriptor struct {
	Entries []rules.Entry
	// Hits, when non-nil, overrides Request.Hits for this descriptor (Envoy's
	// per-descriptor hits_addend). An explicit 0 only looks at the counter
	// without consuming from it.
	Hits *uint64
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
}

// Limited reports whether s carries counter state worth reporting to a
// client (a matched, counted limit that the store answered for).
func (s Status) Limited() bool {
	return s.Limit != nil && !s.Limit.Unlimited && !s.StoreFailed
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
	store   Store
	prefix  string
	current atomic.Pointer[ruleset]
}

// New returns an Engine that counts in store under keys starting with prefix
// (DefaultKeyPrefix when empty). No ruleset is loaded until Apply.
func New(store Store, prefix string) *Engine {
	if prefix == "" {
		prefix = DefaultKeyPrefix
	}
	return &Engine{store: store, prefix: prefix}
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
	return nil
}

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

// Check answers req. It returns ErrNoRuleset before the first Apply and an
// error wrapping ErrInvalidRequest for a malformed request. A store failure
// is not an error: each limit's failure mode decides (open → OK, closed →
// OVER_LIMIT; local behaves like open until the local fallback limiter
// lands) and Result.StoreErr reports it.
//
// Shadow-mode limits and all-or-nothing: the first Take asks for every
// counted limit at once. If only shadow-mode limits rejected it, nothing was
// consumed, yet the request is allowed; so Check takes again from the
// non-shadow limits alone (a second round trip, only in that case). The
// shadow limits therefore consume nothing for such a request (as a rejecting
// limit would not), while the real limits count it; if the second Take
// rejects (a concurrent request got there first), the answer is OVER_LIMIT.
func (e *Engine) Check(ctx context.Context, req Request) (Result, error) {
	rs := e.current.Load()
	if rs == nil {
		return Result{}, ErrNoRuleset
	}
	if req.Domain == "" {
		return Result{}, fmt.Errorf("%w: domain must not be empty", ErrInvalidRequest)
	}
	if len(req.Descriptors) == 0 {
		return Result{}, fmt.Errorf("%w: descriptors must not be empty", ErrInvalidRequest)
	}
	res := Result{Code: OK, Statuses: make([]Status, len(req.Descriptors)), Version: rs.version}

	for i, d := range req.Descriptors {
		res.Statuses[i] = Status{Code: OK, Limit: rs.set.Match(req.Domain, d.Entries)}
	}
	dropReplaced(res.Statuses)

	// Build one store request per counted limit; idx maps them back.
	hits := clampHits(req.Hits)
	if req.Hits == 0 {
		hits = 1
	}
	var (
		reqs []limiter.Request
		idx  []int
	)
	for i, s := range res.Statuses {
		if s.Limit == nil || s.Limit.Unlimited {
			continue
		}
		h := hits
		if d := req.Descriptors[i]; d.Hits != nil {
			h = clampHits(*d.Hits)
		}
		reqs = append(reqs, e.storeRequest(req.Domain, req.Descriptors[i].Entries, s.Limit, h))
		idx = append(idx, i)
	}
	if len(reqs) == 0 {
		return res, nil
	}

	decisions, err := e.store.Take(ctx, reqs)
	if err == nil && len(decisions) != len(reqs) {
		err = fmt.Errorf("store answered %d decisions for %d requests", len(decisions), len(reqs))
	}
	if err != nil {
		res.StoreErr = err
		failureModes(&res, idx)
		return res, nil
	}

	if onlyShadowRejected(res.Statuses, idx, decisions) {
		// Record the shadow verdicts, then count the request against the
		// real limits alone.
		record(&res, idx, decisions)
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
			return res, nil
		}
		decisions, err = e.store.Take(ctx, real)
		if err == nil && len(decisions) != len(real) {
			err = fmt.Errorf("store answered %d decisions for %d requests", len(decisions), len(real))
		}
		if err != nil {
			res.StoreErr = err
			failureModes(&res, realIdx)
			return res, nil
		}
		idx = realIdx
	}
	record(&res, idx, decisions)
	return res, nil
}

func (e *Engine) storeRequest(domain string, entries []rules.Entry, l *rules.Limit, hits int64) limiter.Request {
	period := l.Period
	if period <= 0 {
		period = l.Unit.Period()
	}
	burst := int64(l.Burst)
	if burst == 0 {
		burst = int64(l.RequestsPerUnit)
	}
	return limiter.Request{
		Key:       limiter.Key(e.prefix, domain, entries),
		Algorithm: l.Algorithm,
		Limit:     int64(l.RequestsPerUnit),
		Period:    period,
		Burst:     burst,
		Hits:      hits,
	}
}

// record copies decisions into the statuses they belong to and derives the
// codes: a rejected shadow limit is OK but Shadowed; any other rejection
// makes the whole request OverLimit.
func record(res *Result, idx []int, decisions []limiter.Decision) {
	for j, i := range idx {
		d := decisions[j]
		s := &res.Statuses[i]
		s.Remaining = max(d.Remaining, 0)
		s.ResetAfter = d.ResetAfter
		s.RetryAfter = d.RetryAfter
		s.Code = OK
		s.Shadowed = false
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

// failureModes decides the statuses at idx after a store failure.
func failureModes(res *Result, idx []int) {
	for _, i := range idx {
		s := &res.Statuses[i]
		s.StoreFailed = true
		s.Remaining, s.ResetAfter, s.RetryAfter = 0, 0, 0
		s.Code = OK
		// FailLocal answers like FailOpen until the local limiter exists.
		if s.Limit.FailureMode == rules.FailClosed && !s.Limit.ShadowMode {
			s.Code = OverLimit
			res.Code = OverLimit
		}
	}
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
