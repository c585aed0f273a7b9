package rules

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// Format returns d's YAML in canonical form: fields in the order of the
// format's definition (see JSONSchema), block style with two-space indents,
// defaults and empty fields left out, units in lower case, a blank line
// between top-level descriptors. Parse(Format(d)) equals d for any d that
// Parse or Compile accepts; for an invalid d the output is best effort.
// Comments are not part of a Domain: FormatSource keeps them.
func Format(d *Domain) []byte {
	out, err := encode(nil, domainNode(d))
	if err != nil {
		// Every scalar is valid UTF-8 text or a number, which the encoder
		// always takes.
		return nil
	}
	return out
}

// ErrCommentsLost is returned by FormatSource when it cannot place the
// source's comments in the canonical form without changing what the
// document means; the canonical form without comments comes with it.
var ErrCommentsLost = errors.New("comments could not be kept")

// FormatSource parses and checks src as Parse does, and returns it in the
// canonical form of Format with its comments kept beside the fields they
// describe (comments on fields that the canonical form leaves out, such as
// shadow_mode: false, move to the next field). On a Parse error it returns
// that error. On ErrCommentsLost it returns the canonical form without
// comments.
func FormatSource(file string, src []byte) ([]byte, error) {
	d, err := Parse(file, src)
	if err != nil {
		return nil, err
	}
	doc, err := domainDocument(src)
	if err != nil {
		return nil, fmt.Errorf("format %s: %w", file, err)
	}
	root := domainNode(d)
	if left := transfer(doc.Content[0], root); left != "" {
		doc.FootComment = joinComments(left, doc.FootComment)
	}
	out, err := encode(doc, root)
	if err == nil {
		// Comments in odd places can make the encoder write YAML that reads
		// back differently; never hand that out.
		if again, perr := Parse(file, out); perr == nil && bytes.Equal(Format(again), Format(d)) {
			return out, nil
		}
	}
	return Format(d), fmt.Errorf("format %s: %w", file, ErrCommentsLost)
}

// domainDocument returns the document node that holds the domain, with the
// comments of the empty documents around it (before a "---", say) added to
// its own.
func domainDocument(src []byte) (*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(src))
	var found *yaml.Node
	var before, after string
	for {
		doc := &yaml.Node{}
		err := dec.Decode(doc)
		switch {
		case errors.Is(err, io.EOF):
			if found == nil {
				return nil, errors.New("no document")
			}
			found.HeadComment = joinComments(before, found.HeadComment)
			found.FootComment = joinComments(found.FootComment, after)
			return found, nil
		case err != nil:
			return nil, err
		case found == nil && len(doc.Content) > 0 && !isNull(doc.Content[0]):
			found = doc
		case found == nil:
			before = joinComments(before, allComments(doc))
		default:
			after = joinComments(after, allComments(doc))
		}
	}
}

// encode writes root as a YAML document, with the document comments of
// doc, and adds blank lines between top-level list items.
func encode(doc *yaml.Node, root *yaml.Node) ([]byte, error) {
	wrapper := &yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{root}}
	if doc != nil && doc.Kind == yaml.DocumentNode {
		wrapper.HeadComment, wrapper.LineComment, wrapper.FootComment = doc.HeadComment, doc.LineComment, doc.FootComment
	}
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(wrapper); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return spaceOut(b.Bytes()), nil
}

// spaceOut adds a blank line before each top-level list item but the first,
// and between top-level lists, above the comments that lead into them. It
// relies on the encoder's layout: top-level keys at column 1, their items at
// "  - ", and everything deeper (block scalars included) further in.
func spaceOut(src []byte) []byte {
	lines := strings.Split(string(src), "\n")
	out := make([]string, 0, len(lines)+len(lines)/4)
	seenItem := false // an item of the current top-level list
	for _, line := range lines {
		var blank bool
		switch {
		case strings.HasPrefix(line, "  - "):
			blank, seenItem = seenItem, true
		case line != "" && line[0] != ' ' && line[0] != '#':
			// A top-level key: after a list, leave a line.
			blank, seenItem = seenItem, false
		}
		if blank {
			// Step back over the comment lines that lead into this line.
			lead := line[:len(line)-len(strings.TrimLeft(line, " "))] + "#"
			i := len(out)
			for i > 0 && strings.HasPrefix(out[i-1], lead) {
				i--
			}
			out = slices.Insert(out, i, "")
		}
		out = append(out, line)
	}
	return []byte(strings.Join(out, "\n"))
}

