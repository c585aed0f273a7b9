package api

import (
	"cmp"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/rules"
)

// diffJSON is the difference between two rulesets, per domain.
type diffJSON struct {
	From    int64            `json:"from"`
	To      int64            `json:"to"`
	Domains []domainDiffJSON `json:"domains"` // only domains that differ, by name
}

type domainDiffJSON struct {
	Name    string       `json:"name"`
	Change  string       `json:"change"`  // added, removed or changed
	Unified string       `json:"unified"` // unified diff of the YAML
	Changes []changeJSON `json:"changes"` // structured: domain and limits added, removed or changed
	// Error is set when one side's YAML no longer parses, so Changes could
	// not be computed (Unified still shows the text).
	Error string `json:"error,omitempty"`
}

// changeJSON is one difference between two rulesets: a domain added or
// removed, or a limit added, removed or changed with each differing setting
// before and after (as text, "" meaning not set). It has the shape of
// rules.Change, so that the rules package's Diff can fill it.
type changeJSON struct {
	Kind   string            `json:"kind"` // domain_added, domain_removed, limit_added, limit_removed, limit_changed
	Domain string            `json:"domain"`
	Path   []entryJSON       `json:"path,omitempty"` // the descriptors leading to the limit
	Name   string            `json:"name,omitempty"` // the limit's name
	Fields []fieldChangeJSON `json:"fields,omitempty"`
}

type entryJSON struct {
	Key   string `json:"key"`
	Value string `json:"value,omitempty"`
}

type fieldChangeJSON struct {
	Field  string `json:"field"` // as in the YAML, like rate_limit.requests_per_unit
	Before string `json:"before"`
	After  string `json:"after"`
}

// pathVersion reads a version number; 0 means the empty ruleset before the
// first version.
func pathVersion(c *gin.Context, name string) (int64, error) {
	n, err := strconv.ParseInt(c.Param(name), 10, 64)
	if err != nil || n < 0 {
		return 0, badRequest("%s must be a version number (0 for the empty ruleset)", name)
	}
	return n, nil
}

func (a *API) snapshot(c *gin.Context, v int64) ([]store.DomainRevision, error) {
	if v == 0 {
		return nil, nil // FindSnapshot(0) is the latest; 0 here is "nothing yet"
	}
	s, err := a.store.FindSnapshot(c, v)
	return s.Domains, err
}

// diffVersions answers GET /versions/{a}/diff/{b}: what changed from a to b.
func (a *API) diffVersions(c *gin.Context) {
	from, err := pathVersion(c, "n")
	if err != nil {
		a.fail(c, err)
		return
	}
	to, err := pathVersion(c, "m")
	if err != nil {
		a.fail(c, err)
		return
	}
	old, err := a.snapshot(c, from)
	if err != nil {
		a.fail(c, err)
		return
	}
	cur, err := a.snapshot(c, to)
	if err != nil {
		a.fail(c, err)
		return
	}
	c.JSON(http.StatusOK, diffJSON{From: from, To: to, Domains: diffDomains(old, cur)})
}

