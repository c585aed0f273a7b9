package subscriber_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/enforcer/subscriber"
	"github.com/sluicehq/sluice/rules/wire"
)

func newSubscriber(urls string) (*subscriber.Subscriber, error) {
	return subscriber.New(subscriber.Config{ConsoleURL: urls}, engine.New(nil, ""), nil)
}

// TestSubscribeSendsStats checks that a node reports its StatsSource to the
// console every interval, each report covering the time since the last.
func TestSubscribeSendsStats(t *testing.T) {
	c := newConsole(t)
	var calls atomic.Int64
	sub, err := subscriber.New(subscriber.Config{
		ConsoleURL: c.srv.URL, NodeToken: token, NodeID: "node-1",
		StatsInterval: 20 * time.Millisecond,
		StatsSource: func() []wire.RuleStats {
			n := calls.Add(1)
			return []wire.RuleStats{{Domain: "api", Rule: "per-key", Allowed: n, Limited: 1,
				TopLimited: []wire.ValueCount{{Value: "k1", Count: 1}}}}
		},
	}, engine.New(nil, ""), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	cc := c.accept()
	for want := int64(1); want <= 3; want++ {
		msg := cc.recv()
		st, ok := msg.(*wire.Stats)
		if !ok {
			t.Fatalf("got %T, want stats", msg)
		}
		if err := st.Validate(); err != nil {
			t.Fatalf("invalid stats: %v", err)
		}
		if len(st.Rules) != 1 || st.Rules[0].Allowed != want || st.Rules[0].TopLimited[0].Value != "k1" {
			t.Fatalf("stats %+v, want call %d's counts", st, want)
		}
	}
}

func TestMetricStats(t *testing.T) {
	reg := prometheus.NewRegistry()
	decisions := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rule_decisions_total", Help: "h"},
		[]string{"domain", "rule", "result"})
	other := prometheus.NewCounter(prometheus.CounterOpts{Name: "other_total", Help: "h"})
	reg.MustRegister(decisions, other)
	source := subscriber.MetricStats(reg, "rule_decisions_total")

	decisions.WithLabelValues("api", "per-key", "allowed").Add(10)
	decisions.WithLabelValues("api", "per-key", "limited").Add(2)
	decisions.WithLabelValues("api", "per-key", "shadow_limited").Add(1)
	decisions.WithLabelValues("web", "per-ip", "store_error").Add(3)
	other.Add(100)
	want := []wire.RuleStats{
		{Domain: "api", Rule: "per-key", Allowed: 10, Limited: 2, ShadowLimited: 1},
		{Domain: "web", Rule: "per-ip", StoreErrors: 3},
	}
	if diff := cmp.Diff(want, source()); diff != "" {
		t.Errorf("first call (-want +got):\n%s", diff)
	}

	// The next call reports only what was added since.
	decisions.WithLabelValues("api", "per-key", "allowed").Add(5)
	want = []wire.RuleStats{{Domain: "api", Rule: "per-key", Allowed: 5}}
	if diff := cmp.Diff(want, source()); diff != "" {
		t.Errorf("second call (-want +got):\n%s", diff)
	}
	if got := source(); len(got) != 0 {
		t.Errorf("third call with no decisions: %+v, want none", got)
	}
}
