package rules

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"gopkg.in/yaml.v3"
)

// The fields each level of a domain file accepts (see schema.go).
var (
	topFields               = fieldNames("domain")
	descriptorFields        = fieldNames("descriptor")
	rateLimitFields         = fieldNames("rate_limit")
	replacesFields          = fieldNames("replaces")
	onLimitFields           = fieldNames("on_limit")
	requestDescriptorFields = fieldNames("request_descriptor")
	requestEntryFields      = fieldNames("request_entry")
	overrideFields          = fieldNames("override")
	overrideEntryFields     = fieldNames("override_entry")
	overrideRateFields      = fieldNames("override_rate_limit")
)

// maxProblems bounds the problems one Parse reports, so a huge broken file
// cannot produce a huge error.
const maxProblems = 1000

// Parse parses and validates one domain's YAML: envoyproxy/ratelimit's format
// plus Sluice's extensions (see JSONSchema for every field). file names the
// source in problems. Units are case-insensitive, as in Lyft; everything else
// is exact.
//
// An invalid document yields a *ValidationError listing every problem found,
// each with its line, column and path. YAML anchors and aliases are refused.
func Parse(file string, src []byte) (*Domain, error) {
	return ParseOptions{}.Parse(file, src)
}

// ParseOptions change how Parse and ParseAll read a file.
type ParseOptions struct {
	// DefaultAlgorithm is the default_algorithm of a file that sets none.
	// File mode sets FixedWindow, so that a Lyft file counts in fixed
	// windows as it does in Lyft. The file is checked with it in effect
	// (burst, calendar and on_limit depend on the algorithm), and the
	// Domain returned carries it.
	DefaultAlgorithm Algorithm
}

// Parse is the package's Parse, with o.
func (o ParseOptions) Parse(file string, src []byte) (*Domain, error) {
	if len(src) > MaxSourceBytes {
		return nil, oneProblem(file, 1, 1, fmt.Sprintf("file is %d bytes; the limit is %d", len(src), MaxSourceBytes))
	}
	if line, col, msg := badText(src); msg != "" {
		return nil, oneProblem(file, line, col, msg)
	}
	root, extra, err := parseYAML(src)
	if err != nil {
		line, col, msg := syntaxProblem(src, err)
		return nil, oneProblem(file, line, col, msg)
	}

	p := &parser{file: file, bad: map[string]bool{}, covered: map[string]bool{}}
	if extra != nil {
		// Not p.fail: the first document's own problems still count.
		line, col := position(extra)
		p.problems = append(p.problems, Problem{File: file, Line: line, Column: col, Message: "a file holds one domain: remove the second YAML document"})
	}
	d := p.domain(root)
	if d.DefaultAlgorithm == "" {
		d.DefaultAlgorithm = o.DefaultAlgorithm
	}
	for _, prob := range validate(d) {
		// A field that failed to decode has a zero value the checker would
		// complain about again.
		if p.reported(prob.Path) {
			continue
		}
		prob.File = file
		prob.Line, prob.Column = position(nodeAt(root, prob.Path))
		p.problems = append(p.problems, prob)
	}
	if len(p.problems) == 0 {
		return d, nil
	}
	slices.SortStableFunc(p.problems, func(a, b Problem) int {
		return cmp.Or(cmp.Compare(a.Line, b.Line), cmp.Compare(a.Column, b.Column))
	})
	if n := len(p.problems); n > maxProblems {
		p.problems = append(p.problems[:maxProblems], Problem{File: file, Message: fmt.Sprintf("%d more problems not shown", n-maxProblems)})
	}
	return nil, &ValidationError{Problems: p.problems}
}

func oneProblem(file string, line, col int, msg string) *ValidationError {
	return &ValidationError{Problems: []Problem{{File: file, Line: line, Column: col, Message: msg}}}
}

