package subscriber_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

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
	t.Parallel()
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

// TestIdleNodeSendsNoStats checks that intervals in which the node decided
// nothing send nothing, and that the first report after them covers one
// interval with every decision counted: nothing is lost when traffic
// resumes, and the console's rates for it stay right.
func TestIdleNodeSendsNoStats(t *testing.T) {
	t.Parallel()
	c := newConsole(t)
	const interval = 20 * time.Millisecond
	var calls atomic.Int64
	sub, err := subscriber.New(subscriber.Config{
		ConsoleURL: c.srv.URL, NodeToken: token, NodeID: "node-1",
		StatsInterval: interval,
		StatsSource: func() []wire.RuleStats {
			// Decisions in the first interval, then none for nine,
			// then decisions in every one.
			if n := calls.Add(1); n == 1 || n > 10 {
				return []wire.RuleStats{{Domain: "api", Rule: "per-key", Allowed: n}}
			}
			return nil
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
	for _, want := range []int64{1, 11, 12} {
		st, ok := cc.recv().(*wire.Stats)
		if !ok {
			t.Fatal("want stats")
		}
		if len(st.Rules) != 1 || st.Rules[0].Allowed != want {
			t.Fatalf("report %+v, want the counts of call %d (the idle calls sent nothing)", st, want)
		}
		// One interval, not the idle ones before it (scheduling may
		// stretch it on a loaded machine, never to the nine idle ones).
		if got := time.Duration(st.IntervalMS) * time.Millisecond; got > 5*interval {
			t.Errorf("report of call %d covers %v, want about %v", want, got, interval)
		}
	}
}

func TestEncodeStatsFitsLimits(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("v", 300)
	many := func(n, top int) []wire.RuleStats {
		rules := make([]wire.RuleStats, n)
		for i := range rules {
			rules[i] = wire.RuleStats{Domain: "api", Rule: strings.Repeat("r", 100), Allowed: int64(i)}
			for range top {
				rules[i].TopLimited = append(rules[i].TopLimited, wire.ValueCount{Value: long, Count: 1})
			}
		}
		return rules
	}
	tests := []struct {
		name      string
		rules     []wire.RuleStats
		wantRules int // -1: fewer than given, busiest kept
		wantTop   bool
	}{
		{"small", many(3, 2), 3, true},
		{"too many top values", many(1, wire.MaxTopValues+5), 1, true},
		{"too many rules", many(wire.MaxStatsRules+10, 0), -1, false},
		{"too many bytes with top values", many(2000, wire.MaxTopValues), 2000, false},
		{"too many bytes without", func() []wire.RuleStats {
			r := many(5000, 0)
			for i := range r {
				r[i].Rule = long
			}
			return r
		}(), -1, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			data, err := subscriber.EncodeStats(wire.Stats{Type: wire.TypeStats, IntervalMS: 1000, Rules: tt.rules})
			if err != nil {
				t.Fatal(err)
			}
			if len(data) > wire.MaxNodeMessageBytes {
				t.Fatalf("%d bytes, over the %d limit", len(data), wire.MaxNodeMessageBytes)
			}
			var got wire.Stats
			if err := json.Unmarshal(data, &got); err != nil {
				t.Fatal(err)
			}
			if err := got.Validate(); err != nil {
				t.Fatalf("console would refuse it: %v", err)
			}
			switch {
			case tt.wantRules >= 0 && len(got.Rules) != tt.wantRules:
				t.Errorf("%d rules, want %d", len(got.Rules), tt.wantRules)
			case tt.wantRules < 0 && (len(got.Rules) == 0 || len(got.Rules) >= len(tt.rules) || got.Rules[0].Allowed != int64(len(tt.rules)-1)):
				t.Errorf("%d rules (first allowed %d), want fewer than %d, busiest first", len(got.Rules), got.Rules[0].Allowed, len(tt.rules))
			}
			if hasTop := len(got.Rules) > 0 && len(got.Rules[0].TopLimited) > 0; hasTop != tt.wantTop {
				t.Errorf("top values kept %v, want %v", hasTop, tt.wantTop)
			}
		})
	}
}

// TestEncodeStatsTrimsValues: a report whose values do not fit names fewer
// values per rule, the most limited kept, before it drops anything else.
func TestEncodeStatsTrimsValues(t *testing.T) {
	t.Parallel()
	rules := make([]wire.RuleStats, 40)
	for i := range rules {
		r := wire.RuleStats{Domain: "api", Rule: fmt.Sprintf("rule-%d", i)}
		for j := range wire.MaxValues {
			r.Values = append(r.Values, wire.ValueCount{Value: fmt.Sprintf("customer-%010d", j), Count: int64(2*wire.MaxValues - j)})
		}
		r.Limited = 0
		for _, v := range r.Values {
			r.Limited += v.Count
		}
		r.TopLimited = slices.Clone(r.Values[:wire.MaxTopValues])
		rules[i] = r
	}
	data, err := subscriber.EncodeStats(wire.Stats{Type: wire.TypeStats, IntervalMS: 1000, Rules: rules})
	if err != nil {
		t.Fatal(err)
	}
	if len(data) > wire.MaxNodeMessageBytes {
		t.Fatalf("%d bytes, over the %d limit", len(data), wire.MaxNodeMessageBytes)
	}
	var got wire.Stats
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	if err := got.Validate(); err != nil {
		t.Fatalf("console would refuse it: %v", err)
	}
	if len(got.Rules) != len(rules) {
		t.Fatalf("%d rules, want all %d", len(got.Rules), len(rules))
	}
	for _, r := range got.Rules {
		if len(r.Values) == 0 || len(r.Values) >= wire.MaxValues || r.Values[0] != rules[0].Values[0] || len(r.TopLimited) != wire.MaxTopValues {
			t.Fatalf("rule %s: %d values (first %v), %d top: want fewer values, the most limited first, top kept", r.Rule, len(r.Values), r.Values[0], len(r.TopLimited))
		}
	}
}
