package rules

import (
	"strconv"
	"strings"
)

// UnifiedDiff returns the unified diff (as diff -u prints it, with three
// lines of context) that turns oldYAML into newYAML, with name in the
// "--- a/NAME" and "+++ b/NAME" header lines; an empty side is /dev/null,
// as for an added or removed domain. It returns "" when the texts are equal.
//
// Lines are matched with Myers' algorithm, so the diff is minimal; for
// inputs so different that a minimal diff would cost too much, parts of it
// may show whole blocks replaced instead.
func UnifiedDiff(name, oldYAML, newYAML string) string {
	text, _, _ := unifiedDiff(name, oldYAML, newYAML)
	return text
}

// unifiedDiff is UnifiedDiff with the number of lines added and removed.
func unifiedDiff(name, oldYAML, newYAML string) (text string, added, removed int) {
	if oldYAML == newYAML {
		return "", 0, 0
	}
	a, b := splitLines(oldYAML), splitLines(newYAML)
	ops := lineDiff(a, b)
	for _, o := range ops {
		switch o.kind {
		case '+':
			added++
		case '-':
			removed++
		}
	}

	var out strings.Builder
	from, to := "a/"+name, "b/"+name
	if oldYAML == "" {
		from = "/dev/null"
	}
	if newYAML == "" {
		to = "/dev/null"
	}
	out.WriteString("--- " + from + "\n+++ " + to + "\n")

	const context = 3
	for i := 0; i < len(ops); {
		// Find the next change, and the end of its hunk: changes closer
		// than twice the context share one.
		for i < len(ops) && ops[i].kind == ' ' {
			i++
		}
		if i == len(ops) {
			break
		}
		start := max(i-context, 0)
		end := i
		for j := i; j < len(ops); j++ {
			if ops[j].kind == ' ' {
				continue
			}
			if j-end-1 > 2*context { // more unchanged lines between than two contexts
				break
			}
			end = j
		}
		stop := min(end+context+1, len(ops))
		writeHunk(&out, a, b, ops[start:stop])
		i = stop
	}
	return out.String(), added, removed
}

// op is one line of an edit script: ' ' keeps a[i] (= b[j]), '-' deletes
// a[i], '+' inserts b[j].
type op struct {
	kind byte
	i, j int // the line's index in a and b; for '-' j is where b is, for '+' i is where a is
}

func writeHunk(out *strings.Builder, a, b []string, ops []op) {
	var aCount, bCount int
	for _, o := range ops {
		if o.kind != '+' {
			aCount++
		}
		if o.kind != '-' {
			bCount++
		}
	}
	out.WriteString("@@ -" + hunkRange(ops[0].i, aCount) + " +" + hunkRange(ops[0].j, bCount) + " @@\n")
	for _, o := range ops {
		line := ""
		switch o.kind {
		case '+':
			line = b[o.j]
		default:
			line = a[o.i]
		}
		out.WriteByte(o.kind)
		out.WriteString(line)
		if !strings.HasSuffix(line, "\n") {
			out.WriteString("\n\\ No newline at end of file\n")
		}
	}
}

// hunkRange formats a hunk's line range as diff does: "start,count", with
// ",1" left out, and an empty range naming the line before it.
func hunkRange(start, count int) string {
	switch count {
	case 0:
		return strconv.Itoa(start) + ",0"
	case 1:
		return strconv.Itoa(start + 1)
	}
	return strconv.Itoa(start+1) + "," + strconv.Itoa(count)
}

// splitLines splits s after each "\n"; the last line may lack one.
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

// lineDiff returns an edit script from a to b.
func lineDiff(a, b []string) []op {
	// Compare small integers, not strings.
	ids := map[string]int{}
	id := func(lines []string) []int {
		out := make([]int, len(lines))
		for i, l := range lines {
			n, ok := ids[l]
			if !ok {
				n = len(ids)
				ids[l] = n
			}
			out[i] = n
		}
		return out
	}
	m := &myers{a: id(a), b: id(b)}
	size := len(a) + len(b) + 3
	m.vf, m.vb = make([]int, 2*size), make([]int, 2*size)
	m.matched = make([]int, len(a))
	for i := range m.matched {
		m.matched[i] = -1
	}
	m.compare(0, len(a), 0, len(b))

	ops := make([]op, 0, len(a)+len(b))
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case i < len(a) && m.matched[i] == j:
			ops = append(ops, op{' ', i, j})
			i, j = i+1, j+1
		case i < len(a) && m.matched[i] < 0:
			ops = append(ops, op{'-', i, j})
			i++
		default:
			ops = append(ops, op{'+', i, j})
			j++
		}
	}
	return ops
}

