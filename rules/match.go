package rules

import (
	"cmp"
	"fmt"
	"iter"
	"slices"
	"strings"
	"time"
)

// Limit is one rate limit as the enforcer applies it, with every default
// resolved. Limits returned by Match belong to their Set: do not modify them.
type Limit struct {
	Domain string
	// Name is rate_limit.name when set, else the descriptor path in Lyft's
	// style: key or key_value per level, joined by "." (api_key.route_/search).
	// Stats and replaces go by it.
	Name string
	// Named says Name is a configured rate_limit.name. Envoy's RLS answers
	// carry only such a name (current_limit.name), as Lyft's do.
	Named bool
	// Path is the descriptor path leading to this limit, one Level per
	// entry of the request descriptors it matches.
	Path []Level

	Unit Unit // "" when Unlimited
	// RequestsPerUnit 0 rejects every request: see BlocksAll.
	RequestsPerUnit uint32
	Burst           uint32 // bucket capacity; RequestsPerUnit unless set
	Algorithm       Algorithm
	Unlimited       bool
	ShadowMode      bool
	DetailedMetric  bool
	FailureMode     FailureMode
	Period          time.Duration // Unit.Period() times unit_multiplier; 0 when Unlimited
	// Calendar makes fixed_window count in UTC calendar windows (a day from
	// 00:00 UTC, a week from Monday, a month from the 1st, a year from
	// 1 January) rather than in Period-long windows; see Unit.
	Calendar bool
	// Shards is how many store keys the limit's counters are spread over,
	// at least 1; the enforcer splits the limit between them.
	Shards  uint32
	OnLimit OnLimit // Action and Status resolved (Reject, DefaultStatus)
	// Lease lets enforcers serve the limit from local leases.
	Lease bool
	// Async is consistency: async: enforcers count the limit
	// asynchronously (enforcer/engine's async counting).
	Async bool
	// Scope is where the limit holds across regions: ScopeGlobal, or
	// ScopeRegion ("" when the rule does not say).
	Scope Scope
	// Replaces names the limits this one replaces when both apply to one
	// request; the engine drops those.
	Replaces []string
}

// Level is one descriptor on the path to a limit: its key, its value as
// configured ("" for any value, "p*" for a wildcard) and the options that
// change how that level is counted and reported.
type Level struct {
	Key            string
	Value          string
	ValueToMetric  bool
	ShareThreshold bool
}

// OverrideName is the Name of a limit a request asks for at request time
// (Envoy's limit override) when no rule of its domain matched it: its
// decisions are reported under this name.
const OverrideName = "override"

// Quota reports whether l is a quota: a fixed_window counted in UTC
// calendar windows (day, week, month or year), whose admitted hits are
// reported for billing.
func (l *Limit) Quota() bool {
	return l.Calendar && l.Algorithm == FixedWindow && l.Unit.Calendar() && !l.Unlimited
}

// BlocksAll reports whether l rejects every request: a limit of 0
// requests_per_unit, as Lyft configs write block list entries. Such a limit
// is answered without a counter store.
func (l *Limit) BlocksAll() bool {
	return !l.Unlimited && l.RequestsPerUnit == 0
}

// CounterEntries returns the entries the counter key of l should be built
// from, for a request descriptor that matched l: entries itself, except
// that the value of an entry that matched a wildcard with share_threshold
// is replaced by the wildcard ("files/*"), so every value it matches counts
// against one shared counter. When it must change an entry it appends to
// dst[:0], so a caller that passes a buffer does not allocate.
func (l *Limit) CounterEntries(entries, dst []Entry) []Entry {
	shared := false
	for _, lv := range l.Path {
		shared = shared || lv.ShareThreshold
	}
	if !shared || len(entries) != len(l.Path) {
		return entries
	}
	dst = append(dst[:0], entries...)
	for i, lv := range l.Path {
		if lv.ShareThreshold {
			dst[i].Value = lv.Value
		}
	}
	return dst
}

// MetricName returns the name a request descriptor that matched l is
// reported under, in Lyft's style: key or key_value per level, joined by
// ".". A level shows its configured value (the wildcard for a wildcard, none
// for a descriptor without a value), or the request's value when it has
// value_to_metric or is the last level of a detailed_metric limit, unless
// the level has share_threshold: as in Lyft, the values that share a
// counter are reported together, under the wildcard. Without those options
// it is the path name (which Name defaults to).
func (l *Limit) MetricName(entries []Entry) string {
	var b strings.Builder
	for i, p := range l.Path {
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteString(p.Key)
		v := p.Value
		if i < len(entries) && !p.ShareThreshold && (p.ValueToMetric || l.DetailedMetric && i == len(l.Path)-1) {
			v = entries[i].Value
		}
		if v != "" {
			b.WriteByte('_')
			b.WriteString(v)
		}
	}
	return b.String()
}

