package api

import (
	"fmt"
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/rules"
)

func TestStructuredDiff(t *testing.T) {
	parse := func(src string) *rules.Domain {
		t.Helper()
		d, err := rules.Parse("d.yaml", []byte(src))
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	old := parse(`domain: api
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 100}
    descriptors:
      - key: route
        value: /search
        rate_limit: {unit: second, requests_per_unit: 5}
  - key: plan
    value: free
    rate_limit: {unit: day, requests_per_unit: 1000}
`)
	cur := parse(`domain: api
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 100}
    burst: 100
    descriptors:
      - key: route
        value: /search
        rate_limit: {unit: second, requests_per_unit: 10}
        shadow_mode: true
  - key: remote_address
    rate_limit: {unlimited: true}
`)
	other := parse("domain: other\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n")
	got := structuredDiff([]*rules.Domain{old, other}, []*rules.Domain{cur})
	var lines []string
	for _, c := range got {
		line := c.Kind + " " + c.Domain + " " + c.Name
		for _, f := range c.Fields {
			line += fmt.Sprintf(" %s:%q>%q", f.Field, f.Before, f.After)
		}
		lines = append(lines, line)
	}
	want := []string{
		// Writing out a default (burst: 100) is no change.
		`limit_changed api api_key.route_/search rate_limit.requests_per_unit:"5">"10" shadow_mode:"">"true" burst:"5">"10"`,
		`limit_removed api plan_free rate_limit.unit:"day">"" rate_limit.requests_per_unit:"1000">"" rate_limit.name:"plan_free">"" algorithm:"token_bucket">"" burst:"1000">"" failure_mode:"open">""`,
		`limit_added api remote_address rate_limit.unlimited:"">"true" rate_limit.name:"">"remote_address"`,
		`domain_removed other `,
		`limit_removed other k rate_limit.unit:"hour">"" rate_limit.requests_per_unit:"1">"" rate_limit.name:"k">"" algorithm:"token_bucket">"" burst:"1">"" failure_mode:"open">""`,
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("structuredDiff:\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
}

func TestUnifiedDiff(t *testing.T) {
	tests := []struct {
		name, a, b, want string
	}{
		{"equal", "x\ny\n", "x\ny\n", ""},
		{"added file", "", "a\nb\n", "--- /dev/null\n+++ b/f\n@@ -0,0 +1,2 @@\n+a\n+b\n"},
		{"removed file", "a\n", "", "--- a/f\n+++ /dev/null\n@@ -1 +0,0 @@\n-a\n"},
		{"change in the middle keeps three lines of context",
			"1\n2\n3\n4\n5\n6\n7\n8\n9\n", "1\n2\n3\n4\nfive\n6\n7\n8\n9\n",
			"--- a/f\n+++ b/f\n@@ -2,7 +2,7 @@\n 2\n 3\n 4\n-5\n+five\n 6\n 7\n 8\n"},
		{"distant changes make two hunks",
			"a\n1\n2\n3\n4\n5\n6\n7\nb\n", "A\n1\n2\n3\n4\n5\n6\n7\nB\n",
			"--- a/f\n+++ b/f\n@@ -1,4 +1,4 @@\n-a\n+A\n 1\n 2\n 3\n@@ -6,4 +6,4 @@\n 5\n 6\n 7\n-b\n+B\n"},
		{"changes six lines apart share a hunk",
			"a\n1\n2\n3\n4\n5\n6\nb\n", "A\n1\n2\n3\n4\n5\n6\nB\n",
			"--- a/f\n+++ b/f\n@@ -1,8 +1,8 @@\n-a\n+A\n 1\n 2\n 3\n 4\n 5\n 6\n-b\n+B\n"},
		{"insertion", "a\nc\n", "a\nb\nc\n", "--- a/f\n+++ b/f\n@@ -1,2 +1,3 @@\n a\n+b\n c\n"},
		{"missing final newline", "a\nb", "a\nb\n",
			"--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of file\n+b\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := unifiedDiff("f", tt.a, tt.b); got != tt.want {
				t.Errorf("unifiedDiff =\n%s\nwant\n%s", got, tt.want)
			}
		})
	}
}

// TestUnifiedDiffApplies checks on random texts that applying the diff to
// the old text gives the new one, and that kept lines are maximal where
// the texts are small enough to align.
func TestUnifiedDiffApplies(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	text := func() string {
		var b strings.Builder
		for range r.IntN(30) {
			fmt.Fprintf(&b, "line %d\n", r.IntN(8))
		}
		if r.IntN(4) == 0 {
			b.WriteString("no newline")
		}
		return b.String()
	}
	for i := range 500 {
		a, b := text(), text()
		d := unifiedDiff("f", a, b)
		got, err := applyUnified(a, d)
		if err != nil || got != b {
			t.Fatalf("case %d: applying\n%s\nto %q gave %q (%v), want %q", i, d, a, got, err, b)
		}
		x, y := splitLines(a), splitLines(b)
		kept := 0
		for _, op := range diffLines(x, y) {
			if op.kind == ' ' {
				kept++
			}
		}
		if want := lcsLen(x, y); kept != want {
			t.Fatalf("case %d: the diff keeps %d lines, but %d are common", i, kept, want)
		}
	}
}

var hunkHeader = regexp.MustCompile(`^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@$`)

// applyUnified applies a unified diff made by unifiedDiff to a.
func applyUnified(a, diff string) (string, error) {
	if diff == "" {
		return a, nil
	}
	old := splitLines(a)
	lines := strings.SplitAfter(diff, "\n")
	var out []string
	next := 0 // index in old of the first line not yet copied
	for i := 2; i < len(lines) && lines[i] != ""; {
		m := hunkHeader.FindStringSubmatch(strings.TrimSuffix(lines[i], "\n"))
		if m == nil {
			return "", fmt.Errorf("bad hunk header %q", lines[i])
		}
		start, _ := strconv.Atoi(m[1])
		if m[2] != "0" {
			start-- // 1-based, except for an empty range
		}
		out = append(out, old[next:start]...)
		next = start
		i++
		for i < len(lines) && lines[i] != "" && !strings.HasPrefix(lines[i], "@@") {
			kind, line := lines[i][0], lines[i][1:]
			if i+1 < len(lines) && lines[i+1] == "\\ No newline at end of file\n" {
				line = strings.TrimSuffix(line, "\n")
				i++
			}
			if kind != '+' {
				if next >= len(old) || old[next] != line {
					return "", fmt.Errorf("line %q of the diff does not match the old text", line)
				}
				next++
			}
			if kind != '-' {
				out = append(out, line)
			}
			i++
		}
	}
	out = append(out, old[next:]...)
	return strings.Join(out, ""), nil
}

// lcsLen is the length of a longest common subsequence, the textbook way.
func lcsLen(x, y []string) int {
	prev := make([]int, len(y)+1)
	for i := range x {
		cur := make([]int, len(y)+1)
		for j := range y {
			if x[i] == y[j] {
				cur[j+1] = prev[j] + 1
			} else {
				cur[j+1] = max(prev[j+1], cur[j])
			}
		}
		prev = cur
	}
	return prev[len(y)]
}