// myers finds a longest common subsequence of a and b with the linear-space
// variant of Myers' O(ND) algorithm ("An O(ND) Difference Algorithm and Its
// Variations", 1986, section 4b).
type myers struct {
	a, b    []int
	vf, vb  []int // furthest reaching x per diagonal, forward and backward
	matched []int // matched[i] is the line of b that a[i] matches, or -1
}

// maxWork bounds the cost, in diagonal steps, of finding one middle snake.
// Beyond it the range is left unmatched: shown as replaced, not minimal.
const maxWork = 50_000_000

func (m *myers) compare(aLo, aHi, bLo, bHi int) {
	for aLo < aHi && bLo < bHi && m.a[aLo] == m.b[bLo] {
		m.matched[aLo] = bLo
		aLo, bLo = aLo+1, bLo+1
	}
	for aLo < aHi && bLo < bHi && m.a[aHi-1] == m.b[bHi-1] {
		aHi, bHi = aHi-1, bHi-1
		m.matched[aHi] = bHi
	}
	if aLo == aHi || bLo == bHi {
		return
	}
	x, y, u, v, ok := m.middleSnake(aLo, aHi, bLo, bHi)
	if !ok {
		return
	}
	m.compare(aLo, x, bLo, y)
	for ; x < u; x, y = x+1, y+1 {
		m.matched[x] = y
	}
	m.compare(u, aHi, v, bHi)
}

// middleSnake finds the middle snake of an optimal path through the edit
// graph of a[aLo:aHi] and b[bLo:bHi]: its start (x, y) and end (u, v). The
// two halves it splits the problem into are each at most half as costly.
func (m *myers) middleSnake(aLo, aHi, bLo, bHi int) (x, y, u, v int, ok bool) {
	n, mm := aHi-aLo, bHi-bLo
	delta := n - mm
	odd := delta%2 != 0
	off := (n+mm+1)/2 + 1 // diagonal k is at index off+k
	vf, vb := m.vf, m.vb
	vf[off+1], vb[off+1] = 0, 0
	for d := 0; d <= (n+mm+1)/2; d++ {
		if d*(n+mm) > maxWork {
			return 0, 0, 0, 0, false
		}
		for k := -d; k <= d; k += 2 {
			var px int
			if k == -d || k != d && vf[off+k-1] < vf[off+k+1] {
				px = vf[off+k+1] // down: an insertion
			} else {
				px = vf[off+k-1] + 1 // right: a deletion
			}
			py := px - k
			sx, sy := px, py
			for px < n && py < mm && m.a[aLo+px] == m.b[bLo+py] {
				px, py = px+1, py+1
			}
			vf[off+k] = px
			// Backward diagonal delta-k was reached in step d-1.
			if odd && -(d-1) <= delta-k && delta-k <= d-1 && px+vb[off+delta-k] >= n {
				return aLo + sx, bLo + sy, aLo + px, bLo + py, true
			}
		}
		for k := -d; k <= d; k += 2 {
			var px int
			if k == -d || k != d && vb[off+k-1] < vb[off+k+1] {
				px = vb[off+k+1]
			} else {
				px = vb[off+k-1] + 1
			}
			py := px - k
			sx, sy := px, py
			for px < n && py < mm && m.a[aHi-1-px] == m.b[bHi-1-py] {
				px, py = px+1, py+1
			}
			vb[off+k] = px
			// Forward diagonal delta-k was reached in this step.
			if !odd && -d <= delta-k && delta-k <= d && px+vf[off+delta-k] >= n {
				return aHi - px, bHi - py, aHi - sx, bHi - sy, true
			}
		}
	}
	return 0, 0, 0, 0, false // not reached: a path always exists
}
