package rules

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// ChangeKind says what a Change is about.
type ChangeKind string

// Kinds of change.
const (
	DomainAdded               ChangeKind = "domain_added"
	DomainRemoved             ChangeKind = "domain_removed"
	LimitAdded                ChangeKind = "limit_added"
	LimitRemoved              ChangeKind = "limit_removed"
	LimitChanged              ChangeKind = "limit_changed"
	RequestDescriptorsChanged ChangeKind = "request_descriptors_changed"
	// Overrides (see Override): Path is the overridden entries.
	OverrideAdded   ChangeKind = "override_added"
	OverrideRemoved ChangeKind = "override_removed"
	OverrideChanged ChangeKind = "override_changed"
)

// Change is one difference between two rulesets, for people to review
// before they publish: the console shows them, the CLI prints them.
type Change struct {
	Kind   ChangeKind `json:"kind"`
	Domain string     `json:"domain"`
	// Path identifies a limit by the descriptors leading to it (key, and
	// value as configured); empty for domain-level changes.
	Path []Entry `json:"path,omitempty"`
	// Name is the limit's name: rate_limit.name, else the path name. For a
	// renamed limit it is the new name (the old one is in Fields).
	Name string `json:"name,omitempty"`
	// Fields lists what differs, before → after. An added or removed limit
	// lists every setting it has, defaults resolved, with "" on the side
	// where it does not exist.
	Fields []FieldChange `json:"fields,omitempty"`
}

// FieldChange is one setting's value before and after a change, as text;
// "" means not set (or no such limit).
type FieldChange struct {
	Field  string `json:"field"` // as in the YAML, like rate_limit.requests_per_unit
	Before string `json:"before"`
	After  string `json:"after"`
}

