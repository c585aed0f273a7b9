package rules

// How a domain differs between two rulesets (DomainDiff.Change).
const (
	DomainDiffAdded   = "added"
	DomainDiffRemoved = "removed"
	DomainDiffChanged = "changed"
)

// DomainDiff is how one domain differs between two rulesets: the text (a
// unified diff of its YAML and how many lines it adds and removes) and the
// meaning (the structured changes, see Diff). It is the one shape of a
// ruleset diff: the console's API and "sluice rules diff -json" both emit
// it.
type DomainDiff struct {
	Name    string `json:"name"`
	Change  string `json:"change"`  // added, removed or changed
	Unified string `json:"unified"` // unified diff of the YAML (see UnifiedDiff)
	Added   int    `json:"added"`   // lines added
	Removed int    `json:"removed"` // lines removed
	// Changes are the domain's structured changes: the domain and its
	// limits added, removed or changed. Never nil.
	Changes []Change `json:"changes"`
	// Error is set when one side's YAML no longer parses, so Changes could
	// not be computed (Unified still shows the text).
	Error string `json:"error,omitempty"`
}

// DiffRulesets compares two rulesets, each given as domain name → YAML, and
// returns the domains whose YAML differs, by name. A domain whose text
// changed but whose meaning did not (a comment, a default written out) is
// listed with no Changes.
func DiffRulesets(old, new map[string]string) []DomainDiff {
	out := []DomainDiff{}
	for _, n := range unionNames(old, new) {
		a, inA := old[n]
		b, inB := new[n]
		if inA && inB && a == b {
			continue
		}
		d := DomainDiff{Name: n, Change: DomainDiffChanged, Changes: []Change{}}
		d.Unified, d.Added, d.Removed = unifiedDiff(n+".yaml", a, b)
		switch {
		case !inA:
			d.Change = DomainDiffAdded
		case !inB:
			d.Change = DomainDiffRemoved
		}
		var before, after []*Domain
		for _, side := range []struct {
			src     string
			present bool
			into    *[]*Domain
		}{{a, inA, &before}, {b, inB, &after}} {
			if !side.present {
				continue
			}
			dom, err := Parse(n+".yaml", []byte(side.src))
			if err != nil {
				d.Error = "the rules no longer parse: " + err.Error()
				break
			}
			*side.into = append(*side.into, dom)
		}
		if d.Error == "" {
			if changes := Diff(before, after); changes != nil {
				d.Changes = changes
			}
		}
		out = append(out, d)
	}
	return out
}
