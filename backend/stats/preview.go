package stats

import (
	"cmp"
	"context"
	"maps"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/sluicehq/sluice/rules/wire"
)

// The impact preview's traffic (POST /api/v1/preview). Nodes report, per
// rule and span (a minute), histograms of their per-value hit counts
// (wire.RulePreview). Each replica merges its own nodes' reports in memory
// and writes them to Postgres (preview_spans) at every exchange; a preview
// reads and sums every replica's rows of the last hour, so it answers for
// the fleet. Spans are kept for PreviewWindow and a few minutes more.
//
// Error of a replay, stated with every figure as [low, high] bounds around
// the estimate:
//   - A histogram bucket holds counts within 1/16 of each other (counts
//     below 32 exactly); what a limit L rejects, Σ max(0, c−L), is exact for
//     the buckets wholly above or below L and bounded for the one that
//     holds L (Jensen below, the chord above); so are the values over L.
//   - Requests of values a node did not track (over its per-rule bound)
//     may all be limited: they widen the upper bound.
//   - A node counts the values it saw: when one value's traffic is spread
//     over several nodes in one window, its per-node counts are smaller
//     than the fleet's, so the replay under-counts what a lowered limit
//     rejects (at most by the node count's factor). The figures are exact
//     (within the buckets) when each value reaches one node, as with
//     consistent-hash routing or a single node.
//   - Windows are the node clock's whole seconds and spans: the store's
//     fixed windows, which start at multiples of the period since the
//     epoch of Redis TIME, are those seconds on a host whose clock agrees
//     with Redis.

// PreviewWindow is how much past traffic a preview replays.
const PreviewWindow = time.Hour

// previewKeep is how long spans stay in Postgres.
const previewKeep = PreviewWindow + 5*time.Minute

type previewKey struct {
	domain, rule string
	t            int64
}

// previewBuffer is what this replica's nodes reported, not yet written.
type previewBuffer struct {
	mu      sync.Mutex
	pending map[previewKey]*wire.RulePreview
	pruned  time.Time
}

// checkPreviewLocked checks the previews of a report for Ingest and returns
// those it keeps: it drops (and counts, as refused previews) the spans
// outside the window a preview replays, by the node's clock: too old to
// matter, or from a node whose clock is far ahead. Caller holds a.mu.
func (a *Aggregator) checkPreviewLocked(m *wire.Stats, now int64) ([]wire.RulePreview, *RefusedError) {
	var kept []wire.RulePreview
	for i, p := range m.Preview {
		if err := checkName("domain", p.Domain); err != nil {
			return nil, refuse("invalid", "preview[%d]: %s", i, err)
		}
		if err := checkName("rule", p.Rule); err != nil {
			return nil, refuse("invalid", "preview[%d]: %s", i, err)
		}
		if !a.domains[p.Domain] {
			return nil, refuse("unknown_domain", "preview[%d]: no version has domain %q", i, p.Domain)
		}
		if p.T+p.SpanS < now-int64(PreviewWindow/time.Second) || p.T > now+60 {
			a.refused.WithLabelValues("preview_outside_window").Inc()
			continue
		}
		kept = append(kept, p)
	}
	return kept, nil
}

// add merges previews into the pending spans.
func (b *previewBuffer) add(ps []wire.RulePreview) {
	if len(ps) == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.pending == nil {
		b.pending = make(map[previewKey]*wire.RulePreview)
	}
	for _, p := range ps {
		k := previewKey{p.Domain, p.Rule, p.T}
		if q := b.pending[k]; q != nil {
			mergePreview(q, &p)
			continue
		}
		q := p
		q.Second, q.Peak, q.Span = slices.Clone(p.Second), slices.Clone(p.Peak), slices.Clone(p.Span)
		b.pending[k] = &q
	}
}

// mergePreview adds p's counts to q's (the same rule and span).
func mergePreview(q, p *wire.RulePreview) {
	q.SpanS = max(q.SpanS, p.SpanS)
	q.Requests += p.Requests
	q.Limited += p.Limited
	q.Untracked += p.Untracked
	q.Second = q.Second.Add(p.Second)
	q.Peak = q.Peak.Add(p.Peak)
	q.Span = q.Span.Add(p.Span)
}