// parseYAML parses src into nodes. root is nil for an empty document; extra
// is the start of a later, non-empty document, if there is one.
func parseYAML(src []byte) (root, extra *yaml.Node, err error) {
	dec := yaml.NewDecoder(bytes.NewReader(src))
	for {
		var doc yaml.Node
		switch err := dec.Decode(&doc); {
		case errors.Is(err, io.EOF):
			return root, nil, nil
		case err != nil:
			return nil, nil, err
		case len(doc.Content) == 0 || isNull(doc.Content[0]):
			// An empty document, as after a trailing "---": nothing to say.
		case root != nil:
			return root, doc.Content[0], nil
		default:
			root = doc.Content[0]
		}
	}
}

// parser walks the YAML nodes of one document into a Domain, reporting
// problems of shape (unknown fields, wrong types, missing fields).
type parser struct {
	file     string
	problems []Problem
	bad      map[string]bool // paths with a problem
	// covered are paths of required fields an unknown field was probably
	// meant to be (a typo, a misplaced field): one problem says it all.
	covered map[string]bool
	count   int // descriptors decoded
}

// require reports a missing required field, unless an unknown field already
// stands for it.
func (p *parser) require(n *yaml.Node, path, msg string) {
	if p.covered[path] {
		p.bad[path] = true // and the checker need not say it either
		return
	}
	p.fail(n, path, msg)
}

func (p *parser) fail(n *yaml.Node, path, msg string) {
	line, col := position(n)
	p.problems = append(p.problems, Problem{File: p.file, Line: line, Column: col, Path: path, Message: msg})
	p.bad[path] = true
}

// reported says whether path or one of its parents already has a problem.
func (p *parser) reported(path string) bool {
	for {
		if p.bad[path] {
			return true
		}
		if path == "" {
			return false
		}
		path = parent(path)
	}
}

func (p *parser) domain(root *yaml.Node) *Domain {
	d := &Domain{}
	if root == nil {
		p.fail(nil, "domain", "domain is required")
		return d
	}
	f := p.mapping(root, "", `the file (a mapping with "domain" and "descriptors")`, topFields)
	if f == nil {
		return d
	}
	if v := f["domain"]; isNull(v) {
		p.require(cmp.Or(v, root), "domain", "domain is required")
	} else {
		d.Name = p.text(v, "domain", "domain")
	}
	if v := f["default_algorithm"]; !isNull(v) {
		d.DefaultAlgorithm = Algorithm(p.text(v, "default_algorithm", "default_algorithm"))
	}
	if v := f["request_descriptors"]; !isNull(v) {
		d.RequestDescriptors = p.requestDescriptors(v, "request_descriptors")
	}
	if v := f["descriptors"]; !isNull(v) {
		d.Descriptors = p.descriptors(v, "descriptors", 1)
	}
	if v := f["overrides"]; !isNull(v) {
		d.Overrides = p.overrides(v, "overrides")
	}
	return d
}

func (p *parser) descriptors(n *yaml.Node, path string, depth int) []Descriptor {
	if !p.plain(n, path) {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		p.fail(n, path, "descriptors must be a list, not "+describe(n))
		return nil
	}
	if depth > MaxDepth {
		p.fail(n, path, depthMessage)
		return nil
	}
	ds := make([]Descriptor, 0, len(n.Content))
	for i, item := range n.Content {
		p.count++
		if p.count > MaxDescriptors {
			if p.count == MaxDescriptors+1 {
				p.fail(item, index(path, i), countMessage)
			}
			break
		}
		// Every item gets a slot, valid or not, so paths stay aligned with
		// the checker's.
		ds = append(ds, p.descriptor(item, index(path, i), depth))
	}
	return ds
}

