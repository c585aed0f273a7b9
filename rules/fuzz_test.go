package rules

import (
	"bytes"
	"cmp"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// watchdog crashes the fuzzing worker when one input takes longer than
// fuzzTimeout, so the fuzzer records it: every input must take bounded time.
// It is off outside fuzzing, where a loaded machine could trip it.
func watchdog(input any) (stop func()) {
	if f := flag.Lookup("test.fuzz"); f == nil || f.Value.String() == "" {
		return func() {}
	}
	start := time.Now()
	timer := time.AfterFunc(fuzzTimeout, func() {
		panic(fmt.Sprintf("input took more than %s (started %s): %q", fuzzTimeout, start.Format(time.TimeOnly), input))
	})
	return func() { timer.Stop() }
}

const fuzzTimeout = 10 * time.Second

// addFixtures seeds a fuzz corpus with every YAML fixture.
func addFixtures(f *testing.F, add func(src []byte)) {
	files, err := filepath.Glob("testdata/*/*.yaml")
	if err != nil || len(files) == 0 {
		f.Fatalf("no fixtures: %v", err)
	}
	for _, file := range files {
		src, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		add(src)
	}
	add([]byte(matchYAML))
}

// FuzzParse checks that no input panics Parse, that every failure is a
// *ValidationError with positioned problems, and that whatever Parse accepts
// Compile accepts too.
func FuzzParse(f *testing.F) {
	addFixtures(f, func(src []byte) { f.Add(src) })
	f.Add([]byte("domain: a\ndescriptors: [{key: k, value: v*, rate_limit: {unit: second, requests_per_unit: 1}}]"))
	f.Add([]byte("a: &a [*a]"))
	f.Add([]byte("- \x00"))
	f.Add([]byte("{{{{{{{{{{{{{{{{{{{{"))
	f.Add([]byte("domain: a\n---\n---\n"))
	f.Fuzz(func(t *testing.T, src []byte) {
		defer watchdog(src)()
		d, err := Parse("fuzz.yaml", src)
		if err != nil {
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("Parse error is %T, not *ValidationError: %v", err, err)
			}
			if len(ve.Problems) == 0 {
				t.Fatal("a ValidationError without problems")
			}
			lines := len(lineEnds(src)) + 1
			for i, p := range ve.Problems {
				if i == maxProblems {
					break // "N more problems not shown"
				}
				if p.File != "fuzz.yaml" || p.Line < 1 || p.Line > lines || p.Column < 1 || p.Message == "" {
					t.Fatalf("bad problem %+v in a %d-line file", p, lines)
				}
			}
			return
		}
		if d == nil {
			t.Fatal("Parse returned neither a domain nor an error")
		}
		if _, err := Compile([]*Domain{d}); err != nil {
			t.Fatalf("Compile refuses what Parse accepts: %v", err)
		}
	})
}

// FuzzMatch checks Set.Match against matchSlow, a direct reading of the
// matching rules, on fuzzed domains and fuzzed request descriptors (query
// is "k=v" entries separated by ",").
func FuzzMatch(f *testing.F) {
	queries := []string{"api_key=k1", "api_key=k1,route=/api/admin/x", "api_key=vip,route=/search",
		"plan=free,user=u", "tree=ex", "tree=", "leaf=a,more=b", "", ","}
	addFixtures(f, func(src []byte) {
		for _, q := range queries {
			f.Add(src, q)
		}
	})
	fallback, err := Parse("match.yaml", []byte(matchYAML))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, src []byte, query string) {
		defer watchdog(src)()
		d, err := Parse("fuzz.yaml", src)
		if err != nil {
			d = fallback
		}
		s, err := Compile([]*Domain{d})
		if err != nil {
			t.Fatalf("Compile: %v", err)
		}
		es := entries(query)
		if len(es) > 2*MaxDepth {
			return
		}
		got := s.Match(d.Name, es)
		want, ok := matchSlow(d, es)
		switch {
		case ok != (got != nil):
			t.Fatalf("Match(%q) = %+v, want a limit: %t", query, got, ok)
		case ok && got.Name != want.name:
			t.Fatalf("Match(%q) = %q, want %q", query, got.Name, want.name)
		case ok && (got.RequestsPerUnit != want.rl.RequestsPerUnit || got.Unlimited != want.rl.Unlimited):
			t.Fatalf("Match(%q) = %+v, want %+v", query, got, want.rl)
		}
	})
}

