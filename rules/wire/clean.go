package wire

import (
	"cmp"
	"errors"
	"fmt"
	"strings"
)

// What the console takes from a node's stats report or quota batch is
// decided row by row: one row Postgres could not store, or that names a
// rule the node was never sent, must not cost the rest of the message (a
// refused quota batch is resent forever; a refused stats report hides the
// node's traffic). Stats.Clean and Quota.Clean make every row storable
// (values through Value, the one cleaning both sides use) and drop the rows
// that are malformed or not in the node's ruleset; only a malformed message
// as a whole (its envelope: interval, epoch, seq, sizes) is refused.

// Reasons a row is dropped, as metric labels.
const (
	// DropInvalid: the row breaks a bound (an empty, too long or non-text
	// name, a negative or too large count, a bad unit or period), or
	// repeats a row of the same message.
	DropInvalid = "invalid"
	// DropUnknownRule: no version sent to the node has the row's domain
	// and rule (for quota usage: as a quota of the row's unit).
	DropUnknownRule = "unknown_rule"
	// DropOverLimit: quota usage counting more hits than its limit, or a
	// limit above the quota's requests_per_unit.
	DropOverLimit = "over_limit"
)

// MaxNameBytes bounds a domain or rule name in a stats report.
const MaxNameBytes = 256

// MaxStatsCount bounds one count of one rule in one report: 2^40 (a
// trillion) per report keeps a 15-minute sum over a thousand nodes far from
// overflowing int64.
const MaxStatsCount = 1 << 40

// Cleaning is what Clean did to a message.
type Cleaning struct {
	// Dropped counts the rows dropped, by reason (nil when none was).
	Dropped map[string]int
	// Cleaned counts the values Value rewrote.
	Cleaned int
}

func (c *Cleaning) drop(reason string) {
	if c.Dropped == nil {
		c.Dropped = make(map[string]int, 1)
	}
	c.Dropped[reason]++
}

// Total returns how many rows were dropped.
func (c Cleaning) Total() int {
	n := 0
	for _, k := range c.Dropped {
		n += k
	}
	return n
}

// Clean checks a stats report against the catalogs of the versions sent to
// its node, in place: the error says the message as a whole is malformed;
// otherwise every rule row and preview left passes Validate and names a
// rule of one of cs. It rewrites each top value through Value (and keeps
// the top values whose counts are within 0..limited, at most MaxTopValues)
// and drops the rows that are invalid, repeated or unknown.
func (s *Stats) Clean(cs ...*Catalog) (Cleaning, error) {
	var cl Cleaning
	if err := s.checkEnvelope(); err != nil {
		return cl, err
	}
	kept := s.Rules[:0]
	ordered := true // rows in strictly increasing (domain, rule) order, as nodes send them
	for i := range s.Rules {
		r := s.Rules[i]
		switch {
		case checkStatsRow(&r, &cl) != nil:
			cl.drop(DropInvalid)
			continue
		case !hasRule(cs, r.Domain, r.Rule):
			cl.drop(DropUnknownRule)
			continue
		}
		if n := len(kept); n > 0 && compareRule(kept[n-1], r) >= 0 {
			ordered = false
		}
		kept = append(kept, r)
	}
	if !ordered {
		seen := make(map[[2]string]bool, len(kept))
		once := kept[:0]
		for _, r := range kept {
			k := [2]string{r.Domain, r.Rule}
			if seen[k] {
				cl.drop(DropInvalid)
				continue
			}
			seen[k] = true
			once = append(once, r)
		}
		kept = once
	}
	clear(s.Rules[len(kept):])
	s.Rules = kept

	pv := s.Preview[:0]
	for i := range s.Preview {
		p := s.Preview[i]
		switch {
		// Nodes start spans at multiples of their length: an unaligned
		// span is made up (and would multiply the spans kept per rule).
		case checkName(p.Domain) != nil || checkName(p.Rule) != nil || p.validate(maxPreviewCount) != nil || p.T%p.SpanS != 0:
			cl.drop(DropInvalid)
			continue
		case !hasRule(cs, p.Domain, p.Rule):
			cl.drop(DropUnknownRule)
			continue
		}
		pv = append(pv, p)
	}
	clear(s.Preview[len(pv):])
	s.Preview = pv
	return cl, nil
}

