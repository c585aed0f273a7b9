package checkserver

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/enforcer/engine"
)

// unknownDomain labels checks for domains the ruleset does not configure, so
// clients cannot grow the metric's label set without bound.
const unknownDomain = "_unknown"

// metrics are the check path's Prometheus collectors.
type metrics struct {
	decisions     *prometheus.CounterVec
	ruleDecisions *prometheus.CounterVec
	checkErrors   *prometheus.CounterVec
	duration      *prometheus.HistogramVec
	storeErrors   prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_enforcer_decisions_total",
			Help: "Rate-limit checks answered, by domain and overall code (ok, over_limit).",
		}, []string{"domain", "code"}),
		ruleDecisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_enforcer_rule_decisions_total",
			Help: "Per-limit outcomes (allowed, limited, shadow_limited, store_error), by domain and rule name.",
		}, []string{"domain", "rule", "result"}),
		checkErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_enforcer_check_errors_total",
			Help: "Checks not answered: invalid (malformed request), not_ready (no ruleset), internal.",
		}, []string{"reason"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_enforcer_check_duration_seconds",
			Help:    "Time to answer a rate-limit check, by transport (http, grpc).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 15), // 100µs … ~1.6s
		}, []string{"transport"}),
		storeErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_enforcer_store_errors_total",
			Help: "Checks whose counter store failed, answered by the limits' failure modes.",
		}),
	}
	for _, c := range []prometheus.Collector{m.decisions, m.ruleDecisions, m.checkErrors, m.duration, m.storeErrors} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// observe records one check's outcome.
func (m *metrics) observe(eng *engine.Engine, transport, domain string, res engine.Result, err error, elapsed time.Duration) {
	m.duration.WithLabelValues(transport).Observe(elapsed.Seconds())
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
	if !eng.HasDomain(domain) {
		domain = unknownDomain
	}
	m.decisions.WithLabelValues(domain, res.Code.String()).Inc()
	if res.StoreErr != nil {
		m.storeErrors.Inc()
	}
	for _, s := range res.Statuses {
		if s.Limit == nil || s.Limit.Unlimited {
			continue
		}
		var result string
		switch {
		case s.StoreFailed:
			result = "store_error"
		case s.Shadowed:
			result = "shadow_limited"
		case s.Code == engine.OverLimit:
			result = "limited"
		case res.Code == engine.OK:
			result = "allowed"
		default:
			// This limit had room but another rejected the request, so
			// nothing was counted against it.
			continue
		}
		m.ruleDecisions.WithLabelValues(domain, s.Limit.Name, result).Inc()
	}
}
