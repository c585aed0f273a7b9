package rules

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

const unorderedYAML = `domain: edge
descriptors:
  - key: name
    value: checkout
    rate_limit: {unit: minute, requests_per_unit: 100}
    descriptors:
      - key: env
        rate_limit: {unit: minute, requests_per_unit: 10}
  - key: api_key
    descriptors:
      - key: route
        value: /search*
        rate_limit: {unit: second, requests_per_unit: 5}
  - key: route
    value: /admin
    descriptors:
      - key: api_key
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: zone
    descriptors:
      - key: plan
        descriptors:
          - key: user
            rate_limit: {unit: hour, requests_per_unit: 7}
`

func unorderedSet(t testing.TB) *Set {
	t.Helper()
	d, err := Parse("edge.yaml", []byte(unorderedYAML))
	if err != nil {
		t.Fatal(err)
	}
	s, err := Compile([]*Domain{d})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestMatchUnordered(t *testing.T) {
	t.Parallel()
	s := unorderedSet(t)
	for _, tc := range []struct {
		name    string
		domain  string
		in      []Entry
		want    []Entry
		perUnit uint32 // 0: no limit
	}{
		{"one level", "edge", []Entry{{"name", "checkout"}}, []Entry{{"name", "checkout"}}, 100},
		{"nested, given inside out", "edge", []Entry{{"env", "prod"}, {"name", "checkout"}}, []Entry{{"name", "checkout"}, {"env", "prod"}}, 10},
		{"wildcard", "edge", []Entry{{"route", "/search/v2"}, {"api_key", "k1"}}, []Entry{{"api_key", "k1"}, {"route", "/search/v2"}}, 5},
		{"the order the tree has", "edge", []Entry{{"route", "/admin"}, {"api_key", "k1"}}, []Entry{{"route", "/admin"}, {"api_key", "k1"}}, 1},
		{"three levels", "edge", []Entry{{"user", "u"}, {"zone", "z"}, {"plan", "p"}}, []Entry{{"zone", "z"}, {"plan", "p"}, {"user", "u"}}, 7},
		{"path without a limit", "edge", []Entry{{"zone", "z"}, {"plan", "p"}}, []Entry{{"plan", "p"}, {"zone", "z"}}, 0},
		{"unknown key", "edge", []Entry{{"name", "checkout"}, {"color", "red"}}, []Entry{{"color", "red"}, {"name", "checkout"}}, 0},
		{"value no descriptor takes", "edge", []Entry{{"name", "cart"}}, []Entry{{"name", "cart"}}, 0},
		{"unknown domain", "other", []Entry{{"name", "checkout"}}, []Entry{{"name", "checkout"}}, 0},
		{"empty", "edge", nil, []Entry{}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, l := s.MatchUnordered(tc.domain, tc.in)
			if !slices.Equal(got, tc.want) {
				t.Errorf("entries = %v, want %v", got, tc.want)
			}
			switch {
			case tc.perUnit == 0 && l != nil:
				t.Errorf("limit = %+v, want none", l)
			case tc.perUnit != 0 && (l == nil || l.RequestsPerUnit != tc.perUnit):
				t.Errorf("limit = %+v, want %d per unit", l, tc.perUnit)
			case l != nil && s.Match(tc.domain, got) != l:
				t.Errorf("Match of the ordered entries differs from %+v", l)
			}
		})
	}
}

// checkUnordered holds MatchUnordered to its contract for one input: the
// entries come back as a permutation, the limit is Match's for them, and
// any order of the input gives the same answer.
func checkUnordered(t *testing.T, s *Set, domain string, in []Entry) {
	got, l := s.MatchUnordered(domain, in)
	a, b := slices.Clone(in), slices.Clone(got)
	// By key, then value: a separator joining them would be ambiguous, as
	// keys and values may hold any byte.
	less := func(x, y Entry) int { return cmp.Or(strings.Compare(x.Key, y.Key), strings.Compare(x.Value, y.Value)) }
	slices.SortFunc(a, less)
	slices.SortFunc(b, less)
	if !slices.Equal(a, b) {
		t.Fatalf("MatchUnordered(%v) = %v: not a permutation", in, got)
	}
	if l != nil && s.Match(domain, got) != l {
		t.Fatalf("MatchUnordered(%v) = %v, %+v: Match says otherwise", in, got, l)
	}
	shuffled := slices.Clone(in)
	rand.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	got2, l2 := s.MatchUnordered(domain, shuffled)
	if !slices.Equal(got, got2) || l != l2 {
		t.Fatalf("MatchUnordered depends on the input order: %v, %v", got, got2)
	}
}

// FuzzMatchUnordered: entries as "k=v" separated by "&", distinct keys.
func FuzzMatchUnordered(f *testing.F) {
	for _, seed := range []string{"name=checkout&env=prod", "route=/admin&api_key=x", "user=u&plan=p&zone=z", "", "=&=", "a=b&a=c"} {
		f.Add(seed)
	}
	s := unorderedSet(f)
	f.Fuzz(func(t *testing.T, in string) {
		var entries []Entry
		seen := map[string]bool{}
		for _, kv := range strings.Split(in, "&") {
			k, v, _ := strings.Cut(kv, "=")
			if seen[k] {
				continue
			}
			seen[k] = true
			entries = append(entries, Entry{Key: k, Value: v})
		}
		checkUnordered(t, s, "edge", entries)
	})
}

// A tree that nests the same keys in every order costs a bounded search.
func TestMatchUnorderedBounded(t *testing.T) {
	t.Parallel()
	keys := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	var level func(depth int, left []string) []Descriptor
	level = func(depth int, left []string) []Descriptor {
		var ds []Descriptor
		for i, k := range left {
			rest := slices.Delete(slices.Clone(left), i, i+1)
			d := Descriptor{Key: k}
			if len(rest) > 0 && depth < 6 {
				d.Descriptors = level(depth+1, rest)
			}
			ds = append(ds, d)
		}
		return ds
	}
	s, err := Compile([]*Domain{{Name: "d", Descriptors: level(0, keys)}})
	if err != nil {
		t.Fatal(err)
	}
	var in []Entry
	for _, k := range keys {
		in = append(in, Entry{k, "v"})
	}
	if got, l := s.MatchUnordered("d", in); l != nil || len(got) != len(in) {
		t.Fatalf("got %v, %+v; want no limit", got, l)
	}
}
