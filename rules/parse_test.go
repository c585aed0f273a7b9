package rules

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
)

// want is one expected problem, written in a fixture as
// "# want: LINE:COLUMN fragment" where fragment is part of "path: message".
type want struct {
	line, col int
	fragment  string
}

func wantsOf(t *testing.T, src []byte) []want {
	t.Helper()
	var wants []want
	for _, line := range strings.Split(string(src), "\n") {
		rest, ok := strings.CutPrefix(line, "# want: ")
		if !ok {
			continue
		}
		pos, fragment, _ := strings.Cut(rest, " ")
		l, c, _ := strings.Cut(pos, ":")
		ln, err1 := strconv.Atoi(l)
		cn, err2 := strconv.Atoi(c)
		if err1 != nil || err2 != nil {
			t.Fatalf("bad want line %q", line)
		}
		wants = append(wants, want{ln, cn, fragment})
	}
	return wants
}

func problemText(p Problem) string {
	if p.Path == "" {
		return p.Message
	}
	return p.Path + ": " + p.Message
}

// TestParseInvalid checks that every fixture in testdata/invalid yields
// exactly the problems it states, at the stated positions.
func TestParseInvalid(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("testdata/invalid/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no fixtures: %v", err)
	}
	for _, file := range files {
		name := filepath.Base(file)
		t.Run(strings.TrimSuffix(name, ".yaml"), func(t *testing.T) {
			src, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			wants := wantsOf(t, src)
			if len(wants) == 0 {
				t.Fatalf("%s states no # want: line", name)
			}
			d, err := Parse(name, src)
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("Parse = %+v, %v; want a *ValidationError", d, err)
			}
			if d != nil {
				t.Errorf("Parse returned a domain with its error")
			}
			left := ve.Details()
			for _, w := range wants {
				i := -1
				for j, p := range left {
					if p.Line == w.line && p.Column == w.col && strings.Contains(problemText(p), w.fragment) {
						i = j
						break
					}
				}
				if i < 0 {
					t.Errorf("missing problem %d:%d %s", w.line, w.col, w.fragment)
					continue
				}
				if left[i].File != name {
					t.Errorf("problem file = %q, want %q", left[i].File, name)
				}
				left = append(left[:i:i], left[i+1:]...)
			}
			for _, p := range left {
				t.Errorf("unexpected problem %s", p)
			}
			if t.Failed() {
				t.Logf("got:\n%v", err)
			}
		})
	}
}

// TestParseValid checks that every fixture in testdata/valid parses, and that
// Compile accepts what Parse accepts.
func TestParseValid(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("testdata/valid/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no fixtures: %v", err)
	}
	for _, file := range files {
		src, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		d, err := Parse(filepath.Base(file), src)
		if err != nil {
			t.Errorf("Parse(%s): %v", file, err)
			continue
		}
		if _, err := Compile([]*Domain{d}); err != nil {
			t.Errorf("Compile(%s): %v", file, err)
		}
	}
}

func TestParseResult(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile("testdata/valid/sluice.yaml")
	if err != nil {
		t.Fatal(err)
	}
	got, err := Parse("sluice.yaml", src)
	if err != nil {
		t.Fatal(err)
	}
	want := &Domain{
		Name: "api",
		Descriptors: []Descriptor{
			{
				Key:       "api_key",
				RateLimit: &RateLimit{Unit: Minute, RequestsPerUnit: 1000, Name: "per-key"},
				Algorithm: TokenBucket,
				Burst:     200,
				Descriptors: []Descriptor{
					{Key: "route", Value: "/search", RateLimit: &RateLimit{Unit: Minute, RequestsPerUnit: 100}},
				},
			},
			{Key: "plan", Value: "free", RateLimit: &RateLimit{Unit: Day, RequestsPerUnit: 10000}, ShadowMode: true},
			{Key: "remote_address", RateLimit: &RateLimit{Unit: Second, RequestsPerUnit: 10}, FailureMode: FailLocal,
				OnLimit: &OnLimit{Action: Delay, MaxDelay: 2 * time.Second}},
		},
	}
	if diff := gocmp.Diff(want, got); diff != "" {
		t.Errorf("Parse mismatch (-want +got):\n%s", diff)
	}
}