func domainNode(d *Domain) *yaml.Node {
	m := mappingNode()
	m.add("domain", textNode(d.Name))
	if d.DefaultAlgorithm != "" {
		m.add("default_algorithm", textNode(string(d.DefaultAlgorithm)))
	}
	if len(d.RequestDescriptors) > 0 {
		list := seqNode()
		for _, rd := range d.RequestDescriptors {
			entries := seqNode()
			for _, e := range rd.Entries {
				em := mappingNode()
				em.add("key", textNode(e.Key))
				if e.From != "" {
					em.add("from", textNode(string(e.From)))
				}
				if e.Name != "" {
					em.add("name", textNode(e.Name))
				}
				if e.Value != "" {
					em.add("value", textNode(e.Value))
				}
				entries.Content = append(entries.Content, em.Node)
			}
			item := mappingNode()
			item.add("entries", entries)
			list.Content = append(list.Content, item.Node)
		}
		m.add("request_descriptors", list)
	}
	if len(d.Descriptors) > 0 {
		m.add("descriptors", descriptorsNode(d.Descriptors))
	}
	if len(d.Overrides) > 0 {
		m.add("overrides", overridesNode(d.Overrides))
	}
	return m.Node
}

func descriptorsNode(ds []Descriptor) *yaml.Node {
	list := seqNode()
	for i := range ds {
		list.Content = append(list.Content, descriptorNode(&ds[i]))
	}
	return list
}

// descriptorNode writes d's fields in the order of descriptorFields.
func descriptorNode(d *Descriptor) *yaml.Node {
	m := mappingNode()
	for _, f := range descriptorFields {
		switch f {
		case "key":
			m.add(f, textNode(d.Key))
		case "value":
			if d.Value != "" {
				m.add(f, textNode(d.Value))
			}
		case "rate_limit":
			if d.RateLimit != nil {
				m.add(f, rateLimitNode(d.RateLimit))
			}
		case "shadow_mode":
			m.flag(f, d.ShadowMode)
		case "detailed_metric":
			m.flag(f, d.DetailedMetric)
		case "value_to_metric":
			m.flag(f, d.ValueToMetric)
		case "share_threshold":
			m.flag(f, d.ShareThreshold)
		case "metadata":
			if len(d.Metadata) > 0 {
				var n yaml.Node
				if n.Encode(d.Metadata) == nil {
					m.add(f, &n)
				}
			}
		case "algorithm":
			if d.Algorithm != "" {
				m.add(f, textNode(string(d.Algorithm)))
			}
		case "burst":
			if d.Burst != 0 {
				m.add(f, intNode(int64(d.Burst)))
			}
		case "calendar":
			m.flag(f, d.Calendar)
		case "shards":
			if d.Shards != 0 {
				m.add(f, intNode(int64(d.Shards)))
			}
		case "lease":
			m.flag(f, d.Lease)
		case "consistency":
			if d.Consistency != "" {
				m.add(f, textNode(string(d.Consistency)))
			}
		case "scope":
			if d.Scope != "" {
				m.add(f, textNode(string(d.Scope)))
			}
		case "failure_mode":
			if d.FailureMode != "" {
				m.add(f, textNode(string(d.FailureMode)))
			}
		case "on_limit":
			if ol := d.OnLimit; ol != nil {
				om := mappingNode()
				if ol.Action != "" {
					om.add("action", textNode(string(ol.Action)))
				}
				if ol.MaxDelay != 0 {
					om.add("max_delay", textNode(ol.MaxDelay.String()))
				}
				if ol.Status != 0 {
					om.add("status", intNode(int64(ol.Status)))
				}
				m.add(f, om.Node)
			}
		case "descriptors":
			if len(d.Descriptors) > 0 {
				m.add(f, descriptorsNode(d.Descriptors))
			}
		}
	}
	return m.Node
}

func rateLimitNode(rl *RateLimit) *yaml.Node {
	m := mappingNode()
	if rl.Unit != "" {
		m.add("unit", textNode(string(rl.Unit)))
	}
	if !rl.Unlimited || rl.RequestsPerUnit != 0 {
		// 0 is meaningful (it blocks) and the field is required.
		m.add("requests_per_unit", intNode(int64(rl.RequestsPerUnit)))
	}
	if rl.UnitMultiplier != 0 {
		m.add("unit_multiplier", intNode(int64(rl.UnitMultiplier)))
	}
	m.flag("unlimited", rl.Unlimited)
	if rl.Name != "" {
		m.add("name", textNode(rl.Name))
	}
	if len(rl.Replaces) > 0 {
		list := seqNode()
		for _, r := range rl.Replaces {
			rm := mappingNode()
			rm.add("name", textNode(r))
			list.Content = append(list.Content, rm.Node)
		}
		m.add("replaces", list)
	}
	return m.Node
}

