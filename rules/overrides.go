package rules

import (
	"bytes"
	"cmp"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"gopkg.in/yaml.v3"
)

// MaxOverrides bounds the overrides of one domain.
const MaxOverrides = 1000

// Override gives the request descriptors whose entries are exactly Entries
// (same keys and values, in order) another rate: they count against the
// limit those entries match, with its unit and requests_per_unit replaced
// and its burst set to requests_per_unit. Everything else about the limit
// stays: its name (so stats and replaces are unchanged), algorithm, shadow
// mode, failure mode, on_limit, shards and lease, and its counter key (so a
// customer's usage carries over when an override starts or ends).
//
// An override must match a limit: Parse and Compile refuse one whose
// entries match none.
type Override struct {
	Entries         []Entry `json:"entries"`
	Unit            Unit    `json:"unit"`
	RequestsPerUnit uint32  `json:"requests_per_unit"`
}

func (p *parser) overrides(n *yaml.Node, path string) []Override {
	if !p.plain(n, path) {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		p.fail(n, path, "overrides must be a list like [{entries: [{key: api_key, value: k1}], rate_limit: {unit: hour, requests_per_unit: 8}}], not "+describe(n))
		return nil
	}
	out := make([]Override, len(n.Content))
	for i, item := range n.Content {
		ip := index(path, i)
		f := p.mapping(item, ip, "an override (like {entries: [...], rate_limit: {...}})", overrideFields)
		if f == nil {
			continue
		}
		o := &out[i]
		if v := f["entries"]; isNull(v) {
			p.require(cmp.Or(v, item), join(ip, "entries"), "entries is required")
		} else if ep := join(ip, "entries"); p.plain(v, ep) {
			if v.Kind != yaml.SequenceNode {
				p.fail(v, ep, "entries must be a list like [{key: api_key, value: k1}], not "+describe(v))
			} else {
				o.Entries = make([]Entry, len(v.Content))
				for j, en := range v.Content {
					o.Entries[j] = p.overrideEntry(en, index(ep, j))
				}
			}
		}
		if v := f["rate_limit"]; isNull(v) {
			p.require(cmp.Or(v, item), join(ip, "rate_limit"), "rate_limit is required")
		} else {
			p.overrideRate(v, join(ip, "rate_limit"), o)
		}
	}
	return out
}

func (p *parser) overrideEntry(n *yaml.Node, path string) Entry {
	var e Entry
	f := p.mapping(n, path, "an override entry (like {key: api_key, value: k1})", overrideEntryFields)
	if f == nil {
		return e
	}
	if v := f["key"]; isNull(v) {
		p.require(cmp.Or(v, n), join(path, "key"), "key is required")
	} else {
		e.Key = p.text(v, join(path, "key"), "key")
	}
	if v := f["value"]; isNull(v) {
		p.require(cmp.Or(v, n), join(path, "value"), "value is required: an override is for one exact value")
	} else {
		e.Value = p.text(v, join(path, "value"), "value")
	}
	return e
}

func (p *parser) overrideRate(n *yaml.Node, path string, o *Override) {
	f := p.mapping(n, path, "rate_limit", overrideRateFields)
	if f == nil {
		return
	}
	if v := f["unit"]; isNull(v) {
		p.require(cmp.Or(v, n), join(path, "unit"), "unit is required "+unitList)
	} else {
		o.Unit = Unit(strings.ToLower(p.text(v, join(path, "unit"), "unit")))
	}
	if v := f["requests_per_unit"]; isNull(v) {
		p.require(cmp.Or(v, n), join(path, "requests_per_unit"), "requests_per_unit is required")
	} else {
		o.RequestsPerUnit = uint32(p.whole(v, join(path, "requests_per_unit"), "requests_per_unit", 0, MaxRequestsPerUnit))
	}
}

// overrides checks d's overrides: each names a limit of d by its entries,
// once, with a valid rate that the limit's options accept.
func (c *checker) overrides(d *Domain) {
	if len(d.Overrides) > MaxOverrides {
		c.fail("overrides", fmt.Sprintf("a domain may have at most %d overrides", MaxOverrides))
		return
	}
	seen := make(map[string]int, len(d.Overrides))
	for i, o := range d.Overrides {
		path := index("overrides", i)
		if c.overrideEntries(o.Entries, join(path, "entries")) {
			key := entriesKey(o.Entries)
			if first, dup := seen[key]; dup {
				c.fail(join(path, "entries"), fmt.Sprintf("these entries are already overridden at %s", index("overrides", first)))
			} else {
				seen[key] = i
			}
		}
		rp := join(path, "rate_limit")
		switch {
		case o.Unit == "":
			c.fail(join(rp, "unit"), "unit is required "+unitList)
		case o.Unit.Period() == 0:
			c.fail(join(rp, "unit"), unitMessage(string(o.Unit)))
		}
		if msg := rangeProblem("requests_per_unit", int64(o.RequestsPerUnit), 0, MaxRequestsPerUnit); msg != "" {
			c.fail(join(rp, "requests_per_unit"), msg)
		}
		if len(o.Entries) == 0 || o.Unit.Period() == 0 {
			continue
		}
		target := matchDescriptor(d.Descriptors, o.Entries)
		if target == nil {
			c.fail(join(path, "entries"), fmt.Sprintf("entries %s match no limit in domain %s", FormatEntries(o.Entries), quote(d.Name)))
			continue
		}
		syn := overrideDescriptor(target, o)
		before := len(c.problems)
		c.extensions(&syn, rp)
		for j := before; j < len(c.problems); j++ {
			c.problems[j].Path = rp
			c.problems[j].Message = "with this override: " + c.problems[j].Message
		}
	}
}

