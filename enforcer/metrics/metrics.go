// Package metrics holds the enforcer's Prometheus metrics, shared by every
// way a check arrives (HTTP, gRPC, the gateway, the Go middleware):
// decisions by domain, rule and outcome, check latency, store errors, the
// breaker's state, the ruleset version, the time since the console was
// last heard from, and per-value counts for detailed_metric limits with
// bounded cardinality.
package metrics

import (
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/rules"
)

// UnknownDomain labels checks for domains the ruleset does not configure,
// so clients cannot grow the label set without bound.
const UnknownDomain = "_unknown"

// OtherValue labels the detailed_metric values beyond a rule's cap.
const OtherValue = "_other"

// DefaultMaxDetailedValues is how many distinct descriptor values of one
// detailed_metric rule get their own series; the rest count under
// OtherValue.
const DefaultMaxDetailedValues = 100

// Results of one limit in a decision (the "result" label).
const (
	ResultAllowed       = "allowed"
	ResultLimited       = "limited"
	ResultShadowLimited = "shadow_limited"
	ResultFailedOpen    = "failed_open"
	ResultFailedClosed  = "failed_closed"
	ResultLocalAllowed  = "local_allowed"
	ResultLocalLimited  = "local_limited"
)

// Options configures New.
type Options struct {
	// Engine, when set, adds gauges for its ruleset version and its
	// breaker's state and trips.
	Engine *engine.Engine
	// LastContact, when set, adds the seconds since the console was last
	// heard from (the subscriber's LastContact; zero time: never).
	LastContact func() time.Time
	// MaxDetailedValues caps the series per detailed_metric rule
	// (DefaultMaxDetailedValues when zero).
	MaxDetailedValues int
}

// Metrics records check outcomes. A nil *Metrics records nothing.
type Metrics struct {
	decisions     *prometheus.CounterVec
	ruleDecisions *prometheus.CounterVec
	detailed      *prometheus.CounterVec
	checkErrors   *prometheus.CounterVec
	duration      *prometheus.HistogramVec
	delay         prometheus.Histogram
	storeErrors   prometheus.Counter

	maxDetailed int64
	rules       atomic.Pointer[ruleCache]
	transports  sync.Map // transport → prometheus.Observer
}

// New registers the metrics on reg.
func New(reg prometheus.Registerer, opts Options) (*Metrics, error) {
	m := &Metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_enforcer_decisions_total",
			Help: "Rate-limit checks answered, by domain and overall code (ok, over_limit).",
		}, []string{"domain", "code"}),
		ruleDecisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_enforcer_rule_decisions_total",
			Help: "Per-limit outcomes by domain and rule: allowed, limited, shadow_limited, failed_open, failed_closed (store down), local_allowed, local_limited (store down, in-process limiter).",
		}, []string{"domain", "rule", "result"}),
		detailed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_enforcer_detailed_decisions_total",
			Help: "Per-value outcomes of detailed_metric rules; values beyond the per-rule cap count as _other.",
		}, []string{"domain", "rule", "value", "result"}),
		checkErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_enforcer_check_errors_total",
			Help: "Checks not answered: invalid (malformed request), not_ready (no ruleset), internal.",
		}, []string{"reason"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_enforcer_check_duration_seconds",
			Help:    "Time to answer a rate-limit check, by transport (http, grpc, gateway, middleware).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 15), // 100µs … ~1.6s
		}, []string{"transport"}),
		delay: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sluice_enforcer_delay_seconds",
			Help:    "Time requests of on_limit: delay limits were held before going through.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 15), // 1ms … ~16s
		}),
		storeErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_enforcer_store_errors_total",
			Help: "Checks whose counter store failed or was cut off by the open breaker, answered by the limits' failure modes.",
		}),
		maxDetailed: int64(opts.MaxDetailedValues),
	}
	if m.maxDetailed <= 0 {
		m.maxDetailed = DefaultMaxDetailedValues
	}
	cs := []prometheus.Collector{m.decisions, m.ruleDecisions, m.detailed, m.checkErrors, m.duration, m.delay, m.storeErrors}
	if eng := opts.Engine; eng != nil {
		cs = append(cs, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sluice_enforcer_ruleset_version",
			Help: "Version of the ruleset this node enforces (0: none yet).",
		}, func() float64 { return float64(eng.Version()) }))
		if eng.Region() != "" {
			cs = append(cs,
				prometheus.NewGaugeFunc(prometheus.GaugeOpts{
					Name: "sluice_enforcer_global_store_up",
					Help: "1 while this node's view of the other regions' counts is current; 0 while scope: global limits enforce the region's share.",
				}, func() float64 {
					if eng.GlobalUp() {
						return 1
					}
					return 0
				}),
				prometheus.NewGaugeFunc(prometheus.GaugeOpts{
					Name: "sluice_enforcer_regions",
					Help: "Regions a scope: global limit is shared between while the global store is unreachable.",
				}, func() float64 { return float64(eng.RegionCount()) }),
			)
		}
		if b := eng.Breaker(); b != nil {
			cs = append(cs,
				prometheus.NewGaugeFunc(prometheus.GaugeOpts{
					Name: "sluice_enforcer_breaker_state",
					Help: "State of the circuit breaker around the counter store: 0 closed, 1 open, 2 half-open.",
				}, func() float64 { return float64(b.State()) }),
				prometheus.NewCounterFunc(prometheus.CounterOpts{
					Name: "sluice_enforcer_breaker_trips_total",
					Help: "Times the circuit breaker around the counter store opened.",
				}, func() float64 { return float64(b.Trips()) }),
			)
		}
	}
	if eng := opts.Engine; eng != nil && eng.Async() {
		cs = append(cs,
			prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "sluice_enforcer_async_flushes_total",
				Help: "Flushes of consistency: async limits' hits to Redis, retries included.",
			}, func() float64 { return float64(eng.AsyncStats().Flushes) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "sluice_enforcer_async_flush_errors_total",
				Help: "Flushes of async limits that failed (sent again with their id at the next interval).",
			}, func() float64 { return float64(eng.AsyncStats().FlushErrors) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "sluice_enforcer_async_dropped_hits_total",
				Help: "Admitted hits of async limits whose flush kept failing and was given up: perhaps never counted in Redis.",
			}, func() float64 { return float64(eng.AsyncStats().Dropped) }),
		)
	}
	if last := opts.LastContact; last != nil {
		cs = append(cs, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sluice_enforcer_console_last_contact_age_seconds",
			Help: "Seconds since the last message or pong from the console (-1: never heard from).",
		}, func() float64 {
			t := last()
			if t.IsZero() {
				return -1
			}
			return time.Since(t).Seconds()
		}))
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// ObserveDelay records how long a request was held by an on_limit: delay
// limit before it went through.
func (m *Metrics) ObserveDelay(d time.Duration) {
	if m != nil {
		m.delay.Observe(d.Seconds())
	}
}

