package wire

import (
	"fmt"

	"github.com/sluicehq/sluice/rules"
)

// Compile verifies snap's checksum and compiles its domains into one
// ruleset, as a node applies it. Each domain's YAML must declare the domain
// it is published as.
func Compile(snap *Snapshot) (*rules.Set, error) {
	if got := Checksum(snap.Domains); got != snap.Checksum {
		return nil, fmt.Errorf("checksum mismatch: computed %s, snapshot says %q", got, snap.Checksum)
	}
	domains := make([]*rules.Domain, 0, len(snap.Domains))
	seen := make(map[string]bool, len(snap.Domains))
	for _, dc := range snap.Domains {
		if seen[dc.Name] {
			return nil, fmt.Errorf("domain %q appears twice", dc.Name)
		}
		seen[dc.Name] = true
		d, err := rules.Parse(dc.Name+".yaml", []byte(dc.YAML))
		if err != nil {
			return nil, fmt.Errorf("domain %q: %w", dc.Name, err)
		}
		if d.Name != dc.Name {
			return nil, fmt.Errorf("domain %q: yaml declares domain %q", dc.Name, d.Name)
		}
		domains = append(domains, d)
	}
	set, err := rules.Compile(domains)
	if err != nil {
		return nil, fmt.Errorf("compile ruleset: %w", err)
	}
	return set, nil
}

// Catalog is what a node running one ruleset may report: the rules its
// stats may name and the quotas its usage may count. The console checks
// every node message against the catalogs of the versions it sent that
// node (Stats.Clean, Quota.Clean). It is immutable once made.
type Catalog struct {
	rules  map[[2]string]bool  // (domain, rule name) stats may name
	quotas map[[3]string]int64 // (domain, rule name, unit) → the largest requests_per_unit
}

// NewCatalog returns the catalog of set (an empty one for nil): every
// limit's name in its domain, plus rules.OverrideName in each domain (a
// limit asked for at request time), and every quota.
func NewCatalog(set *rules.Set) *Catalog {
	c := &Catalog{rules: make(map[[2]string]bool), quotas: make(map[[3]string]int64)}
	for _, d := range set.Domains() {
		c.rules[[2]string{d, rules.OverrideName}] = true
	}
	for l := range set.Limits() {
		c.rules[[2]string{l.Domain, l.Name}] = true
		if l.Quota() {
			k := [3]string{l.Domain, l.Name, string(l.Unit)}
			c.quotas[k] = max(c.quotas[k], int64(l.RequestsPerUnit))
		}
	}
	return c
}

// Len returns how many rules the catalog holds.
func (c *Catalog) Len() int {
	if c == nil {
		return 0
	}
	return len(c.rules)
}

// hasRule reports whether any of cs lets stats name rule of domain.
func hasRule(cs []*Catalog, domain, rule string) bool {
	k := [2]string{domain, rule}
	for _, c := range cs {
		if c != nil && c.rules[k] {
			return true
		}
	}
	return false
}

// quotaLimit returns the largest requests_per_unit of the quota named by
// domain, rule and unit in any of cs (ok false when none has it).
func quotaLimit(cs []*Catalog, domain, rule, unit string) (limit int64, ok bool) {
	k := [3]string{domain, rule, unit}
	for _, c := range cs {
		if c == nil {
			continue
		}
		if l, found := c.quotas[k]; found {
			limit, ok = max(limit, l), true
		}
	}
	return limit, ok
}