// overrideEntries checks an override's entries; it reports whether they
// are well formed.
func (c *checker) overrideEntries(entries []Entry, path string) bool {
	switch {
	case len(entries) == 0:
		c.fail(path, "entries needs at least one entry")
		return false
	case len(entries) > MaxDepth:
		c.fail(path, fmt.Sprintf("at most %d entries: descriptors nest at most that deep", MaxDepth))
		return false
	}
	ok := true
	for j, e := range entries {
		ep := index(path, j)
		if e.Key == "" {
			c.fail(join(ep, "key"), "key is required")
			ok = false
		}
		if e.Value == "" {
			c.fail(join(ep, "value"), "value is required: an override is for one exact value")
			ok = false
		}
		if !utf8.ValidString(e.Key) || !utf8.ValidString(e.Value) {
			c.fail(ep, "key and value must be valid UTF-8 text")
			ok = false
		}
	}
	return ok
}

// entriesKey is a map key that distinguishes any two entry lists.
func entriesKey(entries []Entry) string {
	var b strings.Builder
	for _, e := range entries {
		fmt.Fprintf(&b, "%d:%s%d:%s", len(e.Key), e.Key, len(e.Value), e.Value)
	}
	return b.String()
}

// FormatEntries writes entries as key=value pairs, for messages.
func FormatEntries(entries []Entry) string {
	parts := make([]string, len(entries))
	for i, e := range entries {
		parts[i] = e.Key + "=" + e.Value
	}
	return "(" + strings.Join(parts, ", ") + ")"
}

// matchDescriptor returns the descriptor with a rate limit that a request
// descriptor with entries matches in ds, as Match would find it, or nil.
func matchDescriptor(ds []Descriptor, entries []Entry) *Descriptor {
	for i, e := range entries {
		d := lookupValue(ds, e.Key, e.Value)
		switch {
		case d == nil:
			return nil
		case i == len(entries)-1:
			if d.RateLimit == nil {
				return nil
			}
			return d
		}
		ds = d.Descriptors
	}
	return nil
}

// overrideDescriptor is target with o's rate, as the checker sees an
// override: the options that depend on the rate are checked on it.
func overrideDescriptor(target *Descriptor, o Override) Descriptor {
	syn := *target
	syn.Descriptors = nil
	syn.Burst = 0
	syn.Calendar = target.Calendar && slices.Contains(calendarUnits, o.Unit)
	rl := &RateLimit{Unit: o.Unit, RequestsPerUnit: o.RequestsPerUnit}
	if target.RateLimit != nil {
		rl.Name, rl.Replaces = target.RateLimit.Name, target.RateLimit.Replaces
	}
	syn.RateLimit = rl
	return syn
}

// overrideLimit is l with o's rate, as overrideDescriptor describes it.
func overrideLimit(l *Limit, o Override) *Limit {
	ol := *l
	ol.Path = slices.Clone(l.Path)
	ol.Replaces = slices.Clone(l.Replaces)
	ol.Unlimited = false
	ol.Unit = o.Unit
	ol.RequestsPerUnit = o.RequestsPerUnit
	ol.Burst = o.RequestsPerUnit
	ol.Period = o.Unit.Period()
	ol.Calendar = l.Calendar && slices.Contains(calendarUnits, o.Unit)
	return &ol
}

// overrideStep is one level of a node's override trie: the values of a
// request descriptor's entries, one map per entry.
type overrideStep struct {
	limit *Limit                   // the override, at the last entry
	next  map[string]*overrideStep // by the next entry's value
}