func TestParseScalars(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, yaml string
		want       Descriptor
	}{
		{"number as text", "key: 42\nvalue: 1.5", Descriptor{Key: "42", Value: "1.5"}},
		{"yaml 1.1 booleans", "key: a\nshadow_mode: yes\ndetailed_metric: on", Descriptor{Key: "a", ShadowMode: true, DetailedMetric: true}},
		{"null is absent", "key: a\nvalue: ~\nrate_limit:\ndescriptors:", Descriptor{Key: "a"}},
		{"unit any case", "key: a\nrate_limit: {unit: Hour, requests_per_unit: 0x10}", Descriptor{Key: "a", RateLimit: &RateLimit{Unit: Hour, RequestsPerUnit: 16}}},
		{"underscores", "key: a\nrate_limit: {unit: hour, requests_per_unit: 1_000}", Descriptor{Key: "a", RateLimit: &RateLimit{Unit: Hour, RequestsPerUnit: 1000}}},
		{"most", "key: a\nrate_limit: {unit: year, requests_per_unit: 1000000000}\nburst: 1000000000", Descriptor{Key: "a", Burst: 1e9, RateLimit: &RateLimit{Unit: Year, RequestsPerUnit: 1e9}}},
		{"unlimited", "key: a\nrate_limit: {unlimited: true, name: free}", Descriptor{Key: "a", RateLimit: &RateLimit{Unlimited: true, Name: "free"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := "domain: d\ndescriptors:\n  - " + strings.ReplaceAll(tt.yaml, "\n", "\n    ") + "\n"
			d, err := Parse("t.yaml", []byte(src))
			if err != nil {
				t.Fatalf("Parse(%q): %v", src, err)
			}
			if diff := gocmp.Diff([]Descriptor{tt.want}, d.Descriptors); diff != "" {
				t.Errorf("descriptors (-want +got):\n%s", diff)
			}
		})
	}
}

// TestParseBounds checks the limits that protect against hostile input.
func TestParseBounds(t *testing.T) {
	t.Parallel()
	deep := func(levels int) []byte {
		var b strings.Builder
		b.WriteString("domain: deep\n")
		for i := range levels {
			ind := strings.Repeat("    ", i)
			fmt.Fprintf(&b, "%sdescriptors:\n%s  - key: k%d\n", ind, ind, i)
		}
		return []byte(b.String())
	}
	// many writes parents×(1+children) descriptors in as few bytes as it
	// can: one-letter keys, unique within each parent.
	many := func(parents, children int) []byte {
		const letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
		var b strings.Builder
		b.WriteString("domain: many\ndescriptors:\n")
		for i := range parents {
			fmt.Fprintf(&b, "- {key: p, value: %d, descriptors: [", i)
			for j := range children {
				fmt.Fprintf(&b, "{key: %c},", letters[j])
			}
			b.WriteString("]}\n")
		}
		return []byte(b.String())
	}
	tests := []struct {
		name    string
		src     []byte
		problem string // "" for valid
	}{
		{"16 levels", deep(MaxDepth), ""},
		{"17 levels", deep(MaxDepth + 1), "descriptors nest more than 16 levels deep"},
		{"max descriptors", many(1600, 61), ""},                                                  // 99,200
		{"too many descriptors", many(1700, 60), "a domain may have at most 100000 descriptors"}, // 103,700
		{"too big", append([]byte("domain: big\n#"), make([]byte, MaxSourceBytes)...), "file is 1048589 bytes; the limit is 1048576"},
		{"domain name too long", []byte("domain: " + strings.Repeat("a", 129)), "domain is longer than 128 characters"},
		{"domain name longest", []byte("domain: " + strings.Repeat("a", 128)), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("t.yaml", tt.src)
			if tt.problem == "" {
				if err != nil {
					t.Fatalf("Parse: %v", err)
				}
				return
			}
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("Parse = %v; want a *ValidationError", err)
			}
			if len(ve.Problems) != 1 || !strings.Contains(ve.Problems[0].Message, tt.problem) {
				t.Errorf("problems = %v; want one with %q", ve.Problems, tt.problem)
			}
		})
	}
}

