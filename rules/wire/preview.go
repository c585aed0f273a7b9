package wire

import (
	"errors"
	"fmt"
	"math/bits"
)

// The impact preview (POST /api/v1/preview) replays the last hour of real
// traffic against a draft limit. For that a node reports, once per span
// (a minute), per rule, how often each descriptor value hit the rule: not
// the values themselves, but log-scale histograms of the per-value hit
// counts, which bound the size of a report and the error of a replay.
//
// Buckets: a count c ≥ 1 falls in bucket Bucket(c). Counts below 32 have a
// bucket each (exact); above, each power of two is cut into 16 buckets, so
// a bucket [lo, hi] is at most 1/16 of lo wide. A bucket carries how many
// entries fell in it and the sum of their counts, so that what a limit L
// would have rejected, Σ max(0, c−L), is known exactly for the buckets
// above L, and bounded for the one bucket that holds L (see the console's
// stats package).

// Bounds of a preview report, checked by Stats.Validate.
const (
	// NumBuckets is the number of histogram buckets (every int64 count
	// has one).
	NumBuckets = 16 + 16*59
	// MaxPreviewSpanS bounds a span; nodes report minutes.
	MaxPreviewSpanS = 3600
)

// Bucket returns the histogram bucket of count c (c ≥ 1; smaller counts go
// in bucket 1).
func Bucket(c int64) int {
	if c < 32 {
		return int(max(c, 1))
	}
	k := bits.Len64(uint64(c)) - 5 // c>>k is 16..31
	return 16 + 16*k + int(c>>k) - 16
}

// BucketBounds returns the smallest and largest count of bucket b
// (0 < b < NumBuckets).
func BucketBounds(b int) (lo, hi int64) {
	if b < 32 {
		return int64(b), int64(b)
	}
	k := (b - 16) / 16
	sub := int64((b-16)%16) + 16
	lo = sub << k
	return lo, lo + 1<<k - 1
}

// HistBucket is one bucket of a Histogram: its index (Bucket), how many
// entries fell in it and the sum of their counts. On the wire it is the
// array [bucket, n, sum].
type HistBucket [3]int64

// Histogram lists its non-empty buckets by increasing index.
type Histogram []HistBucket

// RulePreview is one rule's traffic in one span, as the preview needs it.
// An entry of Second is one (value, second) pair: a value's hits in one
// whole second of the node's clock (the store's fixed windows of a second
// are the same seconds). An entry of Peak is one value: its hits in its
// busiest second of the span; of Span, one value: its hits in the span.
type RulePreview struct {
	Domain string `json:"domain"`
	Rule   string `json:"rule"`
	// T is the span's start (Unix seconds), SpanS its length.
	T     int64 `json:"t"`
	SpanS int64 `json:"span_s"`
	// Requests counts what the rule decided in the span (as RuleStats:
	// allowed, limited, shadow-limited or decided by its failure mode);
	// Limited those it rejected, shadow-limited included.
	Requests int64 `json:"requests"`
	Limited  int64 `json:"limited"`
	// Untracked counts the requests of values the node did not track, once
	// it tracked as many as it may; they are in no histogram.
	Untracked int64     `json:"untracked,omitempty"`
	Second    Histogram `json:"sec,omitempty"`
	Peak      Histogram `json:"peak,omitempty"`
	Span      Histogram `json:"span,omitempty"`
}

// Add adds h's buckets to those of g (both by increasing index) and
// returns the result; it may reuse g's array but never h's.
func (g Histogram) Add(h Histogram) Histogram {
	if len(h) == 0 {
		return g
	}
	out := make(Histogram, 0, len(g)+len(h))
	i, j := 0, 0
	for i < len(g) || j < len(h) {
		switch {
		case j == len(h) || (i < len(g) && g[i][0] < h[j][0]):
			out = append(out, g[i])
			i++
		case i == len(g) || h[j][0] < g[i][0]:
			out = append(out, h[j])
			j++
		default:
			out = append(out, HistBucket{g[i][0], g[i][1] + h[j][1], g[i][2] + h[j][2]})
			i++
			j++
		}
	}
	return out
}

// Entries returns the number of entries and the sum of their counts.
func (g Histogram) Entries() (n, sum int64) {
	for _, b := range g {
		n += b[1]
		sum += b[2]
	}
	return n, sum
}

// validate checks that g's buckets exist, come in increasing order, and
// that each sum lies within n times the bucket's bounds.
func (g Histogram) validate(maxCount int64) error {
	prev := 0
	for i, b := range g {
		idx, n, sum := b[0], b[1], b[2]
		if idx <= int64(prev) || idx >= NumBuckets {
			return fmt.Errorf("bucket %d: index %d out of order or range", i, idx)
		}
		prev = int(idx)
		lo, hi := BucketBounds(int(idx))
		if n <= 0 || n > maxCount || sum > maxCount || sum < n*lo || (hi <= maxCount/n && sum > n*hi) {
			return fmt.Errorf("bucket %d: %d entries summing to %d do not fit [%d, %d]", i, n, sum, lo, hi)
		}
	}
	return nil
}

// validatePreview checks one RulePreview's bounds; maxCount bounds every
// count.
func (p *RulePreview) validate(maxCount int64) error {
	switch {
	case p.T < 0 || p.SpanS <= 0 || p.SpanS > MaxPreviewSpanS:
		return fmt.Errorf("t %d / span_s %d out of range", p.T, p.SpanS)
	case p.Requests < 0 || p.Limited < 0 || p.Untracked < 0 || p.Requests > maxCount || p.Limited > p.Requests || p.Untracked > p.Requests:
		return errors.New("counts out of range")
	case len(p.Second) > NumBuckets || len(p.Peak) > NumBuckets || len(p.Span) > NumBuckets:
		return fmt.Errorf("more than %d buckets", NumBuckets)
	}
	for _, h := range []struct {
		name string
		h    Histogram
	}{{"sec", p.Second}, {"peak", p.Peak}, {"span", p.Span}} {
		if err := h.h.validate(maxCount); err != nil {
			return fmt.Errorf("%s: %w", h.name, err)
		}
		if _, sum := h.h.Entries(); h.name != "peak" && sum > p.Requests {
			return fmt.Errorf("%s: counts %d more requests than %d", h.name, sum, p.Requests)
		}
	}
	return nil
}

// maxPreviewCount bounds every count of a preview report, as a stats
// count is bounded.
const maxPreviewCount = MaxStatsCount

// validatePreviews checks a Stats message's previews.
func validatePreviews(ps []RulePreview) error {
	if len(ps) > MaxStatsRules {
		return fmt.Errorf("stats: more than %d previews", MaxStatsRules)
	}
	for i := range ps {
		if err := ps[i].validate(maxPreviewCount); err != nil {
			return fmt.Errorf("stats: preview[%d]: %w", i, err)
		}
	}
	return nil
}