func (p *parser) descriptor(n *yaml.Node, path string, depth int) Descriptor {
	var d Descriptor
	f := p.mapping(n, path, "a descriptor", descriptorFields)
	if f == nil {
		return d
	}
	if v := f["key"]; isNull(v) {
		p.require(cmp.Or(v, n), join(path, "key"), "key is required")
	} else {
		d.Key = p.text(v, join(path, "key"), "key")
	}
	if v := f["value"]; !isNull(v) {
		d.Value = p.text(v, join(path, "value"), "value")
	}
	if v := f["rate_limit"]; !isNull(v) {
		d.RateLimit = p.rateLimit(v, join(path, "rate_limit"))
		if d.RateLimit == nil {
			// Unreadable, and reported. Stand in a plain limit so that the
			// checker does not also call the descriptor's other fields
			// pointless without one.
			d.RateLimit = &RateLimit{Unit: Second, RequestsPerUnit: MaxRequestsPerUnit}
		}
	}
	if v := f["shadow_mode"]; !isNull(v) {
		d.ShadowMode, _ = p.boolean(v, join(path, "shadow_mode"), "shadow_mode")
	}
	if v := f["detailed_metric"]; !isNull(v) {
		d.DetailedMetric, _ = p.boolean(v, join(path, "detailed_metric"), "detailed_metric")
	}
	if v := f["value_to_metric"]; !isNull(v) {
		d.ValueToMetric, _ = p.boolean(v, join(path, "value_to_metric"), "value_to_metric")
	}
	if v := f["share_threshold"]; !isNull(v) {
		d.ShareThreshold, _ = p.boolean(v, join(path, "share_threshold"), "share_threshold")
	}
	if v := f["metadata"]; !isNull(v) {
		d.Metadata = p.anyMapping(v, join(path, "metadata"), "metadata")
	}
	if v := f["algorithm"]; !isNull(v) {
		d.Algorithm = Algorithm(p.text(v, join(path, "algorithm"), "algorithm"))
	}
	if v := f["burst"]; !isNull(v) {
		d.Burst = uint32(p.whole(v, join(path, "burst"), "burst", 1, MaxRequestsPerUnit))
	}
	if v := f["calendar"]; !isNull(v) {
		d.Calendar, _ = p.boolean(v, join(path, "calendar"), "calendar")
	}
	if v := f["shards"]; !isNull(v) {
		d.Shards = uint32(p.whole(v, join(path, "shards"), "shards", 1, MaxShards))
	}
	if v := f["lease"]; !isNull(v) {
		d.Lease, _ = p.boolean(v, join(path, "lease"), "lease")
	}
	if v := f["consistency"]; !isNull(v) {
		d.Consistency = Consistency(p.text(v, join(path, "consistency"), "consistency"))
	}
	if v := f["scope"]; !isNull(v) {
		d.Scope = Scope(p.text(v, join(path, "scope"), "scope"))
	}
	if v := f["failure_mode"]; !isNull(v) {
		d.FailureMode = FailureMode(p.text(v, join(path, "failure_mode"), "failure_mode"))
	}
	if v := f["on_limit"]; !isNull(v) {
		d.OnLimit = p.onLimit(v, join(path, "on_limit"))
	}
	if v := f["descriptors"]; !isNull(v) {
		d.Descriptors = p.descriptors(v, join(path, "descriptors"), depth+1)
	}
	return d
}

