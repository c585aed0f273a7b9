package stats

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/rules/wire"
)

// A value's 429 history. Nodes name, in each report, the exact count of
// every value each rule limited (wire.RuleStats.Values, up to
// wire.MaxValues per rule and second). Each replica sums its own nodes'
// counts per rule and minute in a sketch of sketchValues values (weighted
// Space-Saving: a value that arrives when the sketch is full takes the
// place of the least counted one, whose count it inherits as its error),
// and once the minute is over writes the ValuesPerMinute most limited of
// them to Postgres (store.AddValueMinutes), as it writes the rule's
// rollup.
//
// A written figure is the value's count less its error: never more than
// the truth. It is exact when the replica's write was not lossy (every
// limited request of the rule-minute went to a value it wrote), or when
// the value was tracked from its first request on (error 0) and no node
// left requests of the rule-minute unnamed. The write says which (Sure);
// Postgres keeps, per rule-minute, how many writes were lossy, so a
// figure summed over replicas is exact when every lossy write counted it
// completely. A value not written in a lossy rule-minute may have been
// limited there: it shows as a lower bound of 0.
//
// Memory, per replica: a sketch holds at most sketchValues values of the
// current minute per rule, and at most maxSketchValues values over all
// rules (about 100 bytes each with short values, 26 MB in all;
// BenchmarkValueSketch);
// the sketch of a minute is reduced to its written rows when the minute
// ends.

// Bounds of the per-value rollups.
const (
	// ValuesPerMinute is how many values of one rule a replica writes per
	// minute: the most limited ones.
	ValuesPerMinute = 1000
	// sketchValues is how many values of one rule a replica tracks in one
	// minute.
	sketchValues = 4096
	// maxSketchValues bounds the values tracked over every rule's sketch:
	// when it is reached, a sketch takes new values only in place of its
	// least counted ones.
	maxSketchValues = 1 << 18
	// maxPendingValueRows bounds the value rows waiting to be written
	// while Postgres is unreachable; older writes are dropped beyond it.
	maxPendingValueRows = 1 << 20
	// DefaultValueRetention is how long per-value rollups are kept.
	DefaultValueRetention = 48 * time.Hour
	// MaxValueRange bounds a value history query's range.
	MaxValueRange = 7 * 24 * time.Hour
	// recentValuesSince is how far back the autocomplete looks for
	// limited values.
	recentValuesSince = 24 * time.Hour
)

// sketchEntry is one tracked value: count is an upper bound of its
// limited requests in the minute, count-err a lower bound.
type sketchEntry struct {
	value      string
	count, err int64
}

// valueSketch is one rule's limited values in one minute: a min-heap by
// count, indexed by value.
type valueSketch struct {
	heap  []sketchEntry
	index map[string]int
	// unnamed counts the limited requests nodes reported without a value.
	unnamed int64
}

// add counts w limited requests of value v; grow says whether the sketch
// may take one more value. It reports whether the sketch grew.
func (s *valueSketch) add(v string, w int64, grow bool) bool {
	if i, ok := s.index[v]; ok {
		s.heap[i].count += w
		s.down(i)
		return false
	}
	if s.index == nil {
		s.index = make(map[string]int)
	}
	if len(s.heap) < sketchValues && grow {
		s.heap = append(s.heap, sketchEntry{value: v, count: w})
		s.index[v] = len(s.heap) - 1
		s.up(len(s.heap) - 1)
		return true
	}
	if len(s.heap) == 0 {
		return false // no room at all: the requests stay unattributed
	}
	// Space-Saving: v takes the least counted value's place and count.
	root := &s.heap[0]
	delete(s.index, root.value)
	m := root.count
	*root = sketchEntry{value: v, count: m + w, err: m}
	s.index[v] = 0
	s.down(0)
	return false
}

func (s *valueSketch) less(i, j int) bool { return s.heap[i].count < s.heap[j].count }

func (s *valueSketch) swap(i, j int) {
	s.heap[i], s.heap[j] = s.heap[j], s.heap[i]
	s.index[s.heap[i].value] = i
	s.index[s.heap[j].value] = j
}

func (s *valueSketch) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !s.less(i, p) {
			return
		}
		s.swap(i, p)
		i = p
	}
}

func (s *valueSketch) down(i int) {
	for {
		l := 2*i + 1
		if l >= len(s.heap) {
			return
		}
		c := l
		if r := l + 1; r < len(s.heap) && s.less(r, l) {
			c = r
		}
		if !s.less(c, i) {
			return
		}
		s.swap(i, c)
		i = c
	}
}

// write reduces the sketch of rule k's minute, in which the replica's
// nodes limited limited requests, to what the replica writes: its
// ValuesPerMinute most limited values by lower bound, and how many
// limited requests none of them accounts for.
func (s *valueSketch) write(minute int64, k store.RuleKey, limited int64) store.ValueWrite {
	entries := s.heap
	slices.SortFunc(entries, func(x, y sketchEntry) int {
		return cmp.Or(cmp.Compare(y.count-y.err, x.count-x.err), strings.Compare(x.value, y.value))
	})
	entries = entries[:min(len(entries), ValuesPerMinute)]
	w := store.ValueWrite{Minute: time.Unix(minute, 0).UTC(), RuleKey: k, Values: make([]store.ValueLimited, len(entries))}
	kept := int64(0)
	for i, e := range entries {
		w.Values[i] = store.ValueLimited{Value: e.value, Limited: e.count - e.err}
		kept += e.count - e.err
	}
	if w.Untracked = max(limited-kept, 0); w.Untracked > 0 && s.unnamed == 0 {
		for i, e := range entries {
			w.Values[i].Sure = e.err == 0
		}
	}
	return w
}

