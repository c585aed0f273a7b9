package metrics_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/enforcer/limiter"
	"github.com/sluicehq/sluice/enforcer/metrics"
	"github.com/sluicehq/sluice/rules"
)

func TestObserve(t *testing.T) {
	reg := prometheus.NewRegistry()
	last := time.Now().Add(-3 * time.Second)
	m, err := metrics.New(reg, metrics.Options{LastContact: func() time.Time { return last }})
	if err != nil {
		t.Fatal(err)
	}
	l := &rules.Limit{Domain: "api", Name: "per-key", FailureMode: rules.FailOpen}
	req := &engine.Request{Domain: "api", Descriptors: []engine.Descriptor{{Entries: []rules.Entry{{Key: "k", Value: "v"}}}}}
	observe := func(res engine.Result, err error) {
		m.Observe("grpc", req, &res, err, time.Millisecond, true)
	}
	st := func(s engine.Status) engine.Result {
		s.Limit = l
		code := engine.OK
		if s.Code == engine.OverLimit {
			code = engine.OverLimit
		}
		res := engine.Result{Code: code, Statuses: []engine.Status{s}, Version: 1}
		if s.StoreFailed {
			res.StoreErr = errors.New("connection refused")
		}
		return res
	}
	observe(st(engine.Status{Code: engine.OK}), nil)
	observe(st(engine.Status{Code: engine.OverLimit}), nil)
	observe(st(engine.Status{Code: engine.OK, Shadowed: true}), nil)
	observe(st(engine.Status{Code: engine.OK, StoreFailed: true}), nil)
	observe(st(engine.Status{Code: engine.OverLimit, StoreFailed: true}), nil)
	observe(st(engine.Status{Code: engine.OK, StoreFailed: true, Local: true}), nil)
	observe(st(engine.Status{Code: engine.OverLimit, StoreFailed: true, Local: true}), nil)
	observe(engine.Result{}, engine.ErrNoRuleset)
	observe(engine.Result{}, errors.Join(engine.ErrInvalidRequest))

	got := gather(t, reg)
	for _, want := range []string{
		`sluice_enforcer_rule_decisions_total{domain="api",result="allowed",rule="per-key"} 1`,
		`sluice_enforcer_rule_decisions_total{domain="api",result="limited",rule="per-key"} 1`,
		`sluice_enforcer_rule_decisions_total{domain="api",result="shadow_limited",rule="per-key"} 1`,
		`sluice_enforcer_rule_decisions_total{domain="api",result="failed_open",rule="per-key"} 1`,
		`sluice_enforcer_rule_decisions_total{domain="api",result="failed_closed",rule="per-key"} 1`,
		`sluice_enforcer_rule_decisions_total{domain="api",result="local_allowed",rule="per-key"} 1`,
		`sluice_enforcer_rule_decisions_total{domain="api",result="local_limited",rule="per-key"} 1`,
		`sluice_enforcer_check_errors_total{reason="not_ready"} 1`,
		`sluice_enforcer_check_errors_total{reason="invalid"} 1`,
		`sluice_enforcer_store_errors_total{} 4`,
		`sluice_enforcer_decisions_total{code="ok",domain="api"} 4`,
		`sluice_enforcer_decisions_total{code="over_limit",domain="api"} 3`,
	} {
		if !got[want] {
			t.Errorf("metrics lack %s", want)
		}
	}
	if age := value(t, reg, "sluice_enforcer_console_last_contact_age_seconds"); age < 3 || age > 60 {
		t.Errorf("console last contact age %v, want about 3s", age)
	}
}

// gather renders every sample as `name{label="value",...} number`.
func gather(t *testing.T, reg *prometheus.Registry) map[string]bool {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, lp := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", lp.GetName(), lp.GetValue()))
			}
			v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
			out[fmt.Sprintf("%s{%s} %v", mf.GetName(), strings.Join(labels, ","), v)] = true
		}
	}
	return out
}

func value(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no %s", name)
	return 0
}

// TestAsyncCounters: an engine that counts async limits exports its flush
// counters; one that does not, none.
func TestAsyncCounters(t *testing.T) {
	names := func(opts ...engine.Option) map[string]bool {
		t.Helper()
		reg := prometheus.NewRegistry()
		client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
		t.Cleanup(func() { client.Close() })
		r := limiter.NewRedis(client)
		if _, err := metrics.New(reg, metrics.Options{Engine: engine.New(r, "test", opts...)}); err != nil {
			t.Fatal(err)
		}
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]bool{}
		for _, mf := range mfs {
			got[mf.GetName()] = true
		}
		return got
	}
	counters := []string{"sluice_enforcer_async_flushes_total", "sluice_enforcer_async_flush_errors_total", "sluice_enforcer_async_dropped_hits_total"}
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer client.Close()
	with := names(engine.WithAsync(limiter.NewRedis(client), engine.AsyncOptions{}))
	without := names()
	for _, name := range counters {
		if !with[name] {
			t.Errorf("%s missing with async counting", name)
		}
		if without[name] {
			t.Errorf("%s exported without async counting", name)
		}
	}
}
