package ctl

import (
	"strings"
	"testing"

	"github.com/sluicehq/sluice/rules"
)

// TestAddFixedWindow: the key lands on its own line next to the domain, and
// removing that one line gives back the file byte for byte.
func TestAddFixedWindow(t *testing.T) {
	t.Parallel()
	const rest = "descriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"
	for _, tc := range []struct {
		name, src string
		line      int    // 1-based line of the inserted key
		added     string // the inserted line, with its line end
	}{
		{"first line", "domain: a\n" + rest, 2, "default_algorithm: fixed_window\n"},
		{"document marker and comments", "---\n# Lyft\ndomain: a # the domain\n" + rest, 4, "default_algorithm: fixed_window\n"},
		{"quoted", "domain: \"a\"\n" + rest, 2, "default_algorithm: fixed_window\n"},
		{"domain last, no final newline", rest + "domain: a", 5, "default_algorithm: fixed_window\n"},
		{"CRLF", strings.ReplaceAll("domain: a\n"+rest, "\n", "\r\n"), 2, "default_algorithm: fixed_window\r\n"},
		{"block scalar domain", "domain: >-\n  a\n" + rest, 1, "default_algorithm: fixed_window\n"},
		{"indented mapping", "  domain: a\n  descriptors:\n    - key: k\n      rate_limit: {unit: second, requests_per_unit: 1}\n", 2,
			"  default_algorithm: fixed_window\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, changed, err := addFixedWindow([]byte(tc.src))
			if err != nil || !changed {
				t.Fatalf("addFixedWindow = %v, %v", changed, err)
			}
			lines := strings.SplitAfter(string(out), "\n")
			if got := lines[tc.line-1]; got != tc.added {
				t.Fatalf("line %d = %q, want %q\n%s", tc.line, got, tc.added, out)
			}
			back := strings.Join(append(lines[:tc.line-1:tc.line-1], lines[tc.line:]...), "")
			want := tc.src
			if !strings.HasSuffix(want, "\n") {
				want += "\n" // a key after a last line without a line end gives it one
			}
			if back != want {
				t.Fatalf("without the key:\n%q\nwant\n%q", back, want)
			}
			d, err := rules.Parse("x.yaml", out)
			if err != nil {
				t.Fatalf("result does not parse: %v\n%s", err, out)
			}
			if d.DefaultAlgorithm != rules.FixedWindow {
				t.Fatalf("default_algorithm = %q", d.DefaultAlgorithm)
			}
		})
	}

	same := "domain: a\ndefault_algorithm: token_bucket\n" + rest
	if out, changed, err := addFixedWindow([]byte(same)); err != nil || changed || string(out) != same {
		t.Fatalf("a file that sets default_algorithm: %v %v %q", changed, err, out)
	}
	for _, bad := range []string{"{domain: a, descriptors: []}", "- domain: a\n", "descriptors: []\n"} {
		if _, _, err := addFixedWindow([]byte(bad)); err == nil {
			t.Errorf("addFixedWindow(%q): no error", bad)
		}
	}
}