// addValuesLocked adds a report's named values of rule s to the sketch of
// its minute; caller holds a.mu and has made s.own current (own).
func (a *Aggregator) addValuesLocked(s *series, r *wire.RuleStats) {
	if r.Limited == 0 {
		return
	}
	o := &s.own
	if o.minV == nil {
		o.minV = &valueSketch{}
	}
	named := int64(0)
	for _, v := range r.Values {
		named += v.Count
		if o.minV.add(v.Value, v.Count, a.sketched < maxSketchValues) {
			a.sketched++
		}
	}
	o.minV.unnamed += r.Limited - named
}

// spillValues turns rule k's sketch of minute into a pending write;
// caller holds a.mu.
func (a *Aggregator) spillValues(minute int64, k store.RuleKey, limited int64, sk *valueSketch) {
	if sk == nil {
		return
	}
	a.sketched -= len(sk.heap)
	if limited <= 0 {
		return
	}
	a.queueValueWriteLocked(sk.write(minute, k, limited))
}

// queueValueWriteLocked adds w to the writes not yet in Postgres, dropping
// the oldest beyond maxPendingValueRows; caller holds a.mu.
func (a *Aggregator) queueValueWriteLocked(w store.ValueWrite) {
	a.valueWrites = append(a.valueWrites, w)
	a.valueRows += len(w.Values)
	for a.valueRows > maxPendingValueRows && len(a.valueWrites) > 1 {
		a.valueRows -= len(a.valueWrites[0].Values)
		a.valueWrites = a.valueWrites[1:]
	}
}

// flushValues writes the pending per-value writes of closed minutes. A
// rule-minute written twice (a retry meets a new write) waits for the
// next flush, as one statement cannot add to a row twice; what cannot be
// written stays pending while it is within the retention.
func (a *Aggregator) flushValues(ctx context.Context, minuteCutoff int64) error {
	a.mu.Lock()
	var batch, keep []store.ValueWrite
	seen := make(map[minuteKey]bool)
	for _, w := range a.valueWrites {
		mk := minuteKey{w.Minute.Unix(), w.RuleKey}
		if w.Minute.Unix() >= minuteCutoff || seen[mk] {
			keep = append(keep, w)
			continue
		}
		seen[mk] = true
		batch = append(batch, w)
	}
	a.valueWrites = keep
	a.valueRows = 0
	for _, w := range keep {
		a.valueRows += len(w.Values)
	}
	a.mu.Unlock()
	if len(batch) == 0 {
		return nil
	}
	err := a.st.AddValueMinutes(ctx, batch)
	if err == nil {
		return nil
	}
	oldest := a.now().Add(-a.valueRetention)
	a.mu.Lock()
	for _, w := range batch {
		if w.Minute.After(oldest) {
			a.queueValueWriteLocked(w)
		}
	}
	a.mu.Unlock()
	return err
}

// ValuePoint is one value's limited requests under one rule in one minute.
type ValuePoint struct {
	T       int64 `json:"t"`
	Limited int64 `json:"limited"`
	// Complete is false when Limited is only a lower bound.
	Complete bool `json:"complete"`
}

// ValueRule is one rule's points for one value.
type ValueRule struct {
	Rule   string       `json:"rule"`
	Points []ValuePoint `json:"points"`
	// Complete is false when any point's figure is only a lower bound.
	Complete bool `json:"complete"`
}

// ValueHistory is one value's 429s per rule and minute.
type ValueHistory struct {
	Domain string      `json:"domain"`
	Value  string      `json:"value"`
	From   int64       `json:"from"`
	To     int64       `json:"to"`
	Step   int64       `json:"step_s"`
	Rules  []ValueRule `json:"rules"`
}

// ValueHistory returns value's limited requests per rule and minute in
// domain for the minutes that start in [from, to), from the per-value
// rollups (the current minute is written about rollupDelay after it
// ends).
func (a *Aggregator) ValueHistory(ctx context.Context, domain, value string, from, to time.Time) (ValueHistory, error) {
	from = from.Truncate(time.Minute)
	rows, err := a.st.ValueMinutes(ctx, domain, value, from, to)
	if err != nil {
		return ValueHistory{}, err
	}
	h := ValueHistory{Domain: domain, Value: value, From: from.Unix(), To: to.Unix(), Step: 60, Rules: []ValueRule{}}
	for _, r := range rows {
		if n := len(h.Rules); n == 0 || h.Rules[n-1].Rule != r.Rule {
			h.Rules = append(h.Rules, ValueRule{Rule: r.Rule, Points: []ValuePoint{}, Complete: true})
		}
		vr := &h.Rules[len(h.Rules)-1]
		vr.Points = append(vr.Points, ValuePoint{T: r.Minute.Unix(), Limited: r.Limited, Complete: r.Complete})
		vr.Complete = vr.Complete && r.Complete
	}
	return h, nil
}

// RecentValues returns up to limit values of domain that start with
// prefix and were limited in the last 24 hours or use a quota in a current
// period (see store.RecentValues).
func (a *Aggregator) RecentValues(ctx context.Context, domain, prefix string, limit int) ([]store.RecentValue, error) {
	return a.st.RecentValues(ctx, domain, prefix, a.now().Add(-recentValuesSince), limit)
}
