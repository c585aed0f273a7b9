package engine

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/rules/wire"
)

// limitedResult is a decided check whose one limit l rejected the request.
func limitedResult(l *rules.Limit) *Result {
	return &Result{Code: OverLimit, Statuses: []Status{{Code: OverLimit, Limit: l}}}
}

func limitOf(name string) *rules.Limit {
	return &rules.Limit{Domain: "api", Name: name, Unit: rules.Minute, RequestsPerUnit: 1, Path: []rules.Level{{Key: "k"}}}
}

func valueReq(v string) *Request {
	return &Request{Domain: "api", Descriptors: []Descriptor{{Entries: []rules.Entry{{Key: "k", Value: v}}}}}
}

// TestValuesExactAndBounded: every limited value of an interval is counted
// exactly while the rule tracks fewer than wire.MaxValues; beyond that the
// extra values' requests stay in Limited without a value, so the console
// can tell that the figures are lower bounds.
func TestValuesExactAndBounded(t *testing.T) {
	t.Parallel()
	e := &Engine{}
	st := &e.stats
	l := limitOf("per-key")
	want := map[string]int64{}
	total := int64(0)
	const distinct = wire.MaxValues + 500
	for i := range distinct {
		v := fmt.Sprintf("customer-%05d", i)
		n := int64(i%3 + 1)
		for range n {
			st.count(valueReq(v), limitedResult(l))
		}
		want[v] = n
		total += n
	}
	got := e.TakeStats()
	if len(got) != 1 {
		t.Fatalf("%d rules, want 1", len(got))
	}
	r := got[0]
	if r.Limited != total {
		t.Errorf("limited %d, want %d", r.Limited, total)
	}
	if len(r.Values) != wire.MaxValues {
		t.Fatalf("%d values, want the bound %d", len(r.Values), wire.MaxValues)
	}
	sum := int64(0)
	for i, v := range r.Values {
		if v.Count != want[v.Value] {
			t.Errorf("value %q counted %d, want exactly %d", v.Value, v.Count, want[v.Value])
		}
		if i > 0 && r.Values[i-1].Count < v.Count {
			t.Errorf("values not most first at %d", i)
		}
		sum += v.Count
	}
	if sum >= r.Limited {
		t.Errorf("the values add up to %d of %d limited: the untracked ones must show as missing", sum, r.Limited)
	}
	if err := (&wire.Stats{Type: wire.TypeStats, IntervalMS: 1000, Rules: got}).Validate(); err != nil {
		t.Errorf("the console would refuse the report: %v", err)
	}
	if len(r.TopLimited) != wire.MaxTopValues || r.TopLimited[0] != r.Values[0] {
		t.Errorf("top limited %v, want the %d first values", r.TopLimited, wire.MaxTopValues)
	}
	// The next interval starts afresh, with room again.
	st.count(valueReq("customer-late"), limitedResult(l))
	if got := e.TakeStats(); len(got) != 1 || len(got[0].Values) != 1 || got[0].Values[0].Count != 1 {
		t.Errorf("next interval %+v, want customer-late once", got)
	}
}

// TestValuesNodeBound: over every rule, at most maxTrackedValues values are
// tracked in one interval.
func TestValuesNodeBound(t *testing.T) {
	t.Parallel()
	e := &Engine{}
	st := &e.stats
	rulesN := maxTrackedValues/wire.MaxValues + 4
	for r := range rulesN {
		l := limitOf(fmt.Sprintf("rule-%d", r))
		for i := range wire.MaxValues {
			st.count(valueReq(fmt.Sprintf("v%d", i)), limitedResult(l))
		}
	}
	if st.tracked != maxTrackedValues {
		t.Fatalf("tracked %d, want the bound %d", st.tracked, maxTrackedValues)
	}
	n := 0
	for _, r := range e.TakeStats() {
		n += len(r.Values)
		if r.Limited != wire.MaxValues {
			t.Errorf("rule %s limited %d, want %d", r.Rule, r.Limited, wire.MaxValues)
		}
	}
	if n != maxTrackedValues {
		t.Errorf("%d values reported, want %d", n, maxTrackedValues)
	}
}

// BenchmarkValueSketchMemory reports what the node's value counts hold
// when full: maxTrackedValues values of 16 bytes (customer ids) over 16
// rules, in bytes per node and per value (heap in use, measured).
func BenchmarkValueSketchMemory(b *testing.B) {
	rulesN := maxTrackedValues / wire.MaxValues
	limits := make([]*rules.Limit, rulesN)
	for i := range limits {
		limits[i] = limitOf(fmt.Sprintf("rule-%d", i))
	}
	var perNode float64
	for b.Loop() {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		st := new(stats)
		for _, l := range limits {
			res := limitedResult(l)
			// Fresh strings, as decoded requests bring: the counts keep
			// them once the requests are gone.
			for i := range wire.MaxValues {
				st.count(valueReq(fmt.Sprintf("customer-%07d", i)), res)
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		perNode = float64(after.HeapAlloc) - float64(before.HeapAlloc)
		runtime.KeepAlive(st)
	}
	b.ReportMetric(perNode, "B/node")
	b.ReportMetric(perNode/maxTrackedValues, "B/value")
}
