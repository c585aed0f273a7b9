package api

import (
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
	Name    string            `json:"name"`
	Change  string            `json:"change"`  // added, removed or changed
	Unified string            `json:"unified"` // unified diff of the YAML
	Changes []limitChangeJSON `json:"changes"` // limits added, removed or changed
	// Error is set when one side's YAML no longer parses, so Changes could
	// not be computed (Unified still shows the text).
	Error string `json:"error,omitempty"`
}

// limitChangeJSON is one limit added, removed or changed.
type limitChangeJSON struct {
	Domain string     `json:"domain"`
	Path   string     `json:"path"`
	Change string     `json:"change"` // added, removed or changed
	Before *limitJSON `json:"before,omitempty"`
	After  *limitJSON `json:"after,omitempty"`
	Fields []string   `json:"fields,omitempty"` // what changed, for "changed"
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
		d := domainDiffJSON{Name: n, Change: "changed", Unified: unifiedDiff(n+".yaml", a, b), Changes: []limitChangeJSON{}}
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
			d.Changes = limitChanges(olds, news)
		}
		out = append(out, d)
	}
	return out
}

// limitChanges lists the limits added, removed or changed between two sets
// of domains, by domain and path.
//
// This is the API's own comparison until the rules package exports
// rules.Diff; then the body becomes a conversion of rules.Diff(old, cur).
func limitChanges(old, cur []*rules.Domain) []limitChangeJSON {
	index := func(ds []*rules.Domain) map[string]map[string]limitJSON {
		m := make(map[string]map[string]limitJSON, len(ds))
		for _, d := range ds {
			m[d.Name] = make(map[string]limitJSON)
			for _, l := range limitsOf(d) {
				m[d.Name][l.Path] = l
			}
		}
		return m
	}
	before, after := index(old), index(cur)
	out := []limitChangeJSON{}
	keys := func(m map[string]limitJSON) []string {
		ks := make([]string, 0, len(m))
		for k := range m {
			ks = append(ks, k)
		}
		return ks
	}
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
	for _, d := range domains {
		paths := append(keys(before[d]), keys(after[d])...)
		slices.Sort(paths)
		paths = slices.Compact(paths)
		for _, p := range paths {
			b, inB := before[d][p]
			a, inA := after[d][p]
			switch {
			case !inB:
				out = append(out, limitChangeJSON{Domain: d, Path: p, Change: "added", After: &a})
			case !inA:
				out = append(out, limitChangeJSON{Domain: d, Path: p, Change: "removed", Before: &b})
			default:
				if fields := changedFields(b, a); len(fields) > 0 {
					out = append(out, limitChangeJSON{Domain: d, Path: p, Change: "changed", Before: &b, After: &a, Fields: fields})
				}
			}
		}
	}
	return out
}

func changedFields(a, b limitJSON) []string {
	var out []string
	add := func(name string, differ bool) {
		if differ {
			out = append(out, name)
		}
	}
	add("name", a.Name != b.Name)
	add("unit", a.Unit != b.Unit)
	add("requests_per_unit", a.RequestsPerUnit != b.RequestsPerUnit)
	add("burst", a.Burst != b.Burst)
	add("algorithm", a.Algorithm != b.Algorithm)
	add("unlimited", a.Unlimited != b.Unlimited)
	add("shadow_mode", a.ShadowMode != b.ShadowMode)
	add("detailed_metric", a.DetailedMetric != b.DetailedMetric)
	add("failure_mode", a.FailureMode != b.FailureMode)
	add("replaces", !slices.Equal(a.Replaces, b.Replaces))
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
	fmt.Fprintf(&sb, "--- a/%s\n+++ b/%s\n", name, name)
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