// Set is a compiled, immutable ruleset: every domain's descriptor tree, ready
// for matching. It is safe for concurrent use without locks.
type Set struct {
	domains  map[string]*node               // root of each domain's tree
	requests map[string][]RequestDescriptor // each domain's request_descriptors
	defaults map[string]Algorithm           // each domain's default_algorithm, when set
	names    []string                       // sorted domain names
	limits   int
}

// node is a descriptor in the compiled tree.
type node struct {
	limit    *Limit
	children map[string]*keyNode // by entry key; nil for a leaf
	// overrides replace limit for some exact request descriptors
	// (overrides.go); nil without any.
	overrides map[string]*overrideStep
}

// keyNode holds the descriptors of one key at one level.
type keyNode struct {
	exact     map[string]*node // by value, wildcards included so "a*" matches itself exactly
	wildcards []wildcard       // wildcard values, most specific first, then in file order
	any       *node            // the descriptor without a value
}

type wildcard struct {
	pattern string
	node    *node
}

// Compile checks domains and builds a Set from them. It applies the same
// rules as Parse, for domains built in code, and refuses a domain name given
// twice. Its error is a *ValidationError whose problems have no positions
// and name their domain as the File.
func Compile(domains []*Domain) (*Set, error) {
	var problems []Problem
	seen := make(map[string]bool, len(domains))
	for i, d := range domains {
		if d == nil {
			problems = append(problems, Problem{Path: index("domains", i), Message: "domain is nil"})
			continue
		}
		for _, p := range validate(d) {
			p.File = d.Name
			problems = append(problems, p)
		}
		if seen[d.Name] {
			problems = append(problems, Problem{File: d.Name, Path: "domain", Message: fmt.Sprintf("domain %s is given twice", quote(d.Name))})
		}
		seen[d.Name] = true
	}
	if len(problems) > 0 {
		return nil, &ValidationError{Problems: problems}
	}

	s := &Set{domains: make(map[string]*node, len(domains)), requests: make(map[string][]RequestDescriptor), defaults: make(map[string]Algorithm)}
	for _, d := range domains {
		if d.DefaultAlgorithm != "" {
			s.defaults[d.Name] = d.DefaultAlgorithm
		}
		s.domains[d.Name] = &node{children: s.level(d.Name, d.DefaultAlgorithm, d.Descriptors, "", nil)}
		s.addOverrides(d.Name, d.Overrides)
		if len(d.RequestDescriptors) > 0 {
			rds := make([]RequestDescriptor, len(d.RequestDescriptors))
			for i, rd := range d.RequestDescriptors {
				rds[i].Entries = slices.Clone(rd.Entries)
			}
			s.requests[d.Name] = rds
		}
		s.names = append(s.names, d.Name)
	}
	slices.Sort(s.names)
	return s, nil
}

// level compiles one level of descriptors. parentName is the Lyft-style name
// of the descriptor holding them ("" at the top); path is the way from the
// root to them; def is the domain's default_algorithm.
func (s *Set) level(domain string, def Algorithm, ds []Descriptor, parentName string, path []Level) map[string]*keyNode {
	if len(ds) == 0 {
		return nil
	}
	keys := make(map[string]*keyNode)
	for i := range ds {
		d := &ds[i]
		k := keys[d.Key]
		if k == nil {
			k = &keyNode{}
			keys[d.Key] = k
		}
		name := pathName(parentName, d)
		// Clip so that siblings never share the backing arrays.
		p := append(path[:len(path):len(path)], Level{Key: d.Key, Value: d.Value, ValueToMetric: d.ValueToMetric, ShareThreshold: d.ShareThreshold})
		n := &node{children: s.level(domain, def, d.Descriptors, name, p)}
		if d.RateLimit != nil {
			n.limit = newLimit(domain, def, name, d, p)
			s.limits++
		}
		if d.Value == "" {
			k.any = n
			continue
		}
		if k.exact == nil {
			k.exact = make(map[string]*node)
		}
		k.exact[d.Value] = n
		if isWildcard(d.Value) {
			k.wildcards = append(k.wildcards, wildcard{d.Value, n})
		}
	}
	for _, k := range keys {
		slices.SortStableFunc(k.wildcards, func(a, b wildcard) int {
			return cmp.Compare(literalLen(b.pattern), literalLen(a.pattern))
		})
	}
	return keys
}

