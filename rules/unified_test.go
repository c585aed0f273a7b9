package rules

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
)

func TestUnifiedDiff(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, old, new, want string
	}{
		{"equal", "a\nb\n", "a\nb\n", ""},
		{"change in the middle", "1\n2\n3\n4\n5\n6\n7\n8\n9\n", "1\n2\n3\n4\nfive\n6\n7\n8\n9\n", `--- a/x.yaml
+++ b/x.yaml
@@ -2,7 +2,7 @@
 2
 3
 4
-5
+five
 6
 7
 8
`},
		{"two hunks", "1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n11\n12\n", "one\n2\n3\n4\n5\n6\n7\n8\n9\n10\n11\ntwelve\n", `--- a/x.yaml
+++ b/x.yaml
@@ -1,4 +1,4 @@
-1
+one
 2
 3
 4
@@ -9,4 +9,4 @@
 9
 10
 11
-12
+twelve
`},
		{"close changes share a hunk", "1\n2\n3\n4\n5\n6\n7\n8\n", "one\n2\n3\n4\n5\n6\n7\neight\n", `--- a/x.yaml
+++ b/x.yaml
@@ -1,8 +1,8 @@
-1
+one
 2
 3
 4
 5
 6
 7
-8
+eight
`},
		{"added", "", "a\nb\n", `--- /dev/null
+++ b/x.yaml
@@ -0,0 +1,2 @@
+a
+b
`},
		{"removed", "a\n", "", `--- a/x.yaml
+++ /dev/null
@@ -1 +0,0 @@
-a
`},
		{"insertion", "a\nb\n", "a\nnew\nb\n", `--- a/x.yaml
+++ b/x.yaml
@@ -1,2 +1,3 @@
 a
+new
 b
`},
		{"no newline at the end", "a\nb", "a\nc", `--- a/x.yaml
+++ b/x.yaml
@@ -1,2 +1,2 @@
 a
-b
\ No newline at end of file
+c
\ No newline at end of file
`},
		{"newline added at the end", "a", "a\n", `--- a/x.yaml
+++ b/x.yaml
@@ -1 +1 @@
-a
\ No newline at end of file
+a
`},
		{"insert after line 5", "1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n", "1\n2\n3\n4\n5\nnew\n6\n7\n8\n9\n10\n", `--- a/x.yaml
+++ b/x.yaml
@@ -3,6 +3,7 @@
 3
 4
 5
+new
 6
 7
 8
`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := UnifiedDiff("x.yaml", tt.old, tt.new)
			if got != tt.want {
				t.Errorf("UnifiedDiff:\n%s\nwant:\n%s", got, tt.want)
			}
			checkPatch(t, tt.old, tt.new, got)
		})
	}
}

// TestUnifiedDiffRandom checks, on random texts, that the diff turns old
// into new and changes no more lines than it must.
func TestUnifiedDiffRandom(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	text := func() string {
		var b strings.Builder
		for range r.IntN(30) {
			b.WriteString(strconv.Itoa(r.IntN(6)) + "\n")
		}
		if r.IntN(4) == 0 {
			b.WriteString("tail")
		}
		return b.String()
	}
	for range 2000 {
		old, new := text(), text()
		checkPatch(t, old, new, UnifiedDiff("r.yaml", old, new))
	}
}

func TestUnifiedDiffLarge(t *testing.T) {
	t.Parallel()
	// Every line differs: the cost bound must keep this quick, and the
	// diff must still be right.
	var a, b strings.Builder
	for i := range 40_000 {
		fmt.Fprintf(&a, "a%d\n", i)
		fmt.Fprintf(&b, "b%d\n", i)
	}
	checkPatch(t, a.String(), b.String(), UnifiedDiff("big.yaml", a.String(), b.String()))
}

// checkPatch applies diff to old and compares with new; it also checks that
// the diff removes and adds no more lines than a minimal one.
func checkPatch(t *testing.T, old, new, diff string) {
	t.Helper()
	got, changed, err := applyUnified(old, diff)
	if err != nil {
		t.Fatalf("bad diff (%v) from %q to %q:\n%s", err, old, new, diff)
	}
	if got != new {
		t.Fatalf("patch(%q) = %q, want %q; diff:\n%s", old, got, new, diff)
	}
	a, b := splitLines(old), splitLines(new)
	if len(a)*len(b) <= 10_000 {
		if want := len(a) + len(b) - 2*lcsLength(a, b); changed != want {
			t.Fatalf("diff from %q to %q changes %d lines; %d would do:\n%s", old, new, changed, want, diff)
		}
	}
}

// applyUnified applies a unified diff; changed counts its - and + lines.
func applyUnified(old, diff string) (string, int, error) {
	if diff == "" {
		return old, 0, nil
	}
	a := splitLines(old)
	lines := splitLines(diff)
	if len(lines) < 2 || !strings.HasPrefix(lines[0], "--- ") || !strings.HasPrefix(lines[1], "+++ ") {
		return "", 0, fmt.Errorf("no header")
	}
	var out []string
	next, changed := 0, 0 // next line of a to copy
	for i := 2; i < len(lines); {
		var aStart, aCount, bStart, bCount int
		h := strings.TrimSuffix(lines[i], "\n")
		parseRange := func(s string) (int, int) {
			start, count, found := strings.Cut(s, ",")
			n, _ := strconv.Atoi(start)
			c := 1
			if found {
				c, _ = strconv.Atoi(count)
			}
			return n, c
		}
		var ar, br string
		if _, err := fmt.Sscanf(h, "@@ -%s +%s @@", &ar, &br); err != nil {
			return "", 0, fmt.Errorf("bad hunk header %q", h)
		}
		aStart, aCount = parseRange(ar)
		bStart, bCount = parseRange(br)
		if aCount > 0 {
			aStart-- // to 0-based
		}
		if aStart < next {
			return "", 0, fmt.Errorf("hunks overlap at %q", h)
		}
		out = append(out, a[next:aStart]...)
		next = aStart
		i++
		seenA, seenB := 0, 0
		for i < len(lines) && !strings.HasPrefix(lines[i], "@@") {
			l := lines[i]
			body := l[1:]
			if i+1 < len(lines) && lines[i+1] == "\\ No newline at end of file\n" {
				body = strings.TrimSuffix(body, "\n")
				i++
			}
			switch l[0] {
			case ' ', '-':
				if next >= len(a) || a[next] != body {
					return "", 0, fmt.Errorf("context mismatch at old line %d", next+1)
				}
				next++
				seenA++
				if l[0] == ' ' {
					out = append(out, body)
					seenB++
				} else {
					changed++
				}
			case '+':
				out = append(out, body)
				seenB++
				changed++
			default:
				return "", 0, fmt.Errorf("bad line %q", l)
			}
			i++
		}
		if seenA != aCount || seenB != bCount {
			return "", 0, fmt.Errorf("hunk %q has %d and %d lines", h, seenA, seenB)
		}
		_ = bStart
	}
	out = append(out, a[next:]...)
	return strings.Join(out, ""), changed, nil
}

func lcsLength(a, b []string) int {
	prev, cur := make([]int, len(b)+1), make([]int, len(b)+1)
	for i := range a {
		for j := range b {
			if a[i] == b[j] {
				cur[j+1] = prev[j] + 1
			} else {
				cur[j+1] = max(cur[j], prev[j+1])
			}
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
