// Package middleware rate-limits a Go HTTP server in process, with the same
// engine, rules and counters as an enforcer node: a Limiter wraps an
// http.Handler (Handler), or answers per request for other routers (Allow;
// the ginlimit sub-package adapts it to gin without making net/http users
// import gin). A Node subscribes the process to the console like an
// enforcer, so the rules staff publish apply to the app as they do to every
// node.
//
// For each request the Limiter builds descriptors (by request descriptors —
// its own, else the domain's request_descriptors in the applied ruleset —
// or by a function of the request), checks them, and either lets the request
// through with rate-limit headers set on the response, holds it first
// (on_limit: delay limits queue the request for at most max_delay), or
// answers with the limit's rejection status (429 by default), rate-limit
// headers and an RFC 9457 problem+json body. Until a ruleset is loaded, and
// when a check cannot be made, requests go through: the app must keep
// working when the limiter cannot decide. A request whose descriptors are
// over the engine's bounds of one request (a value over
// engine.MaxValueBytes, 64 KiB, from a header, path or query) is answered
// 400 with a problem body instead: letting it through would let a client
// skip its limits by padding a header.
package middleware

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/enforcer/headers"
	"github.com/sluicehq/sluice/enforcer/metrics"
	"github.com/sluicehq/sluice/rules"
)

// DefaultMaxWaiting bounds the requests a Limiter holds at once for
// on_limit: delay limits; beyond it they are rejected instead of queued.
const DefaultMaxWaiting = 10000

// Config configures a Limiter.
type Config struct {
	// Domain is the rules domain checked. Required.
	Domain string
	// Descriptors says how to build descriptors from a request. When
	// empty, the domain's request_descriptors in the applied ruleset do
	// (rules.Set.RequestDescriptors), and DefaultDescriptors (the client
	// address) when the domain has none.
	Descriptors []rules.RequestDescriptor
	// DescriptorFunc, when set, builds the descriptors instead of
	// Descriptors. Returning none lets the request through unchecked.
	DescriptorFunc func(r *http.Request) []engine.Descriptor
	// TrustedProxies are the proxies whose X-Forwarded-For is believed for
	// the remote address (see ClientIP). None by default.
	TrustedProxies []netip.Prefix
	// Metrics records the checks; nil records nothing.
	Metrics *metrics.Metrics
	// Transport labels the checks in metrics ("middleware" when empty).
	Transport string
	// MaxWaiting bounds the requests held at once by delay limits
	// (DefaultMaxWaiting when zero).
	MaxWaiting int
	// Log receives check failures that are not a request's fault.
	Log *slog.Logger
}

// Limiter rate-limits HTTP requests. It is safe for concurrent use.
type Limiter struct {
	eng        *engine.Engine
	cfg        Config
	build      func(r *http.Request) []engine.Descriptor
	maxWaiting int64
	waiting    atomic.Int64
	log        *slog.Logger
	specs      atomic.Pointer[rulesetSpecs] // see rulesetDescriptors
}

// New returns a Limiter checking requests against eng.
func New(eng *engine.Engine, cfg Config) (*Limiter, error) {
	if eng == nil {
		return nil, errors.New("middleware: nil engine")
	}
	if cfg.Domain == "" {
		return nil, errors.New("middleware: domain is required")
	}
	if err := Validate(cfg.Descriptors); err != nil {
		return nil, errors.New("middleware: " + err.Error())
	}
	if cfg.Transport == "" {
		cfg.Transport = "middleware"
	}
	l := &Limiter{eng: eng, cfg: cfg, maxWaiting: int64(cfg.MaxWaiting), log: cfg.Log}
	if l.maxWaiting <= 0 {
		l.maxWaiting = DefaultMaxWaiting
	}
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	l.build = cfg.DescriptorFunc
	switch {
	case l.build != nil:
	case len(cfg.Descriptors) > 0:
		specs, trusted := cfg.Descriptors, cfg.TrustedProxies
		l.build = func(r *http.Request) []engine.Descriptor { return Build(r, specs, trusted) }
	default:
		trusted := cfg.TrustedProxies
		l.build = func(r *http.Request) []engine.Descriptor { return Build(r, l.rulesetDescriptors(), trusted) }
	}
	return l, nil
}