func compareRule(a, b RuleStats) int {
	return cmp.Or(strings.Compare(a.Domain, b.Domain), strings.Compare(a.Rule, b.Rule))
}

// checkStatsRow checks one rule row, cleaning its top values in place.
func checkStatsRow(r *RuleStats, cl *Cleaning) error {
	if err := checkName(r.Domain); err != nil {
		return err
	}
	if err := checkName(r.Rule); err != nil {
		return err
	}
	for _, n := range []int64{r.Allowed, r.Limited, r.ShadowLimited, r.StoreErrors} {
		if n < 0 || n > MaxStatsCount {
			return fmt.Errorf("count %d is not within 0..%d", n, int64(MaxStatsCount))
		}
	}
	top := r.TopLimited[:0]
	for _, v := range r.TopLimited {
		if len(top) == MaxTopValues {
			break // the node sends the most limited first
		}
		if v.Count < 0 || v.Count > r.Limited {
			continue
		}
		if c := Value(v.Value); c != v.Value {
			v.Value = c
			cl.Cleaned++
		}
		top = append(top, v)
	}
	clear(r.TopLimited[len(top):])
	r.TopLimited = top
	if len(top) == 0 {
		r.TopLimited = nil
	}
	return nil
}

// checkName checks a domain or rule name of a stats report.
func checkName(s string) error {
	switch {
	case s == "":
		return errors.New("name is empty")
	case len(s) > MaxNameBytes:
		return fmt.Errorf("name is over %d bytes", MaxNameBytes)
	case !isText(s):
		return errors.New("name must be valid UTF-8 without NUL")
	}
	return nil
}

// Clean checks a quota batch against the catalogs of the versions sent to
// its node, in place: the error says the batch as a whole is malformed (it
// is not stored, nor acknowledged); otherwise every usage entry left passes
// Validate and counts a quota of one of cs, with a limit no higher than
// that quota's largest requests_per_unit. It rewrites each value through
// Value and drops the entries that are invalid, repeated, unknown or over
// their limit; the batch is still applied (and acknowledged) without them.
func (q *Quota) Clean(cs ...*Catalog) (Cleaning, error) {
	var cl Cleaning
	if err := q.checkEnvelope(); err != nil {
		return cl, err
	}
	var seen map[quotaKey]bool
	kept := q.Usage[:0]
	for i := range q.Usage {
		u := q.Usage[i]
		if c := Value(u.Value); c != u.Value {
			u.Value = c
			cl.Cleaned++
		}
		if err := u.check(); err != nil {
			if u.Hits > u.Limit && u.Limit >= 0 && u.Hits > 0 {
				cl.drop(DropOverLimit)
			} else {
				cl.drop(DropInvalid)
			}
			continue
		}
		limit, ok := quotaLimit(cs, u.Domain, u.Rule, u.Unit)
		switch {
		case !ok:
			cl.drop(DropUnknownRule)
			continue
		case u.Limit > limit:
			cl.drop(DropOverLimit)
			continue
		}
		// A node sends each (quota, value, period) once per batch; a
		// repeat would add hits above the limit again.
		if seen == nil {
			seen = make(map[quotaKey]bool, len(q.Usage))
		}
		k := quotaKey{u.Domain, u.Rule, u.Unit, u.Value, u.Start}
		if seen[k] {
			cl.drop(DropInvalid)
			continue
		}
		seen[k] = true
		kept = append(kept, u)
	}
	clear(q.Usage[len(kept):])
	q.Usage = kept
	return cl, nil
}

type quotaKey struct {
	domain, rule, unit, value string
	start                     int64
}