type slowMatch struct {
	name string
	rl   *RateLimit
}

// matchSlow is envoyproxy/ratelimit's matching read straight off the rules,
// over the Domain itself, as the oracle for FuzzMatch.
func matchSlow(d *Domain, entries []Entry) (slowMatch, bool) {
	level, name := d.Descriptors, ""
	for i, e := range entries {
		var next *Descriptor
		for j := range level { // exact value
			if level[j].Key == e.Key && level[j].Value != "" && level[j].Value == e.Value {
				next = &level[j]
			}
		}
		if next == nil { // longest wildcard
			longest := -1
			for j := range level {
				v := level[j].Value
				if level[j].Key == e.Key && strings.HasSuffix(v, "*") && strings.HasPrefix(e.Value, v[:len(v)-1]) && len(v) > longest {
					next, longest = &level[j], len(v)
				}
			}
		}
		if next == nil { // any value
			for j := range level {
				if level[j].Key == e.Key && level[j].Value == "" {
					next = &level[j]
				}
			}
		}
		if next == nil {
			return slowMatch{}, false
		}
		name = pathName(name, next)
		if i == len(entries)-1 {
			if next.RateLimit == nil {
				return slowMatch{}, false
			}
			return slowMatch{cmp.Or(next.RateLimit.Name, name), next.RateLimit}, true
		}
		if len(next.Descriptors) == 0 {
			return slowMatch{}, false
		}
		level = next.Descriptors
	}
	return slowMatch{}, false
}

// FuzzFormat checks the formatter on whatever Parse accepts: Format's output
// parses back to the same domain and is its own canonical form, and
// FormatSource keeps the domain and every comment, and is idempotent.
func FuzzFormat(f *testing.F) {
	addFixtures(f, func(src []byte) { f.Add(src) })
	f.Add([]byte("domain: a # c\ndescriptors: [{key: k, value: '*', rate_limit: {unit: SECOND, requests_per_unit: 0}}] # d\n"))
	f.Add([]byte("# a\n---\ndomain: a\n...\n# b\n"))
	f.Fuzz(func(t *testing.T, src []byte) {
		defer watchdog(src)()
		d, err := Parse("fuzz.yaml", src)
		if err != nil {
			return
		}
		out := Format(d)
		back, err := Parse("fuzz.yaml", out)
		if err != nil {
			t.Fatalf("Parse(Format(d)): %v\n%s", err, out)
		}
		if diff := gocmp.Diff(d, back, cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("Parse(Format(d)) differs (-d +back):\n%s\n%s", diff, out)
		}
		if again := Format(back); !bytes.Equal(again, out) {
			t.Fatalf("Format is not idempotent:\n%s\n---\n%s", out, again)
		}

		kept, err := FormatSource("fuzz.yaml", src)
		if err != nil {
			t.Fatalf("FormatSource: %v\n%q", err, src)
		}
		if again, err := FormatSource("fuzz.yaml", kept); err != nil || !bytes.Equal(again, kept) {
			t.Fatalf("FormatSource is not idempotent (%v):\n%q\n---\n%q", err, kept, again)
		}
		if got, want := commentsOf(t, kept), commentsOf(t, src); !slices.Equal(got, want) {
			t.Fatalf("comments changed:\n got %q\nwant %q", got, want)
		}
	})
}

// FuzzUnifiedDiff checks that a diff between any two texts applies, turning
// the first into the second, and is minimal for small inputs.
func FuzzUnifiedDiff(f *testing.F) {
	f.Add("a\nb\nc\n", "a\nc\nd")
	f.Add("", "x\n")
	f.Add("1\n2\n3\n4\n5\n6\n7\n8\n9\n", "1\n2\n3\n4\n5\n6\n7\n8\n9")
	f.Fuzz(func(t *testing.T, old, new string) {
		defer watchdog(old + "\x00" + new)()
		checkPatch(t, old, new, UnifiedDiff("f.yaml", old, new))
	})
}