// newLimit resolves d's limit; def is the domain's default_algorithm.
func newLimit(domain string, def Algorithm, name string, d *Descriptor, path []Level) *Limit {
	rl := d.RateLimit
	l := &Limit{
		Domain:          domain,
		Name:            cmp.Or(rl.Name, name),
		Named:           rl.Name != "",
		Path:            slices.Clone(path),
		RequestsPerUnit: rl.RequestsPerUnit,
		Burst:           cmp.Or(d.Burst, rl.RequestsPerUnit),
		Algorithm:       cmp.Or(d.Algorithm, def, TokenBucket),
		Unlimited:       rl.Unlimited,
		ShadowMode:      d.ShadowMode,
		DetailedMetric:  d.DetailedMetric,
		FailureMode:     cmp.Or(d.FailureMode, FailOpen),
		Calendar:        d.Calendar,
		Shards:          max(d.Shards, 1),
		Lease:           d.Lease,
		Async:           d.Consistency == Async,
		Scope:           d.Scope,
		OnLimit:         OnLimit{Action: Reject, Status: DefaultStatus},
		Replaces:        slices.Clone(rl.Replaces),
	}
	if !rl.Unlimited {
		l.Unit = rl.Unit
		l.Period = rl.Unit.Period() * time.Duration(max(rl.UnitMultiplier, 1))
	}
	if ol := d.OnLimit; ol != nil {
		l.OnLimit = OnLimit{Action: cmp.Or(ol.Action, Reject), MaxDelay: ol.MaxDelay, Status: cmp.Or(ol.Status, DefaultStatus)}
	}
	return l
}

// Match returns the limit that applies to one request descriptor (its
// ordered entries) in domain, or nil when none does. It follows
// envoyproxy/ratelimit: entries are matched level by level, each against the
// exact value, else a matching wildcard value (the one with the most
// characters besides "*", then the first in the file), else the descriptor
// without a value; the walk stops at a level with no match or a
// descriptor with no children, and a limit applies only if the last entry
// lands on a descriptor that has one. An unlimited limit is returned with
// Unlimited set. Match does not allocate.
//
// An override (see Override) of exactly these entries replaces the limit.
func (s *Set) Match(domain string, entries []Entry) *Limit {
	n := s.find(domain, entries)
	if n == nil {
		return nil
	}
	if n.overrides != nil {
		return n.overridden(entries)
	}
	return n.limit
}

// find returns the node the last of entries lands on, as Match walks.
func (s *Set) find(domain string, entries []Entry) *node {
	if s == nil || len(entries) == 0 {
		return nil
	}
	n := s.domains[domain]
	if n == nil {
		return nil
	}
	for i, e := range entries {
		k := n.children[e.Key]
		if k == nil {
			return nil
		}
		n = k.lookup(e.Value)
		switch {
		case n == nil:
			return nil
		case i == len(entries)-1:
			return n
		case len(n.children) == 0:
			return nil
		}
	}
	return nil
}

func (k *keyNode) lookup(value string) *node {
	if n, ok := k.exact[value]; ok {
		return n
	}
	for _, w := range k.wildcards {
		if wildcardMatch(w.pattern, value) {
			return w.node
		}
	}
	return k.any
}

// RequestDescriptors returns domain's request_descriptors, which tell
// gateway mode how to build a request's descriptors; nil for an unknown
// domain or one without them. The slice belongs to the set: do not modify it.
func (s *Set) RequestDescriptors(domain string) []RequestDescriptor {
	if s == nil {
		return nil
	}
	return s.requests[domain]
}

// DefaultAlgorithm returns the algorithm of domain's limits that name none:
// its default_algorithm, else TokenBucket. For a limit given at request
// time, such as Envoy's limit override.
func (s *Set) DefaultAlgorithm(domain string) Algorithm {
	if s == nil {
		return TokenBucket
	}
	return cmp.Or(s.defaults[domain], TokenBucket)
}

// Domains returns the names of the set's domains, sorted.
func (s *Set) Domains() []string {
	if s == nil {
		return nil
	}
	return slices.Clone(s.names)
}

// Limits returns every limit of the set, unlimited ones included, domain
// by domain in name order (within a domain in no set order).
func (s *Set) Limits() iter.Seq[*Limit] {
	return func(yield func(*Limit) bool) {
		if s == nil {
			return
		}
		var walk func(n *node) bool
		walk = func(n *node) bool {
			if n.limit != nil && !yield(n.limit) {
				return false
			}
			for _, k := range n.children {
				for _, c := range k.exact {
					if !walk(c) {
						return false
					}
				}
				if k.any != nil && !walk(k.any) {
					return false
				}
			}
			return true
		}
		for _, d := range s.names {
			if !walk(s.domains[d]) {
				return
			}
		}
	}
}

// Len returns the number of limits in the set, unlimited ones included.
func (s *Set) Len() int {
	if s == nil {
		return 0
	}
	return s.limits
}
