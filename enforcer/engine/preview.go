package engine

import (
	"cmp"
	"hash/maphash"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/rules/wire"
)

// Bounds of the impact-preview recorder (see wire.RulePreview). Per rule and
// span (a minute) it keeps one small record per distinct descriptor value,
// at most previewValues of them, and at most previewBudget over all rules;
// the requests of further values count as Untracked (the console widens its
// bounds by them). Cost on the check path: a hash of the value (see
// previewID) and one map lookup per counted limit, under the lock the
// stats take anyway; a value's record is allocated once per span. Memory:
// about 80 bytes per tracked value (values are kept as hashes), so at most
// ~20 MB for the spans being counted and as much for ended spans not yet
// taken (while the console is unreachable): past that the oldest ended
// spans are dropped, and TakePreview drops those older than previewMaxAge,
// which the console would not keep anyway. With WithoutStats nothing is
// recorded.
const (
	previewValues = 4096
	previewBudget = 1 << 18
	// DefaultPreviewSpan is how long one preview span lasts.
	DefaultPreviewSpan = time.Minute
	// previewMaxAge is how old an ended span may be and still be reported.
	previewMaxAge = time.Hour
)

// valueHits is one value's hits in the current span: in all, in second
// cur, and in its busiest second before cur.
type valueHits struct {
	total, cur, inCur, peak int64
}

// previewRule is one rule's current span.
type previewRule struct {
	start, end        int64 // Unix seconds
	requests, limited int64
	untracked         int64
	values            map[uint64]*valueHits // by previewID
	second            map[int]*[2]int64     // bucket → entries, sum: closed (value, second) pairs
}

// previewState is the recorder; guarded by stats.mu.
type previewState struct {
	span    int64 // seconds; 0 means DefaultPreviewSpan
	tracked int   // values tracked over all rules
	rules   map[[2]string]*previewRule
	closed  []closedSpan // spans ended, not yet taken
	held    int          // values in closed
}

type closedSpan struct {
	key [2]string
	r   *previewRule
}

// SetPreviewSpan sets the length of a preview span (DefaultPreviewSpan
// unless set; whole seconds, at least one). Tests shorten it so that a
// span ends within the test.
func (e *Engine) SetPreviewSpan(d time.Duration) {
	e.stats.mu.Lock()
	defer e.stats.mu.Unlock()
	e.stats.pv.span = max(int64(d/time.Second), 1)
}

// recordEntries counts one request's hit, in second now, of a rule's limit
// for the value its descriptor entries name; limited says whether the rule
// rejected it (or would have, in shadow mode). Caller holds stats.mu.
func (pv *previewState) recordEntries(key [2]string, now int64, entries []rules.Entry, limited bool) {
	pv.record(key, now, previewID(entries), limited)
}

// previewSeed keys previewID's hash, once per process.
var previewSeed = maphash.MakeSeed()

// previewIDBytes is how much of each entry's key and value names a value
// in the recorder: values that agree on their first 256 bytes count as
// one, as in TopLimited.
const previewIDBytes = 256

// previewID names a descriptor value by a 64-bit hash of its entries (cut
// to previewIDBytes each), so that the recorder keeps no values and hashes
// at most 16 KiB per descriptor. Two values share a hash with odds of about
// n²/2⁶⁵ for n values of a rule in a span (1 in 10¹² for 4,096).
func previewID(entries []rules.Entry) uint64 {
	if len(entries) == 1 {
		return maphash.String(previewSeed, wire.Cut(entries[0].Value, previewIDBytes))
	}
	var h maphash.Hash
	h.SetSeed(previewSeed)
	for _, e := range entries {
		k, v := wire.Cut(e.Key, previewIDBytes), wire.Cut(e.Value, previewIDBytes)
		h.WriteByte(byte(len(k)))
		h.WriteString(k)
		h.WriteByte(byte(len(v)))
		h.WriteString(v)
	}
	return h.Sum64()
}