// flushPreview writes the pending spans (kept for the next try when the
// write fails) and, once a minute, drops the spans past previewKeep.
func (a *Aggregator) flushPreview(ctx context.Context) error {
	b := &a.pv
	b.mu.Lock()
	pending := b.pending
	b.pending = nil
	prune := a.now().Sub(b.pruned) >= time.Minute
	if prune {
		b.pruned = a.now()
	}
	b.mu.Unlock()
	if prune {
		if err := a.st.DeletePreviewsBefore(ctx, a.now().Add(-previewKeep).Unix()); err != nil {
			a.log.Warn("delete old preview spans", "error", err)
		}
	}
	if len(pending) == 0 {
		return nil
	}
	spans := make([]wire.RulePreview, 0, len(pending))
	for _, p := range pending {
		spans = append(spans, *p)
	}
	if err := a.st.WritePreviews(ctx, spans); err != nil {
		b.add(spans)
		return err
	}
	return nil
}

// PreviewSpans returns, per rule of domain, its spans that started within
// the last PreviewWindow, every replica's rows summed, oldest first.
func (a *Aggregator) PreviewSpans(ctx context.Context, domain string, rules []string) (map[string][]wire.RulePreview, error) {
	rows, err := a.st.FindPreviews(ctx, domain, rules, a.now().Add(-PreviewWindow).Unix())
	if err != nil {
		return nil, err
	}
	merged := make(map[previewKey]*wire.RulePreview)
	for i := range rows {
		p := &rows[i]
		k := previewKey{p.Domain, p.Rule, p.T}
		if q := merged[k]; q != nil {
			mergePreview(q, p)
		} else {
			merged[k] = p
		}
	}
	out := make(map[string][]wire.RulePreview)
	for _, k := range slices.SortedFunc(maps.Keys(merged), func(x, y previewKey) int { return cmp.Compare(x.t, y.t) }) {
		out[k.rule] = append(out[k.rule], *merged[k])
	}
	return out, nil
}

// Replayed is what a limit would have rejected in one span, with bounds:
// Low ≤ the true figure ≤ High (see the error statement above), Estimate
// between them. Values counts the distinct values it would have limited.
type Replayed struct {
	Estimate, Low, High           int64
	Values, ValuesLow, ValuesHigh int64
}

// Replay returns what a limit of limit requests per window would have
// rejected of span p's traffic, for a window of windowS seconds: 1 (the
// span's per-second histogram) or the span's length (its per-value
// totals). ok is false for other windows, which p cannot answer.
func Replay(p wire.RulePreview, limit, windowS int64) (r Replayed, ok bool) {
	var pairs, values wire.Histogram
	switch windowS {
	case 1:
		pairs, values = p.Second, p.Peak
	case p.SpanS:
		pairs, values = p.Span, p.Span
	default:
		return Replayed{}, false
	}
	var est2 int64 // twice the estimate (midpoints of integer bounds)
	for _, b := range pairs {
		lo, hi := wire.BucketBounds(int(b[0]))
		n, s := b[1], b[2]
		switch {
		case hi <= limit:
		case lo > limit:
			r.Low += s - n*limit
			r.High += s - n*limit
			est2 += 2 * (s - n*limit)
		default: // lo ≤ limit < hi
			low := max(0, s-n*limit)
			// (s-n·lo)·(hi-limit) may pass int64 for counts near MaxCount;
			// rounded up, the float stays an upper bound.
			high := int64(math.Ceil(float64(s-n*lo) * float64(hi-limit) / float64(hi-lo)))
			high = max(min(high, n*(hi-limit)), low)
			r.Low += low
			r.High += high
			est2 += low + high
		}
	}
	r.Estimate = est2 / 2
	for _, b := range values {
		lo, hi := wire.BucketBounds(int(b[0]))
		n, s := b[1], b[2]
		switch {
		case hi <= limit:
		case lo > limit:
			r.ValuesLow += n
			r.ValuesHigh += n
		default:
			low := ceilDiv(max(0, s-n*limit), hi-limit)
			high := min(n, (s-n*lo)/(limit+1-lo))
			high = max(high, low)
			r.ValuesLow += low
			r.ValuesHigh += high
		}
	}
	r.Values = (r.ValuesLow + r.ValuesHigh) / 2
	if u := p.Untracked; u > 0 {
		// Untracked values may all be over the limit; estimate them as the
		// tracked requests went.
		if tracked := p.Requests - u; tracked > 0 {
			r.Estimate += int64(float64(u) * float64(r.Estimate) / float64(tracked))
		}
		r.High += u
		r.ValuesHigh += u
	}
	return r, true
}

func ceilDiv(a, b int64) int64 {
	if b <= 0 {
		return 0
	}
	return (a + b - 1) / b
}
