package rules

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"gopkg.in/yaml.v3"
)

// sameDomain compares domains as Parse would tell them apart: an empty list
// and no list are the same.
var sameDomain = cmpopts.EquateEmpty()

func readFixtures(t *testing.T, pattern string) map[string][]byte {
	t.Helper()
	files, err := filepath.Glob(pattern)
	if err != nil || len(files) == 0 {
		t.Fatalf("no fixtures %s: %v", pattern, err)
	}
	out := make(map[string][]byte, len(files))
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out[f] = src
	}
	return out
}

// TestFormatGolden checks FormatSource against hand-checked outputs.
func TestFormatGolden(t *testing.T) {
	t.Parallel()
	for file, src := range readFixtures(t, "testdata/format/*.yaml") {
		t.Run(filepath.Base(file), func(t *testing.T) {
			want, err := os.ReadFile(strings.TrimSuffix(file, ".yaml") + ".golden")
			if err != nil {
				t.Fatal(err)
			}
			got, err := FormatSource(file, src)
			if err != nil {
				t.Fatalf("FormatSource: %v", err)
			}
			if diff := gocmp.Diff(string(want), string(got)); diff != "" {
				t.Errorf("FormatSource (-want +got):\n%s", diff)
			}
		})
	}
}

// TestFormatRoundTrip checks, for every valid fixture, that Format's output
// parses back to the same domain and is its own canonical form, and that
// FormatSource does the same while keeping every comment.
func TestFormatRoundTrip(t *testing.T) {
	t.Parallel()
	fixtures := readFixtures(t, "testdata/valid/*.yaml")
	for file, src := range readFixtures(t, "testdata/format/*.yaml") {
		fixtures[file] = src
	}
	for file, src := range fixtures {
		t.Run(filepath.Base(file), func(t *testing.T) {
			d, err := Parse(file, src)
			if err != nil {
				t.Fatal(err)
			}
			out := Format(d)
			back, err := Parse(file, out)
			if err != nil {
				t.Fatalf("Parse(Format(d)): %v\n%s", err, out)
			}
			if diff := gocmp.Diff(d, back, sameDomain); diff != "" {
				t.Errorf("Parse(Format(d)) (-d +back):\n%s", diff)
			}
			if again := Format(back); !bytes.Equal(again, out) {
				t.Errorf("Format is not idempotent:\n%s\n---\n%s", out, again)
			}

			withComments, err := FormatSource(file, src)
			if err != nil {
				t.Fatalf("FormatSource: %v", err)
			}
			back, err = Parse(file, withComments)
			if err != nil {
				t.Fatalf("Parse(FormatSource(src)): %v\n%s", err, withComments)
			}
			if diff := gocmp.Diff(d, back, sameDomain); diff != "" {
				t.Errorf("Parse(FormatSource(src)) (-d +back):\n%s", diff)
			}
			if again, err := FormatSource(file, withComments); err != nil || !bytes.Equal(again, withComments) {
				t.Errorf("FormatSource is not idempotent (%v):\n%s\n---\n%s", err, withComments, again)
			}
			if got, want := commentsOf(t, withComments), commentsOf(t, src); !slices.Equal(got, want) {
				t.Errorf("comments changed:\n got %q\nwant %q", got, want)
			}
			if got := Format(d); !bytes.Equal(stripComments(t, withComments), got) {
				t.Errorf("FormatSource without its comments differs from Format:\n%s\n---\n%s", withComments, got)
			}
		})
	}
}

// commentsOf returns every comment line of a YAML document, sorted: the
// formatter may move a comment, never lose or change one.
func commentsOf(t *testing.T, src []byte) []string {
	t.Helper()
	var all []string
	dec := yaml.NewDecoder(bytes.NewReader(src))
	for {
		var doc yaml.Node
		if err := dec.Decode(&doc); err != nil {
			break
		}
		for _, line := range strings.Split(allComments(&doc), "\n") {
			if line = strings.TrimSpace(line); line != "" {
				all = append(all, line)
			}
		}
	}
	slices.Sort(all)
	return all
}

// stripComments re-encodes src without its comments and blank lines, the
// way Format writes it.
func stripComments(t *testing.T, src []byte) []byte {
	t.Helper()
	var doc yaml.Node
	if err := yaml.Unmarshal(src, &doc); err != nil {
		t.Fatal(err)
	}
	var strip func(n *yaml.Node)
	strip = func(n *yaml.Node) {
		n.HeadComment, n.LineComment, n.FootComment = "", "", ""
		for _, c := range n.Content {
			strip(c)
		}
	}
	strip(&doc)
	out, err := encode(nil, doc.Content[0])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestFormatDomain(t *testing.T) {
	t.Parallel()
	d := &Domain{
		Name: "code",
		RequestDescriptors: []RequestDescriptor{
			{Entries: []RequestEntry{{Key: "ip", From: FromRemoteAddress}, {Key: "tier", Value: "gold"}}},
		},
		Descriptors: []Descriptor{
			{Key: "ip", Descriptors: []Descriptor{
				{Key: "tier", Value: "gold", RateLimit: &RateLimit{Unit: Second, RequestsPerUnit: 10, Name: "gold", Replaces: []string{"any"}},
					Algorithm: TokenBucket, Burst: 20, OnLimit: &OnLimit{Action: Delay, MaxDelay: 90 * time.Second / 2}},
			}},
			{Key: "any", RateLimit: &RateLimit{Unit: Day, RequestsPerUnit: 1}},
			{Key: "free", Value: "*", RateLimit: &RateLimit{Unlimited: true}},
		},
	}
	const want = `domain: code
request_descriptors:
  - entries:
      - key: ip
        from: remote_address
      - key: tier
        value: gold

descriptors:
  - key: ip
    descriptors:
      - key: tier
        value: gold
        rate_limit:
          unit: second
          requests_per_unit: 10
          name: gold
          replaces:
            - name: any
        algorithm: token_bucket
        burst: 20
        on_limit:
          action: delay
          max_delay: 45s

  - key: any
    rate_limit:
      unit: day
      requests_per_unit: 1

  - key: free
    value: '*'
    rate_limit:
      unlimited: true
`
	if _, err := Compile([]*Domain{d}); err != nil {
		t.Fatalf("the test domain is invalid: %v", err)
	}
	got := Format(d)
	if diff := gocmp.Diff(want, string(got)); diff != "" {
		t.Errorf("Format (-want +got):\n%s", diff)
	}
	back, err := Parse("code.yaml", got)
	if err != nil {
		t.Fatal(err)
	}
	if diff := gocmp.Diff(d, back, sameDomain); diff != "" {
		t.Errorf("Parse(Format(d)) (-d +back):\n%s", diff)
	}
}

func TestFormatSourceInvalid(t *testing.T) {
	t.Parallel()
	out, err := FormatSource("bad.yaml", []byte("domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"))
	var ve *ValidationError
	if !errors.As(err, &ve) || out != nil {
		t.Fatalf("FormatSource = %q, %v; want a *ValidationError", out, err)
	}
	if got := ve.Problems[0].String(); !strings.HasPrefix(got, "bad.yaml:4:24: ") {
		t.Errorf("problem = %q", got)
	}
}

// TestFormatSourceDocuments checks that comments in empty documents around
// the domain's are kept.
func TestFormatSourceDocuments(t *testing.T) {
	t.Parallel()
	src := "# before\n---\n# head\ndomain: a\n...\n---\n# after\n"
	got, err := FormatSource("a.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	if want := "# before\n# head\ndomain: a\n\n# after\n"; string(got) != want {
		t.Errorf("FormatSource(%q) = %q, want %q", src, got, want)
	}
}