func (p *parser) rateLimit(n *yaml.Node, path string) *RateLimit {
	f := p.mapping(n, path, "rate_limit", rateLimitFields)
	if f == nil {
		return nil
	}
	rl := &RateLimit{}
	// Whether unit and requests_per_unit are required depends on unlimited;
	// when it is unreadable, neither is required (nor refused).
	known := true
	if v := f["unlimited"]; !isNull(v) {
		rl.Unlimited, known = p.boolean(v, join(path, "unlimited"), "unlimited")
	}
	switch v := f["unit"]; {
	case !isNull(v) && rl.Unlimited:
		p.fail(v, join(path, "unit"), "an unlimited rate limit takes no unit")
	case !isNull(v):
		// Lyft upper-cases units before looking them up, so any case works.
		rl.Unit = Unit(strings.ToLower(p.text(v, join(path, "unit"), "unit")))
	case known && !rl.Unlimited:
		p.require(cmp.Or(v, n), join(path, "unit"), "unit is required "+unitList)
	}
	switch v := f["requests_per_unit"]; {
	case !isNull(v) && rl.Unlimited:
		p.fail(v, join(path, "requests_per_unit"), "an unlimited rate limit takes no requests_per_unit")
	case !isNull(v):
		before := len(p.problems)
		rl.RequestsPerUnit = uint32(p.whole(v, join(path, "requests_per_unit"), "requests_per_unit", 0, MaxRequestsPerUnit))
		if len(p.problems) > before {
			// Reported; and 0, which blocks, would make the checker find
			// fault with burst, shards or on_limit as well.
			rl.RequestsPerUnit = MaxRequestsPerUnit
		}
	case known && !rl.Unlimited:
		p.require(cmp.Or(v, n), join(path, "requests_per_unit"), "requests_per_unit is required")
		rl.RequestsPerUnit = MaxRequestsPerUnit // as above
	case !known:
		rl.RequestsPerUnit = MaxRequestsPerUnit // as above
	}
	switch v := f["unit_multiplier"]; {
	case !isNull(v) && rl.Unlimited:
		p.fail(v, join(path, "unit_multiplier"), "an unlimited rate limit takes no unit_multiplier")
	case !isNull(v):
		rl.UnitMultiplier = uint32(p.whole(v, join(path, "unit_multiplier"), "unit_multiplier", 1, MaxUnitMultiplier))
	}
	if !known {
		// The checker would otherwise ask for what the user may not need.
		p.bad[join(path, "unit")] = true
		p.bad[join(path, "requests_per_unit")] = true
	}
	if v := f["name"]; !isNull(v) {
		rl.Name = p.text(v, join(path, "name"), "name")
	}
	if v := f["replaces"]; !isNull(v) {
		rl.Replaces = p.replaces(v, join(path, "replaces"))
	}
	return rl
}

func (p *parser) replaces(n *yaml.Node, path string) []string {
	if !p.plain(n, path) {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		p.fail(n, path, "replaces must be a list like [{name: other}], not "+describe(n))
		return nil
	}
	names := make([]string, len(n.Content))
	for i, item := range n.Content {
		ip := index(path, i)
		f := p.mapping(item, ip, "a replaces entry (like {name: other})", replacesFields)
		if f == nil {
			continue
		}
		if v := f["name"]; isNull(v) {
			p.require(cmp.Or(v, item), join(ip, "name"), "name is required")
		} else {
			names[i] = p.text(v, join(ip, "name"), "name")
		}
	}
	return names
}

func (p *parser) onLimit(n *yaml.Node, path string) *OnLimit {
	f := p.mapping(n, path, "on_limit", onLimitFields)
	if f == nil {
		return nil
	}
	ol := &OnLimit{}
	if v := f["action"]; !isNull(v) {
		ol.Action = Action(p.text(v, join(path, "action"), "action"))
	}
	if v := f["max_delay"]; !isNull(v) {
		ol.MaxDelay = p.duration(v, join(path, "max_delay"), "max_delay")
	}
	if v := f["status"]; !isNull(v) {
		ol.Status = int(p.whole(v, join(path, "status"), "status", 400, 599))
	}
	return ol
}

func (p *parser) requestDescriptors(n *yaml.Node, path string) []RequestDescriptor {
	if !p.plain(n, path) {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		p.fail(n, path, "request_descriptors must be a list like [{entries: [{key: api_key, from: header, name: X-API-Key}]}], not "+describe(n))
		return nil
	}
	rds := make([]RequestDescriptor, len(n.Content))
	for i, item := range n.Content {
		ip := index(path, i)
		f := p.mapping(item, ip, "a request descriptor (like {entries: [...]})", requestDescriptorFields)
		if f == nil {
			continue
		}
		v := f["entries"]
		if isNull(v) {
			p.require(cmp.Or(v, item), join(ip, "entries"), "entries is required")
			continue
		}
		ep := join(ip, "entries")
		if !p.plain(v, ep) {
			continue
		}
		if v.Kind != yaml.SequenceNode {
			p.fail(v, ep, "entries must be a list like [{key: api_key, from: header, name: X-API-Key}], not "+describe(v))
			continue
		}
		entries := make([]RequestEntry, len(v.Content))
		for j, en := range v.Content {
			entries[j] = p.requestEntry(en, index(ep, j))
		}
		rds[i].Entries = entries
	}
	return rds
}