// diffDomains compares two rulesets domain by domain.
func diffDomains(old, cur []store.DomainRevision) []domainDiffJSON {
	before := make(map[string]string, len(old))
	for _, d := range old {
		before[d.Name] = d.YAML
	}
	after := make(map[string]string, len(cur))
	for _, d := range cur {
		after[d.Name] = d.YAML
	}
	var names []string
	for n := range before {
		names = append(names, n)
	}
	for n := range after {
		if _, ok := before[n]; !ok {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	out := []domainDiffJSON{}
	for _, n := range names {
		a, inA := before[n]
		b, inB := after[n]
		if inA && inB && a == b {
			continue
		}
		d := domainDiffJSON{Name: n, Change: "changed", Unified: unifiedDiff(n+".yaml", a, b), Changes: []changeJSON{}}
		switch {
		case !inA:
			d.Change = "added"
		case !inB:
			d.Change = "removed"
		}
		var olds, news []*rules.Domain
		for _, side := range []struct {
			src     string
			present bool
			into    *[]*rules.Domain
		}{{a, inA, &olds}, {b, inB, &news}} {
			if !side.present {
				continue
			}
			dom, err := rules.Parse(n+".yaml", []byte(side.src))
			if err != nil {
				d.Error = "the rules no longer parse: " + err.Error()
				break
			}
			*side.into = append(*side.into, dom)
		}
		if d.Error == "" {
			d.Changes = structuredDiff(olds, news)
		}
		out = append(out, d)
	}
	return out
}

// structuredDiff lists the changes from the domains old to the domains cur:
// domains added and removed (followed by their limits), then limits added,
// removed and changed, by domain and descriptor path. Settings are compared
// with defaults resolved.
//
// This is the API's own comparison until the rules package exports
// rules.Diff, whose Change has the same shape; then the body becomes a copy
// of rules.Diff(old, cur) into []changeJSON.
func structuredDiff(old, cur []*rules.Domain) []changeJSON {
	index := func(ds []*rules.Domain) map[string][]pathLimit {
		m := make(map[string][]pathLimit, len(ds))
		for _, d := range ds {
			m[d.Name] = pathLimits(d)
		}
		return m
	}
	before, after := index(old), index(cur)
	var domains []string
	for d := range before {
		domains = append(domains, d)
	}
	for d := range after {
		if _, ok := before[d]; !ok {
			domains = append(domains, d)
		}
	}
	slices.Sort(domains)
	out := []changeJSON{}
	for _, d := range domains {
		b, inB := before[d]
		a, inA := after[d]
		switch {
		case !inB:
			out = append(out, changeJSON{Kind: "domain_added", Domain: d})
		case !inA:
			out = append(out, changeJSON{Kind: "domain_removed", Domain: d})
		}
		out = append(out, limitDiff(d, b, a)...)
	}
	return out
}

// pathLimit is a limit with the descriptor path that leads to it.
type pathLimit struct {
	path  []entryJSON
	limit limitJSON
}

func pathLimits(d *rules.Domain) []pathLimit {
	var out []pathLimit
	var walk func(ds []rules.Descriptor, path []entryJSON)
	walk = func(ds []rules.Descriptor, path []entryJSON) {
		for _, desc := range ds {
			p := append(path[:len(path):len(path)], entryJSON{Key: desc.Key, Value: desc.Value})
			if desc.RateLimit != nil {
				out = append(out, pathLimit{p, limitOf(desc, pathName(p))})
			}
			walk(desc.Descriptors, p)
		}
	}
	walk(d.Descriptors, nil)
	return out
}

func pathName(p []entryJSON) string {
	parts := make([]string, len(p))
	for i, e := range p {
		parts[i] = e.Key
		if e.Value != "" {
			parts[i] += "_" + e.Value
		}
	}
	return strings.Join(parts, ".")
}

// pathKey identifies a path without ambiguity, whatever keys and values hold.
func pathKey(p []entryJSON) string {
	var b strings.Builder
	for _, e := range p {
		b.WriteString(strconv.Quote(e.Key))
		b.WriteString(strconv.Quote(e.Value))
	}
	return b.String()
}

func limitDiff(domain string, before, after []pathLimit) []changeJSON {
	byPath := func(ls []pathLimit) map[string]pathLimit {
		m := make(map[string]pathLimit, len(ls))
		for _, l := range ls {
			m[pathKey(l.path)] = l
		}
		return m
	}
	b, a := byPath(before), byPath(after)
	var out []changeJSON
	for k, old := range b {
		if cur, ok := a[k]; !ok {
			out = append(out, changeJSON{Kind: "limit_removed", Domain: domain, Path: old.path, Name: old.limit.Name,
				Fields: fieldChanges(limitFields(&old.limit), nil)})
		} else if fs := fieldChanges(limitFields(&old.limit), limitFields(&cur.limit)); len(fs) > 0 {
			out = append(out, changeJSON{Kind: "limit_changed", Domain: domain, Path: cur.path, Name: cur.limit.Name, Fields: fs})
		}
	}
	for k, cur := range a {
		if _, ok := b[k]; !ok {
			out = append(out, changeJSON{Kind: "limit_added", Domain: domain, Path: cur.path, Name: cur.limit.Name,
				Fields: fieldChanges(nil, limitFields(&cur.limit))})
		}
	}
	slices.SortFunc(out, func(x, y changeJSON) int { return comparePaths(x.Path, y.Path) })
	return out
}

func comparePaths(a, b []entryJSON) int {
	for i := range min(len(a), len(b)) {
		if c := cmp.Or(strings.Compare(a[i].Key, b[i].Key), strings.Compare(a[i].Value, b[i].Value)); c != 0 {
			return c
		}
	}
	return cmp.Compare(len(a), len(b))
}

// limitFields lists a limit's settings as text, in the format's field
// order; "" means not set. An unlimited limit has no other settings.
func limitFields(l *limitJSON) []fieldChangeJSON {
	flag := func(on bool) string {
		if on {
			return "true"
		}
		return ""
	}
	num := func(n uint32) string { return strconv.FormatUint(uint64(n), 10) }
	f := []fieldChangeJSON{
		{Field: "rate_limit.unit", After: l.Unit},
		{Field: "rate_limit.requests_per_unit", After: num(l.RequestsPerUnit)},
		{Field: "rate_limit.unlimited", After: flag(l.Unlimited)},
		{Field: "rate_limit.name", After: l.Name},
		{Field: "rate_limit.replaces", After: strings.Join(l.Replaces, ", ")},
		{Field: "shadow_mode", After: flag(l.ShadowMode)},
		{Field: "detailed_metric", After: flag(l.DetailedMetric)},
	}
	if l.Unlimited {
		f[1].After = ""
		return f
	}
	return append(f,
		fieldChangeJSON{Field: "algorithm", After: l.Algorithm},
		fieldChangeJSON{Field: "burst", After: num(l.Burst)},
		fieldChangeJSON{Field: "failure_mode", After: l.FailureMode},
	)
}

// fieldChanges pairs two field lists (either may be nil) and keeps the
// fields whose values differ.
func fieldChanges(before, after []fieldChangeJSON) []fieldChangeJSON {
	values := func(fs []fieldChangeJSON) map[string]string {
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
	var out []fieldChangeJSON
	for _, f := range order {
		if b[f.Field] != a[f.Field] {
			out = append(out, fieldChangeJSON{Field: f.Field, Before: b[f.Field], After: a[f.Field]})
		}
	}
	return out
}

// diffContext is the number of unchanged lines around each hunk.
const diffContext = 3

// maxDiffCells bounds the work of the line diff: past it, the differing
// middle of two texts is shown as removed and re-added rather than aligned.
const maxDiffCells = 1 << 21

// unifiedDiff renders the line difference of a and b in unified format with
// three lines of context, "" when they are equal.
//
// This is the API's own line diff until the rules package exports
// rules.UnifiedDiff; then the body becomes rules.UnifiedDiff(name, a, b).
func unifiedDiff(name, a, b string) string {
	if a == b {
		return ""
	}
	x, y := splitLines(a), splitLines(b)
	ops := diffLines(x, y)
	var sb strings.Builder
	from, to := "a/"+name, "b/"+name
	if a == "" {
		from = "/dev/null" // as diff -u prints an added or removed file
	}
	if b == "" {
		to = "/dev/null"
	}
	fmt.Fprintf(&sb, "--- %s\n+++ %s\n", from, to)
	for start := 0; start < len(ops); {
		// Find the next change, then extend the hunk while the next change
		// is close enough for the contexts to touch.
		first := start
		for first < len(ops) && ops[first].kind == ' ' {
			first++
		}
		if first == len(ops) {
			break
		}
		last := first
		for i := first; i < len(ops); i++ {
			if ops[i].kind != ' ' {
				if i-last-1 > 2*diffContext {
					break
				}
				last = i
			}
		}
		lo, hi := max(start, first-diffContext), min(len(ops), last+1+diffContext)
		var oldN, newN int
		for _, o := range ops[lo:hi] {
			if o.kind != '+' {
				oldN++
			}
			if o.kind != '-' {
				newN++
			}
		}
		fmt.Fprintf(&sb, "@@ -%s +%s @@\n", hunkRange(ops[lo].i, oldN), hunkRange(ops[lo].j, newN))
		for _, o := range ops[lo:hi] {
			line := o.line
			sb.WriteByte(o.kind)
			sb.WriteString(line)
			if !strings.HasSuffix(line, "\n") {
				sb.WriteString("\n\\ No newline at end of file\n")
			}
		}
		start = hi
	}
	return sb.String()
}

func hunkRange(start, n int) string {
	if n == 0 {
		return fmt.Sprintf("%d,0", start) // an empty range names the line before it
	}
	if n == 1 {
		return strconv.Itoa(start + 1)
	}
	return fmt.Sprintf("%d,%d", start+1, n)
}

func splitLines(s string) []string {
	if s == "" {
		return nil
	}
	lines := strings.SplitAfter(s, "\n")
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	return lines
}

// diffOp is one line of an edit script: ' ' kept, '-' removed, '+' added;
// i and j are the positions in the old and new text where it applies.
type diffOp struct {
	kind byte
	line string
	i, j int
}

// diffLines computes a shortest edit script from x to y: a longest common
// subsequence over the part between the common prefix and suffix.
func diffLines(x, y []string) []diffOp {
	pre := 0
	for pre < len(x) && pre < len(y) && x[pre] == y[pre] {
		pre++
	}
	suf := 0
	for suf < len(x)-pre && suf < len(y)-pre && x[len(x)-1-suf] == y[len(y)-1-suf] {
		suf++
	}
	ops := make([]diffOp, 0, len(x)+len(y))
	for k := range pre {
		ops = append(ops, diffOp{' ', x[k], k, k})
	}
	xm, ym := x[pre:len(x)-suf], y[pre:len(y)-suf]
	n, m := len(xm), len(ym)
	i, j := 0, 0
	if n > 0 && m > 0 && n*m <= maxDiffCells {
		// lcs[i*(m+1)+j] is the LCS length of xm[i:] and ym[j:].
		w := m + 1
		lcs := make([]int32, (n+1)*w)
		for a := n - 1; a >= 0; a-- {
			for b := m - 1; b >= 0; b-- {
				if xm[a] == ym[b] {
					lcs[a*w+b] = lcs[(a+1)*w+b+1] + 1
				} else {
					lcs[a*w+b] = max(lcs[(a+1)*w+b], lcs[a*w+b+1])
				}
			}
		}
		for i < n && j < m {
			switch {
			case xm[i] == ym[j]:
				ops = append(ops, diffOp{' ', xm[i], pre + i, pre + j})
				i, j = i+1, j+1
			case lcs[(i+1)*w+j] >= lcs[i*w+j+1]:
				ops = append(ops, diffOp{'-', xm[i], pre + i, pre + j})
				i++
			default:
				ops = append(ops, diffOp{'+', ym[j], pre + i, pre + j})
				j++
			}
		}
	}
	for ; i < n; i++ {
		ops = append(ops, diffOp{'-', xm[i], pre + i, pre + j})
	}
	for ; j < m; j++ {
		ops = append(ops, diffOp{'+', ym[j], pre + n, pre + j})
	}
	for k := range suf {
		ops = append(ops, diffOp{' ', x[len(x)-suf+k], len(x) - suf + k, len(y) - suf + k})
	}
	return ops
}