// record counts one hit of the value named id.
func (pv *previewState) record(key [2]string, now int64, id uint64, limited bool) {
	r := pv.rules[key]
	if r == nil || now >= r.end {
		r = pv.open(key, now)
	}
	r.requests++
	if limited {
		r.limited++
	}
	h := r.values[id]
	if h == nil {
		if len(r.values) >= previewValues || pv.tracked >= previewBudget {
			r.untracked++
			return
		}
		h = &valueHits{cur: now}
		r.values[id] = h
		pv.tracked++
	}
	if h.cur != now {
		r.closeSecond(h)
		h.cur = now
	}
	h.inCur++
	h.total++
}

func (pv *previewState) clock() int64 { return time.Now().Unix() }

// open starts key's span holding second now, closing the previous one.
func (pv *previewState) open(key [2]string, now int64) *previewRule {
	if pv.rules == nil {
		pv.rules = make(map[[2]string]*previewRule)
	}
	if old := pv.rules[key]; old != nil {
		pv.close(key, old)
	}
	span := cmp.Or(pv.span, int64(DefaultPreviewSpan/time.Second))
	start := now - now%span
	r := &previewRule{start: start, end: start + span, values: make(map[uint64]*valueHits), second: make(map[int]*[2]int64)}
	pv.rules[key] = r
	return r
}

func (pv *previewState) close(key [2]string, r *previewRule) {
	pv.tracked -= len(r.values)
	pv.held += len(r.values)
	pv.closed = append(pv.closed, closedSpan{key, r})
	delete(pv.rules, key)
	for pv.held > previewBudget && len(pv.closed) > 1 {
		pv.held -= len(pv.closed[0].r.values)
		pv.closed[0] = closedSpan{}
		pv.closed = pv.closed[1:]
	}
}

// closeSecond adds h's hits in its current second to the Second histogram.
func (r *previewRule) closeSecond(h *valueHits) {
	if h.inCur == 0 {
		return
	}
	b := r.second[wire.Bucket(h.inCur)]
	if b == nil {
		b = new([2]int64)
		r.second[wire.Bucket(h.inCur)] = b
	}
	b[0]++
	b[1] += h.inCur
	h.peak = max(h.peak, h.inCur)
	h.inCur = 0
}

// TakePreview returns every preview span that has ended since its previous
// call, per rule (wire.RulePreview), sorted by domain, rule and start. The
// histograms are built here, off the check path. It is the enforcer's
// subscriber.PreviewSource.
func (e *Engine) TakePreview() []wire.RulePreview {
	st := &e.stats
	st.mu.Lock()
	now := st.pv.clock()
	for key, r := range st.pv.rules {
		if now >= r.end {
			st.pv.close(key, r)
		}
	}
	closed := st.pv.closed
	st.pv.closed, st.pv.held = nil, 0
	st.mu.Unlock()

	out := make([]wire.RulePreview, 0, len(closed))
	oldest := now - int64(previewMaxAge/time.Second)
	for _, c := range closed {
		if c.r.end > oldest {
			out = append(out, c.r.report(c.key))
		}
	}
	slices.SortFunc(out, func(a, b wire.RulePreview) int {
		return cmp.Or(strings.Compare(a.Domain, b.Domain), strings.Compare(a.Rule, b.Rule), cmp.Compare(a.T, b.T))
	})
	return out
}

// report builds the span's histograms; r is no longer shared.
func (r *previewRule) report(key [2]string) wire.RulePreview {
	peak, span := map[int]*[2]int64{}, map[int]*[2]int64{}
	add := func(m map[int]*[2]int64, c int64) {
		b := m[wire.Bucket(c)]
		if b == nil {
			b = new([2]int64)
			m[wire.Bucket(c)] = b
		}
		b[0]++
		b[1] += c
	}
	for _, h := range r.values {
		r.closeSecond(h)
		add(peak, h.peak)
		add(span, h.total)
	}
	return wire.RulePreview{Domain: key[0], Rule: key[1], T: r.start, SpanS: r.end - r.start,
		Requests: r.requests, Limited: r.limited, Untracked: r.untracked,
		Second: histogram(r.second), Peak: histogram(peak), Span: histogram(span)}
}

func histogram(m map[int]*[2]int64) wire.Histogram {
	h := make(wire.Histogram, 0, len(m))
	for b, v := range m {
		h = append(h, wire.HistBucket{int64(b), v[0], v[1]})
	}
	slices.SortFunc(h, func(a, b wire.HistBucket) int { return cmp.Compare(a[0], b[0]) })
	return h
}