func (p *parser) requestEntry(n *yaml.Node, path string) RequestEntry {
	var e RequestEntry
	f := p.mapping(n, path, "a request descriptor entry (like {key: api_key, from: header, name: X-API-Key})", requestEntryFields)
	if f == nil {
		return e
	}
	if v := f["key"]; isNull(v) {
		p.require(cmp.Or(v, n), join(path, "key"), "key is required")
	} else {
		e.Key = p.text(v, join(path, "key"), "key")
	}
	if v := f["from"]; !isNull(v) {
		e.From = Source(p.text(v, join(path, "from"), "from"))
	}
	if v := f["name"]; !isNull(v) {
		e.Name = p.text(v, join(path, "name"), "name")
	}
	if v := f["value"]; !isNull(v) {
		e.Value = p.text(v, join(path, "value"), "value")
	}
	if p.covered[join(path, "from")] {
		p.bad[join(path, "from")] = true // a misplaced source already said it
	}
	return e
}

// mapping checks that n is a mapping and returns its values by field name.
// It reports duplicate and unknown fields; subject names n in messages.
func (p *parser) mapping(n *yaml.Node, path, subject string, known []string) map[string]*yaml.Node {
	if !p.plain(n, path) {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		p.fail(n, path, subject+" must be a mapping, not "+describe(n))
		return nil
	}
	fields := make(map[string]*yaml.Node, len(n.Content)/2)
	keys := make(map[string]*yaml.Node, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if !p.plain(k, path) {
			continue
		}
		if k.Kind != yaml.ScalarNode {
			p.fail(k, path, "field names must be text, not "+describe(k))
			continue
		}
		name, fp := k.Value, join(path, k.Value)
		if first, dup := keys[name]; dup {
			p.fail(k, fp, fmt.Sprintf("duplicate field %s (first at line %d)", quote(name), first.Line))
			continue
		}
		keys[name] = k
		if !slices.Contains(known, name) {
			msg, meant := unknownField(name, known)
			p.fail(k, fp, msg)
			if meant != "" {
				p.covered[join(path, meant)] = true
			}
			continue
		}
		fields[name] = v
	}
	return fields
}

// anyMapping decodes a mapping of anything (Lyft's metadata). Its content
// is free, but anchors and aliases are refused anywhere inside it, as
// everywhere else.
func (p *parser) anyMapping(n *yaml.Node, path, field string) map[string]any {
	if !p.plainTree(n, path) {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		p.fail(n, path, field+" must be a mapping, not "+describe(n))
		return nil
	}
	var m map[string]any
	if err := n.Decode(&m); err != nil || !textKeys(m) {
		// Keys that are not text, such as a list used as a key: the API
		// could not show them as JSON.
		p.fail(n, path, field+" must be a mapping with text keys")
		return nil
	}
	if len(m) == 0 {
		return nil
	}
	return m
}

// textKeys reports whether every mapping inside v has text keys.
func textKeys(v any) bool {
	switch v := v.(type) {
	case map[string]any:
		for _, e := range v {
			if !textKeys(e) {
				return false
			}
		}
	case []any:
		for _, e := range v {
			if !textKeys(e) {
				return false
			}
		}
	case map[any]any:
		return false
	}
	return true
}

// plainTree is plain for n and everything below it.
func (p *parser) plainTree(n *yaml.Node, path string) bool {
	if !p.plain(n, path) {
		return false
	}
	for _, c := range n.Content {
		if !p.plainTree(c, path) {
			return false
		}
	}
	return true
}

// plain reports anchors and aliases. Refusing them keeps a small document
// from expanding into a huge one ("billion laughs").
func (p *parser) plain(n *yaml.Node, path string) bool {
	switch {
	case n.Kind == yaml.AliasNode:
		p.fail(n, path, fmt.Sprintf("aliases (*%s) are not supported; write the value out", n.Value))
		return false
	case n.Anchor != "":
		p.fail(n, path, fmt.Sprintf("anchors (&%s) are not supported", n.Anchor))
		return false
	}
	return true
}