// String formats c on one line for people:
// "api: limit api_key.route_/search changed: rate_limit.requests_per_unit 100 → 200".
func (c Change) String() string {
	var b strings.Builder
	b.WriteString(c.Domain)
	b.WriteString(": ")
	switch c.Kind {
	case DomainAdded, DomainRemoved:
		b.WriteString("domain " + strings.TrimPrefix(string(c.Kind), "domain_"))
		return b.String()
	case RequestDescriptorsChanged:
		b.WriteString("request_descriptors changed")
	case OverrideAdded, OverrideRemoved, OverrideChanged:
		fmt.Fprintf(&b, "override %s %s", FormatEntries(c.Path), strings.TrimPrefix(string(c.Kind), "override_"))
	default:
		fmt.Fprintf(&b, "limit %s %s", c.Name, strings.TrimPrefix(string(c.Kind), "limit_"))
	}
	for i, f := range c.Fields {
		if i == 0 {
			b.WriteString(": ")
		} else {
			b.WriteString(", ")
		}
		switch {
		case c.Kind == LimitAdded || c.Kind == OverrideAdded:
			fmt.Fprintf(&b, "%s %s", f.Field, f.After)
		case c.Kind == LimitRemoved || c.Kind == OverrideRemoved:
			fmt.Fprintf(&b, "%s %s", f.Field, f.Before)
		default:
			fmt.Fprintf(&b, "%s %s → %s", f.Field, orNone(f.Before), orNone(f.After))
		}
	}
	return b.String()
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

// Diff lists the changes from the domains old to the domains new: domains
// added and removed (followed by their limits as added or removed), limits
// added, removed and changed (a limit is the same limit when its descriptor
// path is), and request_descriptors changes. Settings are compared with
// defaults resolved, so writing out a default is no change. The order is
// stable: by domain name, then domain-level changes, then limits by path.
// Nil domains are skipped; a name given twice counts once, the last one.
func Diff(old, new []*Domain) []Change {
	before, after := byName(old), byName(new)
	var changes []Change
	for _, name := range unionNames(before, after) {
		a, b := before[name], after[name]
		switch {
		case a == nil:
			changes = append(changes, Change{Kind: DomainAdded, Domain: name})
		case b == nil:
			changes = append(changes, Change{Kind: DomainRemoved, Domain: name})
		default:
			if fs := requestDescriptorChanges(a.RequestDescriptors, b.RequestDescriptors); len(fs) > 0 {
				changes = append(changes, Change{Kind: RequestDescriptorsChanged, Domain: name, Fields: fs})
			}
		}
		changes = append(changes, limitChanges(name, limitsOf(a), limitsOf(b))...)
		changes = append(changes, overrideChanges(name, a, b)...)
	}
	return changes
}

// overrideChanges lists the overrides added, removed and changed from a to
// b (either may be nil), in the order of b's, then a's removed ones.
func overrideChanges(domain string, a, b *Domain) []Change {
	var before, after []Override
	if a != nil {
		before = a.Overrides
	}
	if b != nil {
		after = b.Overrides
	}
	rate := func(o *Override) []string {
		if o == nil {
			return []string{"", ""}
		}
		return []string{string(o.Unit), strconv.FormatUint(uint64(o.RequestsPerUnit), 10)}
	}
	fields := func(x, y *Override) []FieldChange {
		bx, by := rate(x), rate(y)
		var fs []FieldChange
		for i, f := range []string{"rate_limit.unit", "rate_limit.requests_per_unit"} {
			if bx[i] != by[i] {
				fs = append(fs, FieldChange{Field: f, Before: bx[i], After: by[i]})
			}
		}
		return fs
	}
	old := make(map[string]*Override, len(before))
	for i := range before {
		old[entriesKey(before[i].Entries)] = &before[i]
	}
	var changes []Change
	seen := make(map[string]bool, len(after))
	for i := range after {
		o := &after[i]
		k := entriesKey(o.Entries)
		seen[k] = true
		switch prev := old[k]; {
		case prev == nil:
			changes = append(changes, Change{Kind: OverrideAdded, Domain: domain, Path: o.Entries, Fields: fields(nil, o)})
		default:
			if fs := fields(prev, o); len(fs) > 0 {
				changes = append(changes, Change{Kind: OverrideChanged, Domain: domain, Path: o.Entries, Fields: fs})
			}
		}
	}
	for i := range before {
		if o := &before[i]; !seen[entriesKey(o.Entries)] {
			changes = append(changes, Change{Kind: OverrideRemoved, Domain: domain, Path: o.Entries, Fields: fields(o, nil)})
		}
	}
	return changes
}

// unionNames lists the keys of a and b, sorted, each once.
func unionNames[A, B any](a map[string]A, b map[string]B) []string {
	names := make([]string, 0, len(a)+len(b))
	for n := range a {
		names = append(names, n)
	}
	for n := range b {
		if _, ok := a[n]; !ok {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	return names
}

func byName(domains []*Domain) map[string]*Domain {
	m := make(map[string]*Domain, len(domains))
	for _, d := range domains {
		if d != nil {
			m[d.Name] = d
		}
	}
	return m
}

// limitsOf returns d's limits, resolved, by path.
func limitsOf(d *Domain) map[string]*Limit {
	limits := map[string]*Limit{}
	if d == nil {
		return limits
	}
	def := d.DefaultAlgorithm
	var walk func(ds []Descriptor, parentName string, path []Level, depth int)
	walk = func(ds []Descriptor, parentName string, path []Level, depth int) {
		if depth > MaxDepth {
			return // only an invalid domain nests deeper, maybe without end
		}
		for i := range ds {
			d := &ds[i]
			name := pathName(parentName, d)
			p := append(path[:len(path):len(path)], Level{Key: d.Key, Value: d.Value, ValueToMetric: d.ValueToMetric, ShareThreshold: d.ShareThreshold})
			if d.RateLimit != nil {
				l := newLimit("", def, name, d, p)
				limits[pathKey(l.Path)] = l
			}
			walk(d.Descriptors, name, p, depth+1)
		}
	}
	walk(d.Descriptors, "", nil, 1)
	return limits
}

// pathKey identifies a path without ambiguity, whatever keys and values
// contain.
func pathKey(path []Level) string {
	var b strings.Builder
	for _, l := range path {
		b.WriteString(strconv.Quote(l.Key))
		b.WriteString(strconv.Quote(l.Value))
	}
	return b.String()
}

func limitChanges(domain string, before, after map[string]*Limit) []Change {
	var changes []Change
	for k, b := range before {
		if a, ok := after[k]; !ok {
			changes = append(changes, limitChange(domain, LimitRemoved, b, b, nil))
		} else if fs := fieldChanges(limitFields(b), limitFields(a)); len(fs) > 0 {
			changes = append(changes, limitChange(domain, LimitChanged, a, b, a))
		}
	}
	for k, a := range after {
		if _, ok := before[k]; !ok {
			changes = append(changes, limitChange(domain, LimitAdded, a, nil, a))
		}
	}
	slices.SortFunc(changes, func(x, y Change) int { return comparePaths(x.Path, y.Path) })
	return changes
}

func limitChange(domain string, kind ChangeKind, l, before, after *Limit) Change {
	path := make([]Entry, len(l.Path))
	for i, lv := range l.Path {
		path[i] = Entry{Key: lv.Key, Value: lv.Value}
	}
	return Change{Kind: kind, Domain: domain, Path: path, Name: l.Name, Fields: fieldChanges(limitFields(before), limitFields(after))}
}

func comparePaths(a, b []Entry) int {
	for i := range min(len(a), len(b)) {
		if c := cmp.Or(strings.Compare(a[i].Key, b[i].Key), strings.Compare(a[i].Value, b[i].Value)); c != 0 {
			return c
		}
	}
	return cmp.Compare(len(a), len(b))
}

// limitFields lists a limit's settings as text, in the format's field
// order; nil for no limit.
func limitFields(l *Limit) []FieldChange {
	if l == nil {
		return nil
	}
	flag := func(on bool) string {
		if on {
			return "true"
		}
		return ""
	}
	num := func(n uint32) string { return strconv.FormatUint(uint64(n), 10) }
	var shared, toMetric []string
	for _, lv := range l.Path {
		if lv.ShareThreshold {
			shared = append(shared, lv.Key+"="+lv.Value)
		}
		if lv.ValueToMetric {
			toMetric = append(toMetric, lv.Key)
		}
	}
	f := []FieldChange{
		{Field: "rate_limit.unit", After: string(l.Unit)},
		{Field: "rate_limit.requests_per_unit", After: num(l.RequestsPerUnit)},
		{Field: "rate_limit.unit_multiplier", After: multiplier(l)},
		{Field: "rate_limit.unlimited", After: flag(l.Unlimited)},
		{Field: "rate_limit.name", After: l.Name},
		{Field: "rate_limit.replaces", After: strings.Join(l.Replaces, ", ")},
		{Field: "shadow_mode", After: flag(l.ShadowMode)},
		{Field: "detailed_metric", After: flag(l.DetailedMetric)},
		{Field: "value_to_metric", After: strings.Join(toMetric, ", ")},
		{Field: "share_threshold", After: strings.Join(shared, ", ")},
	}
	if l.Unlimited {
		f[1].After, f[2].After = "", ""
		return f // nothing else applies
	}
	maxDelay := ""
	if l.OnLimit.MaxDelay != 0 {
		maxDelay = l.OnLimit.MaxDelay.String()
	}
	return append(f,
		FieldChange{Field: "algorithm", After: string(l.Algorithm)},
		FieldChange{Field: "burst", After: num(l.Burst)},
		FieldChange{Field: "calendar", After: flag(l.Calendar)},
		FieldChange{Field: "shards", After: num(l.Shards)},
		FieldChange{Field: "lease", After: flag(l.Lease)},
		FieldChange{Field: "consistency", After: consistencyOf(l.Async)},
		FieldChange{Field: "scope", After: globalScope(l)},
		FieldChange{Field: "failure_mode", After: string(l.FailureMode)},
		FieldChange{Field: "on_limit.action", After: string(l.OnLimit.Action)},
		FieldChange{Field: "on_limit.max_delay", After: maxDelay},
		FieldChange{Field: "on_limit.status", After: strconv.Itoa(l.OnLimit.Status)},
	)
}

// fieldChanges pairs two field lists (either may be nil) and keeps the
// fields whose values differ.
func fieldChanges(before, after []FieldChange) []FieldChange {
	values := func(fs []FieldChange) map[string]string {
		m := make(map[string]string, len(fs))
		for _, f := range fs {
			m[f.Field] = f.After
		}
		return m
	}
	b, a := values(before), values(after)
	order := after
	if order == nil || len(before) > len(after) {
		order = before
	}
	var out []FieldChange
	for _, f := range order {
		if b[f.Field] != a[f.Field] {
			out = append(out, FieldChange{Field: f.Field, Before: b[f.Field], After: a[f.Field]})
		}
	}
	return out
}

// requestDescriptorChanges compares request_descriptors item by item.
func requestDescriptorChanges(before, after []RequestDescriptor) []FieldChange {
	var out []FieldChange
	for i := range max(len(before), len(after)) {
		var b, a string
		if i < len(before) {
			b = describeRequestDescriptor(before[i])
		}
		if i < len(after) {
			a = describeRequestDescriptor(after[i])
		}
		if a != b {
			out = append(out, FieldChange{Field: index("request_descriptors", i), Before: b, After: a})
		}
	}
	return out
}

// describeRequestDescriptor writes a request descriptor on one line, like
// "api_key=header:X-API-Key, route=path, scope=\"global\"".
func describeRequestDescriptor(rd RequestDescriptor) string {
	parts := make([]string, len(rd.Entries))
	for i, e := range rd.Entries {
		src := string(e.From)
		switch {
		case e.From == "":
			src = strconv.Quote(e.Value)
		case e.Name != "":
			src += ":" + e.Name
		}
		parts[i] = e.Key + "=" + src
	}
	return strings.Join(parts, ", ")
}

// multiplier is l's unit_multiplier; "" for the default, 1, which most
// limits have and a diff need not list.
func multiplier(l *Limit) string {
	if p := l.Unit.Period(); p > 0 && l.Period/p > 1 {
		return strconv.FormatInt(int64(l.Period/p), 10)
	}
	return ""
}

// consistencyOf shows a limit's consistency, "" for the default (exact),
// like a false flag.
func consistencyOf(async bool) string {
	if async {
		return string(Async)
	}
	return ""
}

// globalScope is a limit's scope for diffs: "global", or "" for the default.
func globalScope(l *Limit) string {
	if l.Scope == ScopeGlobal {
		return string(ScopeGlobal)
	}
	return ""
}
