package rules

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

const overridesBase = `domain: api
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 100}
    algorithm: fixed_window
    descriptors:
      - key: route
        value: /search
        rate_limit: {unit: minute, requests_per_unit: 10}
  - key: plan
    value: free*
    rate_limit: {unit: day, requests_per_unit: 1000, name: free-plan}
`

func TestOverrideMatch(t *testing.T) {
	t.Parallel()
	src := overridesBase + `overrides:
  - entries: [{key: api_key, value: k1}]
    rate_limit: {unit: hour, requests_per_unit: 8}
  - entries: [{key: api_key, value: k2}, {key: route, value: /search}]
    rate_limit: {unit: second, requests_per_unit: 3}
  - entries: [{key: plan, value: free-trial}]
    rate_limit: {unit: day, requests_per_unit: 5000}
`
	d, err := Parse("api.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	set, err := Compile([]*Domain{d})
	if err != nil {
		t.Fatal(err)
	}
	type want struct {
		name string
		unit Unit
		rpu  uint32
	}
	for _, tc := range []struct {
		entries []Entry
		want    want
	}{
		{[]Entry{{"api_key", "k1"}}, want{"api_key", Hour, 8}},
		{[]Entry{{"api_key", "k2"}}, want{"api_key", Minute, 100}},
		{[]Entry{{"api_key", "k1"}, {"route", "/search"}}, want{"api_key.route_/search", Minute, 10}},
		{[]Entry{{"api_key", "k2"}, {"route", "/search"}}, want{"api_key.route_/search", Second, 3}},
		{[]Entry{{"plan", "free-trial"}}, want{"free-plan", Day, 5000}},
		{[]Entry{{"plan", "free-x"}}, want{"free-plan", Day, 1000}},
	} {
		l := set.Match("api", tc.entries)
		if l == nil {
			t.Fatalf("Match(%v) = nil", tc.entries)
		}
		got := want{l.Name, l.Unit, l.RequestsPerUnit}
		if got != tc.want {
			t.Errorf("Match(%v) = %+v, want %+v", tc.entries, got, tc.want)
		}
		if l.Burst != l.RequestsPerUnit || l.Period != l.Unit.Period() {
			t.Errorf("Match(%v): burst %d period %v, want %d and %v", tc.entries, l.Burst, l.Period, l.RequestsPerUnit, l.Unit.Period())
		}
	}
	if l := set.Match("api", []Entry{{"api_key", "k1"}}); l.Algorithm != FixedWindow {
		t.Errorf("override algorithm = %s, want the limit's fixed_window", l.Algorithm)
	}
	// Format keeps the section, and reads back the same.
	again, err := Parse("api.yaml", Format(d))
	if err != nil {
		t.Fatal(err)
	}
	if len(again.Overrides) != 3 || again.Overrides[1].Entries[1].Value != "/search" {
		t.Errorf("Format lost overrides: %+v", again.Overrides)
	}
}

func TestOverrideInvalid(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, section, want string
	}{
		{"no limit", `  - entries: [{key: user, value: u1}]
    rate_limit: {unit: hour, requests_per_unit: 8}`, `overrides[0].entries: entries (user=u1) match no limit in domain "api"`},
		{"no limit at that depth", `  - entries: [{key: api_key, value: k1}, {key: route, value: /other}]
    rate_limit: {unit: hour, requests_per_unit: 8}`, "match no limit"},
		{"no value", `  - entries: [{key: api_key}]
    rate_limit: {unit: hour, requests_per_unit: 8}`, "value is required"},
		{"twice", `  - entries: [{key: api_key, value: k1}]
    rate_limit: {unit: hour, requests_per_unit: 8}
  - entries: [{key: api_key, value: k1}]
    rate_limit: {unit: hour, requests_per_unit: 9}`, "already overridden at overrides[0]"},
		{"bad unit", `  - entries: [{key: api_key, value: k1}]
    rate_limit: {unit: fortnight, requests_per_unit: 8}`, "fortnight"},
		{"no rate", `  - entries: [{key: api_key, value: k1}]`, "rate_limit is required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("api.yaml", []byte(overridesBase+"overrides:\n"+tc.section+"\n"))
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("Parse: %v, want a *ValidationError", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Parse: %v, want %q", err, tc.want)
			}
		})
	}
}