func (p *parser) text(n *yaml.Node, path, field string) string {
	if !p.plain(n, path) {
		return ""
	}
	switch {
	case n.Kind != yaml.ScalarNode:
		p.fail(n, path, field+" must be text, not "+describe(n))
		return ""
	case n.ShortTag() == "!!binary":
		p.fail(n, path, field+" must be text, not binary data")
		return ""
	case !utf8.ValidString(n.Value):
		// Possible with escapes such as "\xff" in a double-quoted string.
		p.fail(n, path, field+" must be valid UTF-8 text")
		return ""
	}
	// Like Lyft, take a number or a boolean as the text it is written as.
	return n.Value
}

// boolean decodes a flag; ok is false when it could not.
func (p *parser) boolean(n *yaml.Node, path, field string) (b, ok bool) {
	if !p.plain(n, path) {
		return false, false
	}
	// Decode accepts YAML 1.1's yes/no/on/off too, as Lyft's yaml.v2 does.
	if n.Kind != yaml.ScalarNode || n.Decode(&b) != nil {
		p.fail(n, path, field+" must be true or false, not "+describe(n))
		return false, false
	}
	return b, true
}

// whole decodes a whole number from lo to hi.
func (p *parser) whole(n *yaml.Node, path, field string, lo, hi int64) int64 {
	if !p.plain(n, path) {
		return 0
	}
	tag := n.ShortTag()
	if n.Kind != yaml.ScalarNode || tag != "!!int" && !(tag == "!!float" && integral(n.Value)) {
		p.fail(n, path, field+" must be a whole number, not "+describe(n))
		return 0
	}
	var v int64
	if tag != "!!int" || n.Decode(&v) != nil {
		// Digits beyond int64 (YAML calls them a float): say which side.
		v = hi + 1
		if strings.HasPrefix(n.Value, "-") {
			v = lo - 1
		}
	}
	if msg := rangeProblem(field, v, lo, hi); msg != "" {
		p.fail(n, path, msg)
		return 0
	}
	return v
}

// duration decodes a Go duration such as 2s.
func (p *parser) duration(n *yaml.Node, path, field string) time.Duration {
	if !p.plain(n, path) {
		return 0
	}
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!str" {
		if d, err := time.ParseDuration(n.Value); err == nil {
			return d
		}
	}
	p.fail(n, path, field+" must be a duration like 500ms or 2s, not "+describe(n))
	return 0
}

// integral reports whether s is written as an integer: a sign and digits.
func integral(s string) bool {
	digits := strings.TrimLeft(s, "+-")
	return digits != "" && len(s)-len(digits) <= 1 && strings.Trim(digits, "0123456789_") == ""
}

func isNull(n *yaml.Node) bool {
	return n == nil || n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

// describe names what n is, for "must be X, not Y" messages.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!null":
			return "empty"
		case "!!int", "!!float", "!!bool":
			if len(n.Value) <= 32 {
				return n.Value
			}
		}
		return quote(n.Value)
	}
	return "an alias"
}

// unknownField explains an unknown field name. meant is the path, relative
// to the mapping, of the field it probably stands for.
func unknownField(name string, known []string) (msg, meant string) {
	msg = "unknown field " + quote(name)
	at := func(fields []string) bool { return slices.Equal(known, fields) }
	switch {
	case at(descriptorFields) && slices.Contains(rateLimitFields, name):
		return msg + "; it belongs in rate_limit", "rate_limit." + name
	case at(descriptorFields) && slices.Contains(onLimitFields, name):
		return msg + "; it belongs in on_limit", ""
	case at(requestEntryFields) && slices.Contains(sources, Source(name)):
		return msg + "; the source goes in from (from: " + name + ")", "from"
	case at(rateLimitFields) && slices.Contains(descriptorFields, name):
		return msg + "; it belongs on the descriptor, beside rate_limit", ""
	case at(topFields) && slices.Contains(descriptorFields, name):
		return msg + "; it belongs in an item of descriptors", ""
	case !at(topFields) && slices.Contains(topFields, name):
		return msg + "; " + name + " belongs at the top of the file", ""
	}
	if s := suggest(name, known); s != "" {
		return msg + " (did you mean " + quote(s) + "?)", s
	}
	return msg + " (known fields: " + strings.Join(known, ", ") + ")", ""
}

