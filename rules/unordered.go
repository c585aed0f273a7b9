package rules

import (
	"cmp"
	"slices"
)

// maxUnorderedSteps bounds MatchUnordered's search: the descriptors it may
// try before it gives up (and matches nothing). Real trees take a handful.
const maxUnorderedSteps = 4096

// MatchUnordered is Match for entries that come as a set of distinct keys
// with no order, such as the key/value map of an Envoy RLQS bucket id. It
// finds an order in which domain's descriptor tree nests all of their keys
// and lands on a limit, and returns the entries in that order with the
// limit Match(domain, ordered) gives them, so the entries count on the
// same counter as an RLS descriptor of those entries in that order.
//
// The search is depth first from the top level; at each level the
// remaining entries are tried in key order (ties, which distinct keys do
// not have, by value), each matched against the level's descriptors of its
// key as Match matches (exact value, then wildcard, then the descriptor
// without a value). So when the tree nests the same keys in several orders
// that all end on a limit, the one that is first in key order level by
// level wins. Without any (unknown domain, a key no level has, a path
// ending on a descriptor without a limit, more entries than MaxDepth, or
// the search over maxUnorderedSteps descriptors) it returns the entries in
// key order and nil. The returned slice is new; entries is not modified.
func (s *Set) MatchUnordered(domain string, entries []Entry) ([]Entry, *Limit) {
	sorted := slices.Clone(entries)
	slices.SortFunc(sorted, func(a, b Entry) int {
		return cmp.Or(cmp.Compare(a.Key, b.Key), cmp.Compare(a.Value, b.Value))
	})
	if s == nil || len(sorted) == 0 || len(sorted) > MaxDepth {
		return sorted, nil
	}
	root := s.domains[domain]
	if root == nil {
		return sorted, nil
	}
	var (
		order = make([]Entry, 0, len(sorted))
		used  = make([]bool, len(sorted))
		steps = 0
		found *Limit
	)
	var walk func(n *node) bool
	walk = func(n *node) bool {
		if len(order) == len(sorted) {
			found = s.Match(domain, order)
			return found != nil
		}
		for i, e := range sorted {
			if used[i] {
				continue
			}
			k := n.children[e.Key]
			if k == nil {
				continue
			}
			c := k.lookup(e.Value)
			if c == nil {
				continue
			}
			if steps++; steps > maxUnorderedSteps {
				return false
			}
			used[i] = true
			order = append(order, e)
			if walk(c) {
				return true
			}
			used[i] = false
			order = order[:len(order)-1]
		}
		return false
	}
	if walk(root) {
		return order, found
	}
	return sorted, nil
}