// addOverrides compiles domain's overrides into its tree: each onto the
// node its entries reach. validate has checked that each reaches a limit.
func (s *Set) addOverrides(domain string, ovs []Override) {
	for _, o := range ovs {
		n := s.find(domain, o.Entries)
		if n == nil || n.limit == nil {
			continue
		}
		if n.overrides == nil {
			n.overrides = make(map[string]*overrideStep)
		}
		steps := n.overrides
		for i, e := range o.Entries {
			st := steps[e.Value]
			if st == nil {
				st = &overrideStep{}
				steps[e.Value] = st
			}
			if i == len(o.Entries)-1 {
				st.limit = overrideLimit(n.limit, o)
				break
			}
			if st.next == nil {
				st.next = make(map[string]*overrideStep)
			}
			steps = st.next
		}
	}
}

// overridden returns the override of n for entries, or n's own limit.
func (n *node) overridden(entries []Entry) *Limit {
	steps := n.overrides
	for i, e := range entries {
		st := steps[e.Value]
		if st == nil {
			return n.limit
		}
		if i == len(entries)-1 {
			return cmp.Or(st.limit, n.limit)
		}
		steps = st.next
	}
	return n.limit
}

func overridesNode(ovs []Override) *yaml.Node {
	list := seqNode()
	for _, o := range ovs {
		list.Content = append(list.Content, overrideNode(o))
	}
	return list
}

func overrideNode(o Override) *yaml.Node {
	entries := seqNode()
	for _, e := range o.Entries {
		em := mappingNode()
		em.Style = yaml.FlowStyle
		em.add("key", textNode(e.Key))
		em.add("value", textNode(e.Value))
		entries.Content = append(entries.Content, em.Node)
	}
	rl := mappingNode()
	rl.Style = yaml.FlowStyle
	rl.add("unit", textNode(string(o.Unit)))
	rl.add("requests_per_unit", intNode(int64(o.RequestsPerUnit)))
	m := mappingNode()
	m.add("entries", entries)
	m.add("rate_limit", rl.Node)
	return m.Node
}

// OverridesHeader heads the overrides section WithOverrides writes.
const OverridesHeader = "Temporary overrides, written by the console (sluice ctl overrides): not part of the domain's own YAML."

// WithOverrides returns a domain's YAML src (valid, without overrides of
// its own) with ovs added as its overrides section, each under its comment
// in notes (notes[i] for ovs[i], may be shorter): the rules an enforcer
// runs while the overrides last. Overrides whose entries match no limit of
// src (or whose rate the matched limit's options refuse) are left out and
// reported in skipped, so a domain edited since an override was made still
// publishes. The section is appended to src as
// text, so src's own lines are unchanged; when src's layout does not allow
// that (a flow-style document, say), the whole document is written in the
// canonical form of Format instead.
func WithOverrides(file string, src []byte, ovs []Override, notes []string) (out []byte, skipped []int, err error) {
	d, err := Parse(file, src)
	if err != nil {
		return nil, nil, err
	}
	if len(d.Overrides) > 0 {
		return nil, nil, fmt.Errorf("%s already has an overrides section", file)
	}
	// An override the current rules refuse (its entries match no limit,
	// or the matched limit's options do not take its rate) is skipped.
	refused := map[int]bool{}
	trial := *d
	trial.Overrides = ovs
	for _, prob := range validate(&trial) {
		var k int
		if _, err := fmt.Sscanf(prob.Path, "overrides[%d]", &k); err == nil {
			refused[k] = true
		}
	}
	var keep []Override
	var keepNotes []string
	for i, o := range ovs {
		if refused[i] {
			skipped = append(skipped, i)
			continue
		}
		keep = append(keep, o)
		note := ""
		if i < len(notes) {
			note = notes[i]
		}
		keepNotes = append(keepNotes, note)
	}
	if len(keep) == 0 {
		return src, skipped, nil
	}
	list := overridesNode(keep)
	for i, item := range list.Content {
		// One comment line: control characters (line breaks included) become
		// spaces.
		item.HeadComment = strings.Map(func(r rune) rune {
			if r < ' ' || r == 0x7f || r == 0x85 || r == 0x2028 || r == 0x2029 {
				return ' '
			}
			return r
		}, strings.ToValidUTF8(keepNotes[i], "\uFFFD"))
	}
	section := mappingNode()
	section.add("overrides", list)
	section.Content[0].HeadComment = OverridesHeader
	text, err := encode(nil, section.Node)
	if err != nil {
		return nil, nil, fmt.Errorf("write overrides of %s: %w", file, err)
	}
	want := *d
	want.Overrides = keep
	out = append(bytes.TrimRight(slices.Clone(src), " \t\r\n"), "\n\n"...)
	out = append(out, text...)
	if got, err := Parse(file, out); err == nil && bytes.Equal(Format(got), Format(&want)) {
		return out, skipped, nil
	}
	if out = Format(&want); out == nil {
		return nil, nil, fmt.Errorf("write overrides of %s", file)
	}
	if _, err := Parse(file, out); err != nil {
		return nil, nil, err
	}
	return out, skipped, nil
}