// suggest returns the known name closest to name, if it is close enough to be
// a plausible typo.
func suggest(name string, known []string) string {
	if len(name) > 64 {
		return ""
	}
	norm := func(s string) string {
		return strings.ToLower(strings.NewReplacer("_", "", "-", "", " ", "").Replace(s))
	}
	best, bestD := "", 0
	for _, k := range known {
		if norm(k) == norm(name) {
			return k
		}
		d := distance(name, k)
		if (d <= 2 || d*3 <= len(k) || len(name) >= 3 && strings.HasPrefix(k, name)) && (best == "" || d < bestD) {
			best, bestD = k, d
		}
	}
	return best
}

// distance is the optimal string alignment distance between a and b: edits,
// with a swap of neighbours counting as one.
func distance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

// nodeAt finds the node a path names, or the deepest node on the way there
// when the field is missing, so a "required" problem points at its parent.
func nodeAt(root *yaml.Node, path string) *yaml.Node {
	n := root
	if n == nil || path == "" {
		return n
	}
	for _, seg := range strings.Split(path, ".") {
		name, idx := seg, -1
		if i := strings.IndexByte(seg, '['); i >= 0 && strings.HasSuffix(seg, "]") {
			name = seg[:i]
			idx, _ = strconv.Atoi(seg[i+1 : len(seg)-1])
		}
		next := fieldValue(n, name)
		if next == nil {
			return n
		}
		n = next
		if idx >= 0 {
			if n.Kind != yaml.SequenceNode || idx >= len(n.Content) {
				return n
			}
			n = n.Content[idx]
		}
	}
	return n
}

// fieldValue returns the value of a mapping's field; for a field written with no
// value, its key, which is where the reader looks.
func fieldValue(n *yaml.Node, name string) *yaml.Node {
	if n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if k, v := n.Content[i], n.Content[i+1]; k.Kind == yaml.ScalarNode && k.Value == name {
			if isNull(v) && v.Value == "" {
				return k
			}
			return v
		}
	}
	return nil
}

// parent returns the path one level up: a.b[2] → a.b → a.
func parent(path string) string {
	i := strings.LastIndexAny(path, ".[")
	if i < 0 {
		return ""
	}
	return path[:i]
}

func position(n *yaml.Node) (line, col int) {
	if n == nil || n.Line == 0 {
		return 1, 1
	}
	return n.Line, n.Column
}

// File is one domain's YAML and the name problems give for it.
type File struct {
	Name string
	YAML []byte
}

// ParseAll parses several domain files as Parse does, then checks them
// together as one ruleset: a domain defined in two files is a problem at the
// second. The error is a *ValidationError listing every problem of every
// file, file by file; the domains are returned only when there is none.
func ParseAll(files []File) ([]*Domain, error) {
	return ParseOptions{}.ParseAll(files)
}

// ParseAll is the package's ParseAll, with o.
func (o ParseOptions) ParseAll(files []File) ([]*Domain, error) {
	var problems []Problem
	domains := make([]*Domain, 0, len(files))
	first := map[string]string{} // domain name → file that defines it
	for _, f := range files {
		d, err := o.Parse(f.Name, f.YAML)
		if err != nil {
			var ve *ValidationError
			if !errors.As(err, &ve) {
				return nil, err
			}
			problems = append(problems, ve.Problems...)
			continue
		}
		if other, dup := first[d.Name]; dup {
			root, _, _ := parseYAML(f.YAML)
			line, col := position(nodeAt(root, "domain"))
			problems = append(problems, Problem{File: f.Name, Line: line, Column: col, Path: "domain",
				Message: fmt.Sprintf("domain %s is already defined in %s", quote(d.Name), other)})
			continue
		}
		first[d.Name] = f.Name
		domains = append(domains, d)
	}
	if len(problems) > 0 {
		return nil, &ValidationError{Problems: problems}
	}
	return domains, nil
}
