package engine

import (
	"cmp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/rules/wire"
)

// Bounds of the per-rule statistics.
const (
	// topTracked is how many distinct limited values each rule tracks per
	// stats interval (Space-Saving: a value limited more than 1/topTracked
	// of the rule's limited requests is always among them, and a count is
	// over by at most the smallest tracked count).
	topTracked = 64
	// maxValueBytes is how much of a descriptor of several entries
	// valueOf joins before wire.Value shortens it.
	maxValueBytes = wire.MaxValueBytes
)

// ruleStats counts one rule's decisions since the last TakeStats.
type ruleStats struct {
	allowed, limited, shadow, storeErrors int64
	top                                   map[string]int64 // limited values, at most topTracked
}

// stats holds the per-rule counts; the zero value is ready.
type stats struct {
	mu    sync.Mutex
	rules map[[2]string]*ruleStats // by domain, rule name
	pv    previewState             // the impact preview's recorder (preview.go)
}

// count records the outcome of each matched limit of a decided check. A
// limit that counted nothing (it had room, but another limit rejected the
// request) is not recorded, as in the metrics.
func (st *stats) count(req *Request, res *Result) {
	now := time.Now().Unix() // for the preview (preview.go), read outside the lock
	st.mu.Lock()
	defer st.mu.Unlock()
	for i, s := range res.Statuses {
		l := s.Limit
		if l == nil || l.Unlimited {
			continue
		}
		allowed := s.Code == OK && !s.Shadowed && res.Code == OK
		if !allowed && !s.Shadowed && s.Code != OverLimit && !s.StoreFailed {
			continue // it had room, but another limit rejected the request
		}
		key := [2]string{l.Domain, l.Name}
		if key[0] == "" {
			key[0] = req.Domain
		}
		rs := st.rules[key]
		if rs == nil {
			if st.rules == nil {
				st.rules = make(map[[2]string]*ruleStats)
			}
			rs = &ruleStats{}
			st.rules[key] = rs
		}
		st.pv.recordEntries(key, now, req.Descriptors[i].Entries, s.Shadowed || s.Code == OverLimit)
		switch {
		case s.StoreFailed && !s.Local:
			rs.storeErrors++
			continue
		case s.StoreFailed:
			rs.storeErrors++ // and the local limiter's verdict below
		}
		switch {
		case s.Shadowed:
			rs.shadow++
		case s.Code == OverLimit:
			rs.limited++
			rs.addTop(valueOf(req.Descriptors[i].Entries))
		case allowed:
			rs.allowed++
		}
	}
}

// addTop counts one limited value, Space-Saving style: when topTracked
// values are tracked already, the least counted one gives its place (and
// its count, plus one) to v.
func (rs *ruleStats) addTop(v string) {
	if rs.top == nil {
		rs.top = make(map[string]int64)
	}
	if _, ok := rs.top[v]; ok || len(rs.top) < topTracked {
		rs.top[v]++
		return
	}
	minV, minN := "", int64(-1)
	for k, n := range rs.top {
		if minN < 0 || n < minN || (n == minN && k < minV) {
			minV, minN = k, n
		}
	}
	delete(rs.top, minV)
	rs.top[v] = minN + 1
}

// valueOf names a request descriptor in TopLimited: the value of a
// one-entry descriptor, key=value pairs joined by ", " otherwise (cut once
// past maxValueBytes); through wire.Value, so NUL, invalid UTF-8 or a long
// value is never sent as it came.
func valueOf(entries []rules.Entry) string {
	var v string
	if len(entries) == 1 {
		v = entries[0].Value
	} else {
		var b strings.Builder
		for i, e := range entries {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(e.Key)
			b.WriteByte('=')
			b.WriteString(e.Value)
			if b.Len() > maxValueBytes {
				break
			}
		}
		v = b.String()
	}
	return wire.Value(v)
}

// TakeStats returns the decisions counted per rule since its previous call
// (since New, for the first), sorted by domain and rule, with each rule's
// most limited descriptor values (wire.MaxTopValues at most, most first),
// and starts counting afresh. It is the enforcer's subscriber.StatsSource.
//
// Allowed and Limited count the requests a rule admitted and rejected
// (including those the in-process limiter decided during a store outage,
// which also count as StoreErrors), ShadowLimited those a shadow-mode rule
// would have rejected, and StoreErrors those decided by the rule's
// failure_mode because the store could not be asked. A rule that counted
// nothing for a request (another rule rejected it) does not count it.
func (e *Engine) TakeStats() []wire.RuleStats {
	st := &e.stats
	st.mu.Lock()
	taken := st.rules
	st.rules = nil
	st.mu.Unlock()

	out := make([]wire.RuleStats, 0, len(taken))
	for key, rs := range taken {
		r := wire.RuleStats{
			Domain: key[0], Rule: key[1],
			Allowed: rs.allowed, Limited: rs.limited, ShadowLimited: rs.shadow, StoreErrors: rs.storeErrors,
		}
		for v, n := range rs.top {
			r.TopLimited = append(r.TopLimited, wire.ValueCount{Value: v, Count: n})
		}
		slices.SortFunc(r.TopLimited, func(a, b wire.ValueCount) int {
			return cmp.Or(cmp.Compare(b.Count, a.Count), strings.Compare(a.Value, b.Value))
		})
		if len(r.TopLimited) > wire.MaxTopValues {
			r.TopLimited = r.TopLimited[:wire.MaxTopValues]
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b wire.RuleStats) int {
		return cmp.Or(strings.Compare(a.Domain, b.Domain), strings.Compare(a.Rule, b.Rule))
	})
	return out
}