// Observe records one check: its transport, the request, and what
// engine.Check returned after elapsed. hasDomain reports whether the
// ruleset configures req.Domain.
func (m *Metrics) Observe(transport string, req *engine.Request, res *engine.Result, err error, elapsed time.Duration, hasDomain bool) {
	if m == nil {
		return
	}
	m.observer(transport).Observe(elapsed.Seconds())
	switch {
	case err == nil:
	case errors.Is(err, engine.ErrInvalidRequest):
		m.checkErrors.WithLabelValues("invalid").Inc()
		return
	case errors.Is(err, engine.ErrNoRuleset):
		m.checkErrors.WithLabelValues("not_ready").Inc()
		return
	default:
		m.checkErrors.WithLabelValues("internal").Inc()
		return
	}
	domain := req.Domain
	if !hasDomain {
		domain = UnknownDomain
	}
	cache := m.cache(res.Version)
	cache.decision(m, domain, res.Code).Inc()
	if res.StoreErr != nil {
		m.storeErrors.Inc()
	}
	for i, s := range res.Statuses {
		if s.Limit == nil || s.Limit.Unlimited {
			continue
		}
		r := result(s, res.Code)
		if r < 0 {
			continue
		}
		rc := cache.rule(m, s.Limit)
		rc.results[r].Inc()
		if s.Limit.DetailedMetric && i < len(req.Descriptors) {
			m.detailedValue(rc, req.Descriptors[i].Entries, r)
		}
	}
}

func (m *Metrics) observer(transport string) prometheus.Observer {
	if o, ok := m.transports.Load(transport); ok {
		return o.(prometheus.Observer)
	}
	o := m.duration.WithLabelValues(transport)
	m.transports.Store(transport, o)
	return o
}

// results in label order; result returns an index into it.
var resultNames = [...]string{ResultAllowed, ResultLimited, ResultShadowLimited, ResultFailedOpen, ResultFailedClosed, ResultLocalAllowed, ResultLocalLimited}

// result returns the index in resultNames of s's outcome, or -1 when s
// counted nothing (it had room, but another limit rejected the request).
func result(s engine.Status, overall engine.Code) int {
	switch {
	case s.Local && s.Code == engine.OverLimit:
		return 6
	case s.Local && overall == engine.OK:
		return 5
	case s.Local:
		return -1
	case s.StoreFailed && s.Code == engine.OverLimit:
		return 4
	case s.StoreFailed:
		return 3
	case s.Shadowed:
		return 2
	case s.Code == engine.OverLimit:
		return 1
	case overall == engine.OK:
		return 0
	}
	return -1
}