func TestWithOverrides(t *testing.T) {
	t.Parallel()
	ovs := []Override{
		{Entries: []Entry{{"api_key", "k1"}}, Unit: Hour, RequestsPerUnit: 8},
		{Entries: []Entry{{"user", "nobody"}}, Unit: Hour, RequestsPerUnit: 8},
	}
	out, skipped, err := WithOverrides("api.yaml", []byte(overridesBase), ovs, []string{"override 1: ticket 42", "override 2"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(out), overridesBase) {
		t.Errorf("the domain's own lines changed:\n%s", out)
	}
	if len(skipped) != 1 || skipped[0] != 1 {
		t.Errorf("skipped = %v, want [1] (matches no limit)", skipped)
	}
	if !strings.Contains(string(out), "# override 1: ticket 42\n") || strings.Contains(string(out), "override 2") {
		t.Errorf("notes:\n%s", out)
	}
	d, err := Parse("api.yaml", out)
	if err != nil {
		t.Fatalf("Parse(WithOverrides): %v\n%s", err, out)
	}
	if len(d.Overrides) != 1 {
		t.Fatalf("overrides = %+v, want the one that matches", d.Overrides)
	}

	// Nothing applies: the source as it is.
	out, _, err = WithOverrides("api.yaml", []byte(overridesBase), ovs[1:], nil)
	if err != nil || string(out) != overridesBase {
		t.Errorf("WithOverrides(inert) = %q, %v; want the source", out, err)
	}

	// A flow-style document cannot be appended to: written canonically.
	flow := `{domain: api, descriptors: [{key: api_key, rate_limit: {unit: minute, requests_per_unit: 100}}]}`
	out, _, err = WithOverrides("api.yaml", []byte(flow), ovs[:1], nil)
	if err != nil {
		t.Fatal(err)
	}
	if d, err := Parse("api.yaml", out); err != nil || len(d.Overrides) != 1 {
		t.Errorf("flow document: %v, %+v\n%s", err, d, out)
	}
}

// FuzzWithOverrides: for any valid domain and any override, WithOverrides
// never panics, and what it returns parses, keeps the domain's rules, and
// holds the override exactly when its entries match a limit.
func FuzzWithOverrides(f *testing.F) {
	addFixtures(f, func(src []byte) { f.Add(src, "api_key", "k1", "note") })
	f.Add([]byte(overridesBase), "api_key", "k1", "note\nwith a newline")
	f.Add([]byte(overridesBase), "plan", "free-*", "a\r\u2028b # c")
	f.Add([]byte("{domain: a, descriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 1}}]}"), "k", "v", "")
	f.Add([]byte("domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n...\n"), "k", "v", "n")
	f.Fuzz(func(t *testing.T, src []byte, key, value, note string) {
		d, err := Parse("a.yaml", src)
		if err != nil || len(d.Overrides) > 0 {
			return
		}
		o := Override{Entries: []Entry{{Key: key, Value: value}}, Unit: Hour, RequestsPerUnit: 7}
		out, skipped, err := WithOverrides("a.yaml", src, []Override{o}, []string{note})
		if err != nil {
			t.Fatalf("WithOverrides: %v", err)
		}
		got, err := Parse("a.yaml", out)
		if err != nil {
			t.Fatalf("the result does not parse: %v\n%s", err, out)
		}
		if !bytes.Equal(Format(&Domain{Name: got.Name, DefaultAlgorithm: got.DefaultAlgorithm, RequestDescriptors: got.RequestDescriptors, Descriptors: got.Descriptors}), Format(d)) {
			t.Fatalf("the domain's rules changed:\n%s", out)
		}
		if len(skipped) == 0 {
			set, err := Compile([]*Domain{got})
			if err != nil {
				t.Fatal(err)
			}
			if l := set.Match(got.Name, o.Entries); l == nil || l.RequestsPerUnit != 7 || l.Unit != Hour {
				t.Fatalf("the override does not apply: %+v\n%s", l, out)
			}
		} else if len(got.Overrides) != 0 {
			t.Fatalf("a skipped override is in the result:\n%s", out)
		}
	})
}

func TestDiffOverrides(t *testing.T) {
	t.Parallel()
	parse := func(section string) *Domain {
		t.Helper()
		d, err := Parse("api.yaml", []byte(overridesBase+section))
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	a := parse("overrides:\n  - entries: [{key: api_key, value: k1}]\n    rate_limit: {unit: hour, requests_per_unit: 8}\n" +
		"  - entries: [{key: api_key, value: k2}]\n    rate_limit: {unit: hour, requests_per_unit: 8}\n")
	b := parse("overrides:\n  - entries: [{key: api_key, value: k2}]\n    rate_limit: {unit: hour, requests_per_unit: 9}\n" +
		"  - entries: [{key: plan, value: free-trial}]\n    rate_limit: {unit: day, requests_per_unit: 5000}\n")
	var got []string
	for _, c := range Diff([]*Domain{a}, []*Domain{b}) {
		got = append(got, c.String())
	}
	want := []string{
		"api: override (api_key=k2) changed: rate_limit.requests_per_unit 8 → 9",
		"api: override (plan=free-trial) added: rate_limit.unit day, rate_limit.requests_per_unit 5000",
		"api: override (api_key=k1) removed: rate_limit.unit hour, rate_limit.requests_per_unit 8",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("Diff =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
