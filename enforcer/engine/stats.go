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
	// maxTrackedValues bounds the distinct limited values the node tracks
	// over all rules in one stats interval (wire.MaxValues per rule); a
	// value beyond either bound is counted in the rule's Limited without
	// its value. The tracked values hold about 140 bytes each at 16-byte
	// values (9 MB when full; BenchmarkValueSketchMemory), at most about
	// 25 MB at wire.MaxValueBytes.
	maxTrackedValues = 65536
)

// ruleStats counts one rule's decisions since the last TakeStats.
type ruleStats struct {
	allowed, limited, shadow, storeErrors int64
	// values counts each limited value exactly, for at most
	// wire.MaxValues values (and maxTrackedValues over all rules).
	values map[string]int64
}

// stats holds the per-rule counts; the zero value is ready.
type stats struct {
	mu      sync.Mutex
	rules   map[[2]string]*ruleStats // by domain, rule name
	tracked int                      // distinct values in every rule's values
	pv      previewState             // the impact preview's recorder (preview.go)
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
			st.addValue(rs, req.Descriptors[i].Entries)
		case allowed:
			rs.allowed++
		}
	}
}

// addValue counts one limited request of rs by its value, exactly while
// the value is tracked or there is room to track it; caller holds st.mu.
// A value beyond the bounds is left out (its request is still in
// rs.limited), which the console reads as a figure that is only a lower
// bound.
func (st *stats) addValue(rs *ruleStats, entries []rules.Entry) { st.addValueN(rs, entries, 1) }

// addValueN is addValue for n limited requests of one value.
func (st *stats) addValueN(rs *ruleStats, entries []rules.Entry, n int64) {
	v := valueOf(entries)
	if have, ok := rs.values[v]; ok {
		rs.values[v] = have + n
		return
	}
	if len(rs.values) >= wire.MaxValues || st.tracked >= maxTrackedValues {
		return
	}
	if rs.values == nil {
		rs.values = make(map[string]int64)
	}
	rs.values[v] = n
	st.tracked++
}

// valueOf names a descriptor's value where stats (Values, TopLimited) and
// quota usage report it: the value of a one-entry descriptor, key=value
// pairs joined by ", " otherwise; through wire.Value, so NUL, invalid UTF-8
// or a long value is never sent as it came, and distinct descriptors stay
// distinct.
func valueOf(entries []rules.Entry) string {
	if len(entries) == 1 {
		return wire.Value(entries[0].Value)
	}
	var b strings.Builder
	for i, e := range entries {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(e.Key)
		b.WriteByte('=')
		b.WriteString(e.Value)
	}
	return wire.Value(b.String())
}

// TakeStats returns the decisions counted per rule since its previous call
// (since New, for the first), sorted by domain and rule, and starts
// counting afresh. It is the enforcer's subscriber.StatsSource. Each rule
// carries the exact count of every value it limited as far as they were
// tracked (Values, most first; at most wire.MaxValues per rule, and
// maxTrackedValues over all) and the most limited of them (TopLimited, at
// most wire.MaxTopValues).
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
	st.rules, st.tracked = nil, 0
	st.mu.Unlock()

	out := make([]wire.RuleStats, 0, len(taken))
	for key, rs := range taken {
		r := wire.RuleStats{
			Domain: key[0], Rule: key[1],
			Allowed: rs.allowed, Limited: rs.limited, ShadowLimited: rs.shadow, StoreErrors: rs.storeErrors,
		}
		if len(rs.values) > 0 {
			r.Values = make([]wire.ValueCount, 0, len(rs.values))
			for v, n := range rs.values {
				r.Values = append(r.Values, wire.ValueCount{Value: v, Count: n})
			}
			slices.SortFunc(r.Values, func(a, b wire.ValueCount) int {
				return cmp.Or(cmp.Compare(b.Count, a.Count), strings.Compare(a.Value, b.Value))
			})
			r.TopLimited = slices.Clone(r.Values[:min(len(r.Values), wire.MaxTopValues)])
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b wire.RuleStats) int {
		return cmp.Or(strings.Compare(a.Domain, b.Domain), strings.Compare(a.Rule, b.Rule))
	})
	return out
}

// report records a usage report of the requests a client admitted and
// denied for limit l (package rlqs): the denied ones count as limited, by
// the descriptor's value.
func (st *stats) report(domain string, l *rules.Limit, entries []rules.Entry, allowed, limited int64) {
	if l == nil || l.Unlimited {
		return
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	key := [2]string{cmp.Or(l.Domain, domain), l.Name}
	rs := st.rules[key]
	if rs == nil {
		if st.rules == nil {
			st.rules = make(map[[2]string]*ruleStats)
		}
		rs = &ruleStats{}
		st.rules[key] = rs
	}
	rs.allowed += allowed
	rs.limited += limited
	if limited > 0 {
		st.addValueN(rs, entries, limited)
	}
}