// ruleCache holds the counters of one ruleset version's rules, so the hot
// path finds them with one map lookup instead of hashing label values.
type ruleCache struct {
	version int64
	limits  sync.Map // ruleKey → *ruleCounters
	// domains holds the decisions counters of the ruleset's domains (and
	// UnknownDomain), OK and OverLimit: label lookups cost a check more
	// than the rest of Observe.
	domains sync.Map // domain → *[2]prometheus.Counter
}

// decision returns the decisions counter of domain and code.
func (c *ruleCache) decision(m *Metrics, domain string, code engine.Code) prometheus.Counter {
	i := 0
	switch code {
	case engine.OK:
	case engine.OverLimit:
		i = 1
	default:
		return m.decisions.WithLabelValues(domain, code.String())
	}
	if cs, ok := c.domains.Load(domain); ok {
		return cs.(*[2]prometheus.Counter)[i]
	}
	cs := &[2]prometheus.Counter{
		m.decisions.WithLabelValues(domain, engine.OK.String()),
		m.decisions.WithLabelValues(domain, engine.OverLimit.String()),
	}
	actual, _ := c.domains.LoadOrStore(domain, cs)
	return actual.(*[2]prometheus.Counter)[i]
}

// ruleKey names a rule's series. Limits are keyed by name, not pointer: a
// caller's limit override is a new Limit each time.
type ruleKey struct{ domain, rule string }

type ruleCounters struct {
	domain, rule string
	results      [len(resultNames)]prometheus.Counter
	values       sync.Map // descriptor value → *[len(resultNames)]prometheus.Counter
	nvalues      atomic.Int64
	otherOnce    sync.Once
	other        [len(resultNames)]prometheus.Counter
}

func (m *Metrics) cache(version int64) *ruleCache {
	c := m.rules.Load()
	if c != nil && c.version == version {
		return c
	}
	// A new ruleset: its limits are new pointers. The old cache is dropped
	// (its series stay registered and keep their counts).
	n := &ruleCache{version: version}
	if m.rules.CompareAndSwap(c, n) {
		return n
	}
	return m.rules.Load()
}

func (c *ruleCache) rule(m *Metrics, l *rules.Limit) *ruleCounters {
	key := ruleKey{l.Domain, l.Name}
	if rc, ok := c.limits.Load(key); ok {
		return rc.(*ruleCounters)
	}
	rc := &ruleCounters{domain: l.Domain, rule: l.Name}
	for i, name := range resultNames {
		rc.results[i] = m.ruleDecisions.WithLabelValues(l.Domain, l.Name, name)
	}
	actual, _ := c.limits.LoadOrStore(key, rc)
	return actual.(*ruleCounters)
}

// detailedValue counts one outcome of a detailed_metric rule under the
// descriptor's value (Lyft's style: key_value joined by '.'), or under
// OtherValue once the rule has MaxDetailedValues values.
func (m *Metrics) detailedValue(rc *ruleCounters, entries []rules.Entry, r int) {
	value := detailedName(entries)
	if v, ok := rc.values.Load(value); ok {
		v.(*[len(resultNames)]prometheus.Counter)[r].Inc()
		return
	}
	if rc.nvalues.Add(1) > m.maxDetailed {
		rc.nvalues.Add(-1)
		rc.otherOnce.Do(func() {
			for i, name := range resultNames {
				rc.other[i] = m.detailed.WithLabelValues(rc.domain, rc.rule, OtherValue, name)
			}
		})
		rc.other[r].Inc()
		return
	}
	var cs [len(resultNames)]prometheus.Counter
	for i, name := range resultNames {
		cs[i] = m.detailed.WithLabelValues(rc.domain, rc.rule, value, name)
	}
	actual, loaded := rc.values.LoadOrStore(value, &cs)
	if loaded {
		rc.nvalues.Add(-1)
	}
	actual.(*[len(resultNames)]prometheus.Counter)[r].Inc()
}

// maxValueLabel bounds a detailed value label, in bytes.
const maxValueLabel = 200

func detailedName(entries []rules.Entry) string {
	var b strings.Builder
	for i, e := range entries {
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteString(e.Key)
		b.WriteByte('_')
		b.WriteString(e.Value)
	}
	v := b.String()
	if len(v) > maxValueLabel {
		v = v[:maxValueLabel]
	}
	// Label values must be UTF-8 (client_golang panics otherwise), and
	// descriptor values come from clients.
	return strings.ToValidUTF8(v, "\uFFFD")
}
