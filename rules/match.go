package rules

import (
	"cmp"
	"fmt"
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
	Name            string
	Unit            Unit // "" when Unlimited
	RequestsPerUnit uint32
	Burst           uint32 // bucket capacity; RequestsPerUnit unless set
	Algorithm       Algorithm
	Unlimited       bool
	ShadowMode      bool
	DetailedMetric  bool
	FailureMode     FailureMode
	Period          time.Duration // Unit.Period(); 0 when Unlimited
	// Replaces names the limits this one replaces when both apply to one
	// request; the engine drops those.
	Replaces []string
}

// Set is a compiled, immutable ruleset: every domain's descriptor tree, ready
// for matching. It is safe for concurrent use without locks.
type Set struct {
	domains map[string]*node // root of each domain's tree
	names   []string         // sorted domain names
	limits  int
}

// node is a descriptor in the compiled tree.
type node struct {
	limit    *Limit
	children map[string]*keyNode // by entry key; nil for a leaf
}

// keyNode holds the descriptors of one key at one level.
type keyNode struct {
	exact    map[string]*node // by value, wildcards included so "a*" matches itself exactly
	prefixes []prefix         // wildcard values, longest prefix first
	any      *node            // the descriptor without a value
}

type prefix struct {
	prefix string
	node   *node
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

	s := &Set{domains: make(map[string]*node, len(domains))}
	for _, d := range domains {
		s.domains[d.Name] = &node{children: s.level(d.Name, d.Descriptors, "")}
		s.names = append(s.names, d.Name)
	}
	slices.Sort(s.names)
	return s, nil
}

// level compiles one level of descriptors; parentName is the Lyft-style name
// of the descriptor holding them ("" at the top).
func (s *Set) level(domain string, ds []Descriptor, parentName string) map[string]*keyNode {
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
		n := &node{children: s.level(domain, d.Descriptors, name)}
		if d.RateLimit != nil {
			n.limit = newLimit(domain, name, d)
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
		if p, ok := strings.CutSuffix(d.Value, "*"); ok {
			k.prefixes = append(k.prefixes, prefix{p, n})
		}
	}
	for _, k := range keys {
		slices.SortFunc(k.prefixes, func(a, b prefix) int { return cmp.Compare(len(b.prefix), len(a.prefix)) })
	}
	return keys
}

func newLimit(domain, name string, d *Descriptor) *Limit {
	rl := d.RateLimit
	l := &Limit{
		Domain:          domain,
		Name:            cmp.Or(rl.Name, name),
		RequestsPerUnit: rl.RequestsPerUnit,
		Burst:           cmp.Or(d.Burst, rl.RequestsPerUnit),
		Algorithm:       cmp.Or(d.Algorithm, TokenBucket),
		Unlimited:       rl.Unlimited,
		ShadowMode:      d.ShadowMode,
		DetailedMetric:  d.DetailedMetric,
		FailureMode:     cmp.Or(d.FailureMode, FailOpen),
		Replaces:        slices.Clone(rl.Replaces),
	}
	if !rl.Unlimited {
		l.Unit = rl.Unit
		l.Period = rl.Unit.Period()
	}
	return l
}

// Match returns the limit that applies to one request descriptor (its
// ordered entries) in domain, or nil when none does. It follows
// envoyproxy/ratelimit: entries are matched level by level, each against the
// exact value, else the longest matching "prefix*" value, else the
// descriptor without a value; the walk stops at a level with no match or a
// descriptor with no children, and a limit applies only if the last entry
// lands on a descriptor that has one. An unlimited limit is returned with
// Unlimited set. Match does not allocate.
func (s *Set) Match(domain string, entries []Entry) *Limit {
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
			return n.limit
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
	for _, p := range k.prefixes {
		if strings.HasPrefix(value, p.prefix) {
			return p.node
		}
	}
	return k.any
}

// Domains returns the names of the set's domains, sorted.
func (s *Set) Domains() []string {
	if s == nil {
		return nil
	}
	return slices.Clone(s.names)
}

// Len returns the number of limits in the set, unlimited ones included.
func (s *Set) Len() int {
	if s == nil {
		return 0
	}
	return s.limits
}