func TestParseManyProblems(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n")
	for range maxProblems + 10 {
		b.WriteString("- {value: v}\n")
	}
	_, err := Parse("t.yaml", []byte(b.String()))
	var ve *ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("Parse = %v; want a *ValidationError", err)
	}
	if got, want := len(ve.Problems), maxProblems+1; got != want {
		t.Fatalf("got %d problems, want %d", got, want)
	}
	if got, want := ve.Problems[maxProblems].Message, "10 more problems not shown"; got != want {
		t.Errorf("last problem = %q, want %q", got, want)
	}
}

func TestProblemString(t *testing.T) {
	t.Parallel()
	tests := []struct {
		p    Problem
		want string
	}{
		{Problem{File: "api.yaml", Line: 7, Column: 13, Path: "descriptors[0].rate_limit.unit", Message: "bad"}, "api.yaml:7:13: descriptors[0].rate_limit.unit: bad"},
		{Problem{File: "api.yaml", Line: 1, Column: 1, Message: "bad"}, "api.yaml:1:1: bad"},
		{Problem{File: "api", Path: "domain", Message: "bad"}, "api: domain: bad"},
		{Problem{Message: "bad"}, "bad"},
	}
	for _, tt := range tests {
		if got := tt.p.String(); got != tt.want {
			t.Errorf("String() = %q, want %q", got, tt.want)
		}
	}
	e := &ValidationError{Problems: []Problem{tests[0].p, tests[1].p}}
	if got, want := e.Error(), tests[0].want+"\n"+tests[1].want; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}

// TestParseSyntax covers syntax errors a fixture file cannot hold: on the
// first line (where yaml.v3 gives no line at all) and in huge files.
func TestParseSyntax(t *testing.T) {
	t.Parallel()
	var big strings.Builder
	big.WriteString("domain: big\ndescriptors:\n")
	for i := 0; big.Len() < MaxSourceBytes-100; i++ {
		fmt.Fprintf(&big, "  - key: k%d\n", i)
	}
	bigLines := strings.Count(big.String(), "\n")
	tests := []struct {
		name     string
		src      string
		problem  string // Problem.String()
		contains bool   // problem is a fragment
	}{
		{"first line", "{domain: a, descriptors: [a", "t.yaml:1:26: YAML syntax error: did not find expected ',' or ']' (an unclosed { or [?)", false},
		{"first line, no newline", "domain: a: b", "t.yaml:1:1: YAML syntax error: mapping values are not allowed in this context", true},
		{"huge, error near the start", "domain: a\ndescriptors:\n - key: a\n  - key: b\n" + big.String()[len("domain: big\ndescriptors:\n"):],
			"t.yaml:4:3: YAML syntax error: did not find expected '-' indicator (check the indentation)", false},
		{"huge, error at the end", big.String() + "   value: x\n",
			fmt.Sprintf("to %d: did not find expected '-' indicator", bigLines+1), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("t.yaml", []byte(tt.src))
			var ve *ValidationError
			if !errors.As(err, &ve) || len(ve.Problems) != 1 {
				t.Fatalf("Parse = %v; want one problem", err)
			}
			got := ve.Problems[0].String()
			if tt.contains && !strings.Contains(got, tt.problem) || !tt.contains && got != tt.problem {
				t.Errorf("problem = %q, want %q", got, tt.problem)
			}
		})
	}
}