// rulesetSpecs is the request descriptors of one applied ruleset.
type rulesetSpecs struct {
	set   *rules.Set
	specs []rules.RequestDescriptor
}

// rulesetDescriptors returns the domain's request_descriptors in the
// applied ruleset, DefaultDescriptors when it has none (or no ruleset is
// loaded yet). They are looked up once per ruleset, not per request.
func (l *Limiter) rulesetDescriptors() []rules.RequestDescriptor {
	set, _ := l.eng.Ruleset()
	if c := l.specs.Load(); c != nil && c.set == set {
		return c.specs
	}
	specs := set.RequestDescriptors(l.cfg.Domain)
	if len(specs) == 0 {
		specs = DefaultDescriptors
	}
	l.specs.Store(&rulesetSpecs{set: set, specs: specs})
	return specs
}

// Handler returns next wrapped by the Limiter.
func (l *Limiter) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if l.Allow(w, r) {
			next.ServeHTTP(w, r)
		}
	})
}

// Waiting returns the number of requests currently held by delay limits.
func (l *Limiter) Waiting() int { return int(l.waiting.Load()) }

// Allow checks r. When r may proceed it sets the rate-limit headers on w
// (after holding r for a delay limit, if one asks) and returns true; the
// caller then serves r. Otherwise it has answered r itself — the rejection,
// or nothing when the client went away while r was held — and returns
// false.
func (l *Limiter) Allow(w http.ResponseWriter, r *http.Request) bool {
	descs := l.build(r)
	if len(descs) == 0 {
		return true
	}
	req := engine.Request{
		Domain:      l.cfg.Domain,
		Descriptors: descs,
		// Queue only while there is room to hold requests; beyond it,
		// delay limits reject.
		Shape: l.waiting.Load() < l.maxWaiting,
	}
	ctx := r.Context()
	start := time.Now()
	res, err := l.eng.Check(ctx, req)
	l.cfg.Metrics.Observe(l.cfg.Transport, &req, &res, err, time.Since(start), l.eng.HasDomain(req.Domain))
	if errors.Is(err, engine.ErrInvalidRequest) {
		// The request's own values are over the engine's bounds (a
		// header of more than engine.MaxValueBytes): letting it through
		// would let any client skip its limits by padding a header.
		headers.WriteProblem(w, headers.Problem{
			Type:     "about:blank",
			Title:    http.StatusText(http.StatusBadRequest),
			Status:   http.StatusBadRequest,
			Detail:   err.Error(),
			Instance: r.URL.Path,
		})
		return false
	}
	if err != nil {
		if !errors.Is(err, engine.ErrNoRuleset) && ctx.Err() == nil {
			l.log.ErrorContext(ctx, "rate-limit check failed; letting the request through", "domain", req.Domain, "error", err)
		}
		return true
	}
	if res.Code == engine.OverLimit {
		headers.Set(w.Header(), res)
		headers.WriteProblem(w, headers.RateLimited(res, l.rejectStatus(res), r.URL.Path))
		return false
	}
	if res.Delay > 0 && !l.hold(ctx, res.Delay) {
		return false
	}
	headers.Set(w.Header(), res)
	return true
}

// hold waits d for a shaped request; false when ctx ended first.
func (l *Limiter) hold(ctx context.Context, d time.Duration) bool {
	l.waiting.Add(1)
	defer l.waiting.Add(-1)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		l.cfg.Metrics.ObserveDelay(d)
		return true
	case <-ctx.Done():
		return false
	}
}

// rejectStatus returns the HTTP status of a rejection: the on_limit status
// of the most restrictive rejecting limit, 429 by default.
func (l *Limiter) rejectStatus(res engine.Result) int {
	i := res.MostRestrictive()
	if i < 0 {
		for j, s := range res.Statuses {
			if s.Code == engine.OverLimit && s.Limit != nil {
				i = j
				break
			}
		}
	}
	if i >= 0 {
		if st := res.Statuses[i].Limit.OnLimit.Status; st >= 400 && st <= 599 {
			return st
		}
	}
	return http.StatusTooManyRequests
}
