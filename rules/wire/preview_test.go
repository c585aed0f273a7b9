package wire_test

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/rules/wire"
)

// TestBuckets: every count has one bucket, buckets tile the counts without
// gaps, counts below 32 are exact, and no bucket is wider than 1/16 of its
// smallest count.
func TestBuckets(t *testing.T) {
	next := int64(1)
	for b := 1; b < wire.NumBuckets; b++ {
		lo, hi := wire.BucketBounds(b)
		if lo != next || hi < lo {
			t.Fatalf("bucket %d = [%d, %d], want it to start at %d", b, lo, hi, next)
		}
		if wire.Bucket(lo) != b || wire.Bucket(hi) != b {
			t.Fatalf("bucket %d = [%d, %d], but Bucket gives %d and %d", b, lo, hi, wire.Bucket(lo), wire.Bucket(hi))
		}
		if lo < 32 && hi != lo {
			t.Fatalf("bucket %d = [%d, %d], want exact below 32", b, lo, hi)
		}
		if float64(hi-lo+1) > float64(lo)/16+1e-9 && lo >= 32 {
			t.Fatalf("bucket %d = [%d, %d] is wider than 1/16", b, lo, hi)
		}
		if hi == math.MaxInt64 {
			if b != wire.NumBuckets-1 {
				t.Fatalf("bucket %d ends at MaxInt64 before the last", b)
			}
			return
		}
		next = hi + 1
	}
	t.Fatalf("the last bucket ends at %d, not MaxInt64", next-1)
}

func TestHistogramAdd(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	counts := map[int64]int64{}
	var a, b wire.Histogram
	for range 2000 {
		c := r.Int64N(5000) + 1
		counts[c]++
		h := wire.Histogram{{int64(wire.Bucket(c)), 1, c}}
		if r.IntN(2) == 0 {
			a = a.Add(h)
		} else {
			b = b.Add(h)
		}
	}
	sum := a.Add(b)
	n, s := sum.Entries()
	var wn, ws int64
	for c, k := range counts {
		wn, ws = wn+k, ws+k*c
	}
	if n != wn || s != ws {
		t.Errorf("merged: %d entries summing to %d, want %d and %d", n, s, wn, ws)
	}
	st := wire.Stats{Type: wire.TypeStats, IntervalMS: 1, Preview: []wire.RulePreview{{Domain: "d", Rule: "r", T: 60, SpanS: 60, Requests: ws, Span: sum, Second: sum, Peak: sum}}}
	if err := st.Validate(); err != nil {
		t.Errorf("merged histogram does not validate: %v", err)
	}
}

func TestValidatePreview(t *testing.T) {
	ok := wire.RulePreview{Domain: "d", Rule: "r", T: 60, SpanS: 60, Requests: 10, Limited: 2, Span: wire.Histogram{{3, 2, 6}, {4, 1, 4}}}
	for _, tc := range []struct {
		name string
		edit func(p *wire.RulePreview)
		want string // "" for valid
	}{
		{"valid", func(*wire.RulePreview) {}, ""},
		{"no span", func(p *wire.RulePreview) { p.SpanS = 0 }, "span_s"},
		{"long span", func(p *wire.RulePreview) { p.SpanS = wire.MaxPreviewSpanS + 1 }, "span_s"},
		{"limited over requests", func(p *wire.RulePreview) { p.Limited = 11 }, "counts"},
		{"negative", func(p *wire.RulePreview) { p.Untracked = -1 }, "counts"},
		{"out of order", func(p *wire.RulePreview) { p.Span = wire.Histogram{{4, 1, 4}, {3, 2, 6}} }, "order"},
		{"bucket 0", func(p *wire.RulePreview) { p.Span = wire.Histogram{{0, 1, 0}} }, "order"},
		{"past the last bucket", func(p *wire.RulePreview) { p.Span = wire.Histogram{{wire.NumBuckets, 1, 1}} }, "range"},
		{"sum outside bucket", func(p *wire.RulePreview) { p.Span = wire.Histogram{{3, 2, 7}} }, "do not fit"},
		{"empty bucket", func(p *wire.RulePreview) { p.Span = wire.Histogram{{3, 0, 0}} }, "do not fit"},
		{"more hits than requests", func(p *wire.RulePreview) { p.Second = wire.Histogram{{11, 1, 11}} }, "more requests"},
		{"huge", func(p *wire.RulePreview) { p.Requests = math.MaxInt64 }, "counts"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := ok
			tc.edit(&p)
			st := wire.Stats{Type: wire.TypeStats, IntervalMS: 1, Preview: []wire.RulePreview{p}}
			err := st.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Validate = %v, want ok", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("Validate = %v, want an error about %q", err, tc.want)
			}
		})
	}
}