// TestParseLineBreaks checks that positions count lines as yaml.v3 does,
// whatever the line breaks.
func TestParseLineBreaks(t *testing.T) {
	t.Parallel()
	const src = "domain: a\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"
	for name, br := range map[string]string{"LF": "\n", "CRLF": "\r\n", "CR": "\r", "NEL": "\u0085", "LS": "\u2028"} {
		t.Run(name, func(t *testing.T) {
			_, err := Parse("t.yaml", []byte(strings.ReplaceAll(src, "\n", br)))
			var ve *ValidationError
			if !errors.As(err, &ve) || len(ve.Problems) != 1 {
				t.Fatalf("Parse = %v; want one problem", err)
			}
			if p := ve.Problems[0]; p.Line != 4 || p.Column != 24 {
				t.Errorf("problem at %d:%d, want 4:24", p.Line, p.Column)
			}
		})
	}
}

func TestParseDocuments(t *testing.T) {
	t.Parallel()
	tests := []struct {
		src, problem string // problem "" for valid
	}{
		{"domain: a\n---\n", ""},
		{"---\ndomain: a\n...\n---\n", ""},
		{"---\n# nothing\n---\ndomain: a\n", ""},
		{"domain: a\n---\n---\nx: 1\n", "t.yaml:4:1: a file holds one domain: remove the second YAML document"},
	}
	for _, tt := range tests {
		_, err := Parse("t.yaml", []byte(tt.src))
		got := ""
		if err != nil {
			got = err.Error()
		}
		if got != tt.problem {
			t.Errorf("Parse(%q) = %q, want %q", tt.src, got, tt.problem)
		}
	}
}

func TestParseAll(t *testing.T) {
	t.Parallel()
	a := File{Name: "a.yaml", YAML: []byte("domain: api\n")}
	b := File{Name: "b.yaml", YAML: []byte("# the same domain again\ndomain:   api\n")}
	bad := File{Name: "bad.yaml", YAML: []byte("domain: web\ndescriptors: 3\n")}
	ok := File{Name: "ok.yaml", YAML: []byte("domain: web\n")}

	ds, err := ParseAll([]File{a, ok})
	if err != nil || len(ds) != 2 || ds[0].Name != "api" || ds[1].Name != "web" {
		t.Fatalf("ParseAll = %v, %v", ds, err)
	}
	_, err = ParseAll([]File{a, bad, b})
	var ve *ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("ParseAll = %v; want a *ValidationError", err)
	}
	want := "bad.yaml:2:14: descriptors: descriptors must be a list, not 3\n" +
		`b.yaml:2:11: domain: domain "api" is already defined in a.yaml`
	if got := err.Error(); got != want {
		t.Errorf("ParseAll error:\n%s\nwant:\n%s", got, want)
	}
}

// TestParseOptionsDefaultAlgorithm: a file without default_algorithm gets
// the option's, and is checked with it in effect; one that sets its own
// keeps it.
func TestParseOptionsDefaultAlgorithm(t *testing.T) {
	t.Parallel()
	fw := ParseOptions{DefaultAlgorithm: FixedWindow}
	d, err := fw.Parse("lyft.yaml", []byte("domain: lyft\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if d.DefaultAlgorithm != FixedWindow {
		t.Errorf("default_algorithm %q, want fixed_window", d.DefaultAlgorithm)
	}
	own, err := fw.Parse("own.yaml", []byte("domain: own\ndefault_algorithm: token_bucket\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n    burst: 10\n"))
	if err != nil || own.DefaultAlgorithm != TokenBucket {
		t.Errorf("a file's own default_algorithm: %v, %v; want token_bucket kept", own, err)
	}
	_, err = fw.Parse("burst.yaml", []byte("domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n    burst: 10\n"))
	if err == nil || !strings.Contains(err.Error(), "burst.yaml:5:12: descriptors[0].burst: burst applies only to token_bucket and leaky_bucket, not to fixed_window") {
		t.Errorf("burst under a fixed_window default: %v, want a positioned problem", err)
	}
	if _, err := Parse("burst.yaml", []byte("domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n    burst: 10\n")); err != nil {
		t.Errorf("the same file without the option: %v", err)
	}
}
