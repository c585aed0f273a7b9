package stats

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice/rules/wire"
)

// histOf builds a span's histograms from per-(value, second) counts.
func histOf(counts [][]int64) wire.RulePreview {
	p := wire.RulePreview{Domain: "d", Rule: "r", T: 60, SpanS: 60}
	for _, secs := range counts {
		var peak, total int64
		for _, c := range secs {
			p.Second = p.Second.Add(wire.Histogram{{int64(wire.Bucket(c)), 1, c}})
			peak, total = max(peak, c), total+c
		}
		p.Requests += total
		p.Peak = p.Peak.Add(wire.Histogram{{int64(wire.Bucket(peak)), 1, peak}})
		p.Span = p.Span.Add(wire.Histogram{{int64(wire.Bucket(total)), 1, total}})
	}
	return p
}

// TestReplayBounds: for random traffic and limits, what a limit truly
// rejects and how many values it truly limits lie within Replay's bounds;
// below 32 the replay is exact; and the estimate is within 10% of the
// truth whenever the truth is more than a few requests.
func TestReplayBounds(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(7, 9))
	for trial := range 300 {
		values := 1 + r.IntN(200)
		counts := make([][]int64, values)
		for v := range counts {
			scale := []int64{5, 30, 300, 5000}[r.IntN(4)]
			for range 1 + r.IntN(10) {
				counts[v] = append(counts[v], 1+r.Int64N(scale))
			}
		}
		p := histOf(counts)
		for _, window := range []int64{1, 60} {
			limit := r.Int64N(400)
			var want, wantValues int64
			for _, secs := range counts {
				var total, limitedHere int64
				for _, c := range secs {
					total += c
					if window == 1 {
						limitedHere += max(0, c-limit)
					}
				}
				if window == 60 {
					limitedHere = max(0, total-limit)
				}
				want += limitedHere
				if limitedHere > 0 {
					wantValues++
				}
			}
			got, ok := Replay(p, limit, window)
			if !ok {
				t.Fatalf("window %d not replayed", window)
			}
			if want < got.Low || want > got.High || got.Estimate < got.Low || got.Estimate > got.High {
				t.Fatalf("trial %d window %d limit %d: truth %d, replay %d in [%d, %d]", trial, window, limit, want, got.Estimate, got.Low, got.High)
			}
			if wantValues < got.ValuesLow || wantValues > got.ValuesHigh {
				t.Fatalf("trial %d window %d limit %d: %d values truly limited, replay [%d, %d]", trial, window, limit, wantValues, got.ValuesLow, got.ValuesHigh)
			}
			if want > 100 && abs64(got.Estimate-want)*10 > want {
				t.Errorf("trial %d window %d limit %d: estimate %d, truth %d: over 10%%", trial, window, limit, got.Estimate, want)
			}
		}
	}
	// Exact below 32.
	p := histOf([][]int64{{3, 9, 31}, {12}, {1}})
	if got, _ := Replay(p, 8, 1); got.Low != 1+23+4 || got.High != got.Low || got.ValuesLow != 2 || got.ValuesHigh != 2 {
		t.Errorf("small counts: %+v, want exactly 28 requests of 2 values", got)
	}
	if _, ok := Replay(p, 8, 3600); ok {
		t.Error("an hour's window replayed from minute spans")
	}
}

func abs64(n int64) int64 {
	if n < 0 {
		return -n
	}
	return n
}

// TestPreviewSpansFleetWide: two replicas' nodes report the same rule's
// span; each replica writes its own, and either one reads their sum. A
// report with a bad preview is refused whole.
func TestPreviewSpansFleetWide(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := newStore(t)
	clk := &fakeClock{t: time.Now()}
	a, b := newAggregator(t, st, "a", clk), newAggregator(t, st, "b", clk)
	t0 := clk.now().Unix() - clk.now().Unix()%60 - 60
	span := func(counts ...int64) wire.RulePreview {
		p := histOf([][]int64{counts})
		p.Domain, p.Rule, p.T = "api", "k", t0
		return p
	}
	for _, tc := range []struct {
		agg *Aggregator
		p   wire.RulePreview
	}{{a, span(40, 2)}, {a, span(7)}, {b, span(40)}} {
		if err := tc.agg.Ingest(&wire.Stats{Type: wire.TypeStats, IntervalMS: 1000, Preview: []wire.RulePreview{tc.p}}, clk.now()); err != nil {
			t.Fatal(err)
		}
	}
	for name, bad := range map[string]wire.RulePreview{
		"unknown domain": {Domain: "nope", Rule: "k", T: t0, SpanS: 60},
		"empty rule":     {Domain: "api", T: t0, SpanS: 60},
	} {
		if err := a.Ingest(&wire.Stats{Type: wire.TypeStats, IntervalMS: 1000, Preview: []wire.RulePreview{bad}}, clk.now()); err == nil {
			t.Errorf("%s: preview accepted", name)
		}
	}
	// Spans outside the hour by the node's clock are dropped, not the
	// report: its stats still count.
	for _, shift := range []int64{-7200, 7200} {
		p := span(1000)
		p.T += shift
		m := &wire.Stats{Type: wire.TypeStats, IntervalMS: 1000, Preview: []wire.RulePreview{p}, Rules: []wire.RuleStats{{Domain: "api", Rule: "k", Allowed: 1}}}
		if err := a.Ingest(m, clk.now()); err != nil {
			t.Errorf("a report with a span at %d: %v", p.T, err)
		}
	}
	for _, agg := range []*Aggregator{a, b} {
		if err := agg.flushPreview(ctx); err != nil {
			t.Fatal(err)
		}
	}
	got, err := b.PreviewSpans(ctx, "api", []string{"k"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got["k"]) != 1 {
		t.Fatalf("got %+v, want one span", got)
	}
	p := got["k"][0]
	// Seconds of 40 and 2 hits, 7, and 40 (another node): a limit of 5 a
	// second rejects 35 + 2 + 35.
	r, _ := Replay(p, 5, 1)
	if p.Requests != 89 || r.Low != 72 || r.High != 72 {
		t.Errorf("merged span: %d requests, replay %+v; want 89 requests and exactly 72 rejected", p.Requests, r)
	}
}

// TestReplayHugeCounts: counts at the bounds a report may carry neither
// overflow nor break the bounds' order.
func TestReplayHugeCounts(t *testing.T) {
	t.Parallel()
	c := int64(MaxCount) - 12345
	p := histOf([][]int64{{c}})
	p.Untracked, p.Requests = 1<<39, p.Requests+1<<39
	for _, limit := range []int64{0, 1, 1 << 31, c - 1000, c} {
		r, _ := Replay(p, limit, 1)
		if r.Low < 0 || r.Low > r.Estimate || r.Estimate > r.High || r.High > p.Requests || r.Low > max(0, c-limit) || max(0, c-limit) > r.High {
			t.Errorf("limit %d: %+v, want 0 ≤ low ≤ %d ≤ high ≤ %d", limit, r, max(0, c-limit), p.Requests)
		}
	}
}