// mapping builds a block mapping node.
type mapping struct{ *yaml.Node }

func mappingNode() mapping { return mapping{&yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}} }

func seqNode() *yaml.Node { return &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"} }

func (m mapping) add(name string, v *yaml.Node) {
	m.Content = append(m.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: name}, v)
}

func (m mapping) flag(name string, on bool) {
	if on {
		m.add(name, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: "true"})
	}
}

// textNode is a string scalar; the encoder quotes it when it would read
// back as something else (a number, a boolean, an alias).
func textNode(s string) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: strings.ToValidUTF8(s, "\uFFFD")}
}

func intNode(v int64) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: strconv.FormatInt(v, 10)}
}

// transfer copies the comments of the source node src, and of its fields
// and items, to dst, which was built from the same domain: a mapping's
// fields by name, a list's items by position. It returns the comments it
// found no place for.
func transfer(src, dst *yaml.Node) (left string) {
	dst.HeadComment, dst.LineComment, dst.FootComment = src.HeadComment, src.LineComment, src.FootComment
	switch {
	case src.Kind == yaml.MappingNode && dst.Kind == yaml.MappingNode:
		pos := make(map[string]int, len(dst.Content)/2)
		for i := 0; i+1 < len(dst.Content); i += 2 {
			pos[dst.Content[i].Value] = i
		}
		last := -1 // the kept key written last in dst's order
		for i := 0; i+1 < len(src.Content); i += 2 {
			k, v := src.Content[i], src.Content[i+1]
			j, ok := pos[k.Value]
			if !ok {
				// A field the canonical form leaves out: its comments go on.
				left = joinComments(left, allComments(k), allComments(v))
				continue
			}
			dk := dst.Content[j]
			dk.HeadComment = joinComments(left, k.HeadComment)
			dk.LineComment, dk.FootComment = k.LineComment, k.FootComment
			dv := dst.Content[j+1]
			left = transfer(v, dv)
			if dv.Kind != yaml.ScalarNode && dv.LineComment != "" {
				// The comment after a flow collection ("rate_limit: {...} # c")
				// belongs after the key in block style.
				dk.LineComment = joinComments(dk.LineComment, dv.LineComment)
				dv.LineComment = ""
			}
			if j > last {
				last = j
			}
			if left != "" {
				dk.FootComment = joinComments(dk.FootComment, left)
				left = ""
			}
		}
		if left != "" && last >= 0 {
			dk := dst.Content[last]
			dk.FootComment = joinComments(dk.FootComment, left)
			left = ""
		}
	case src.Kind == yaml.SequenceNode && dst.Kind == yaml.SequenceNode:
		for i := range min(len(src.Content), len(dst.Content)) {
			item := dst.Content[i]
			if l := transfer(src.Content[i], item); l != "" {
				item.FootComment = joinComments(item.FootComment, l)
			}
			if item.Kind == yaml.MappingNode && len(item.Content) >= 2 && item.LineComment != "" {
				// "- {key: a} # c" becomes "- key: a # c".
				first := item.Content[1]
				if first.Kind != yaml.ScalarNode {
					first = item.Content[0]
				}
				first.LineComment = joinComments(item.LineComment, first.LineComment)
				item.LineComment = ""
			}
		}
	case len(src.Content) > 0:
		// The source wrote a collection where the domain has a scalar (or
		// nothing): keep what it says.
		for _, c := range src.Content {
			left = joinComments(left, allComments(c))
		}
	}
	if dst.Kind == yaml.MappingNode && len(dst.Content) == 0 || dst.Kind == yaml.SequenceNode && len(dst.Content) == 0 {
		// An empty collection is written {} or [], with no room for comments.
		left = joinComments(dst.HeadComment, dst.LineComment, dst.FootComment, left)
		dst.HeadComment, dst.LineComment, dst.FootComment = "", "", ""
	}
	return left
}

// allComments gathers every comment of n and below, in document order.
func allComments(n *yaml.Node) string {
	s := joinComments(n.HeadComment, n.LineComment)
	for _, c := range n.Content {
		s = joinComments(s, allComments(c))
	}
	return joinComments(s, n.FootComment)
}

func joinComments(parts ...string) string {
	var kept []string
	for _, p := range parts {
		if p != "" {
			kept = append(kept, p)
		}
	}
	return strings.Join(kept, "\n")
}
