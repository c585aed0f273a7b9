package rules

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	gocmp "github.com/google/go-cmp/cmp"
)

func mustParse(t *testing.T, src string) *Domain {
	t.Helper()
	d, err := Parse("t.yaml", []byte(src))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return d
}

func TestDiff(t *testing.T) {
	t.Parallel()
	api := mustParse(t, `domain: api
request_descriptors:
  - entries: [{key: api_key, from: header, name: X-API-Key}]
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 100}
    descriptors:
      - key: route
        value: /search
        rate_limit: {unit: minute, requests_per_unit: 10}
  - key: plan
    value: free
    rate_limit: {unit: day, requests_per_unit: 1000}
  - key: gone
    rate_limit: {unlimited: true}
`)
	api2 := mustParse(t, `domain: api
request_descriptors:
  - entries: [{key: api_key, from: header, name: Authorization}]
  - entries: [{key: plan, value: free}]
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 100}
    algorithm: token_bucket     # the default, written out: no change
    descriptors:
      - key: route
        value: /search
        rate_limit: {unit: minute, requests_per_unit: 20, name: search}
        algorithm: leaky_bucket
        on_limit: {action: delay, max_delay: 1s}
  - key: plan
    value: free
    rate_limit: {unit: day, requests_per_unit: 1000}
  - key: new
    rate_limit: {unit: second, requests_per_unit: 5}
`)
	web := mustParse(t, "domain: web\ndescriptors:\n  - key: ip\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	old := mustParse(t, "domain: old\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 2}\n")

	got := Diff([]*Domain{api, old, nil}, []*Domain{web, api2})
	added := func(field, after string) FieldChange { return FieldChange{Field: field, After: after} }
	want := []Change{
		{Kind: RequestDescriptorsChanged, Domain: "api", Fields: []FieldChange{
			{Field: "request_descriptors[0]", Before: "api_key=header:X-API-Key", After: "api_key=header:Authorization"},
			{Field: "request_descriptors[1]", After: `plan="free"`},
		}},
		{Kind: LimitChanged, Domain: "api", Path: []Entry{{Key: "api_key"}, {Key: "route", Value: "/search"}}, Name: "search", Fields: []FieldChange{
			{Field: "rate_limit.requests_per_unit", Before: "10", After: "20"},
			{Field: "rate_limit.name", Before: "api_key.route_/search", After: "search"},
			{Field: "algorithm", Before: "token_bucket", After: "leaky_bucket"},
			{Field: "burst", Before: "10", After: "20"},
			{Field: "on_limit.action", Before: "reject", After: "delay"},
			{Field: "on_limit.max_delay", After: "1s"},
		}},
		{Kind: LimitRemoved, Domain: "api", Path: []Entry{{Key: "gone"}}, Name: "gone", Fields: []FieldChange{
			{Field: "rate_limit.unlimited", Before: "true"},
			{Field: "rate_limit.name", Before: "gone"},
		}},
		{Kind: LimitAdded, Domain: "api", Path: []Entry{{Key: "new"}}, Name: "new", Fields: []FieldChange{
			added("rate_limit.unit", "second"), added("rate_limit.requests_per_unit", "5"), added("rate_limit.name", "new"),
			added("algorithm", "token_bucket"), added("burst", "5"), added("shards", "1"), added("failure_mode", "open"),
			added("on_limit.action", "reject"), added("on_limit.status", "429"),
		}},
		{Kind: DomainRemoved, Domain: "old"},
		{Kind: LimitRemoved, Domain: "old", Path: []Entry{{Key: "k"}}, Name: "k", Fields: []FieldChange{
			{Field: "rate_limit.unit", Before: "hour"}, {Field: "rate_limit.requests_per_unit", Before: "2"}, {Field: "rate_limit.name", Before: "k"},
			{Field: "algorithm", Before: "token_bucket"}, {Field: "burst", Before: "2"}, {Field: "shards", Before: "1"}, {Field: "failure_mode", Before: "open"},
			{Field: "on_limit.action", Before: "reject"}, {Field: "on_limit.status", Before: "429"},
		}},
		{Kind: DomainAdded, Domain: "web"},
		{Kind: LimitAdded, Domain: "web", Path: []Entry{{Key: "ip"}}, Name: "ip", Fields: []FieldChange{
			added("rate_limit.unit", "second"), added("rate_limit.requests_per_unit", "1"), added("rate_limit.name", "ip"),
			added("algorithm", "token_bucket"), added("burst", "1"), added("shards", "1"), added("failure_mode", "open"),
			added("on_limit.action", "reject"), added("on_limit.status", "429"),
		}},
	}
	if diff := gocmp.Diff(want, got); diff != "" {
		t.Errorf("Diff (-want +got):\n%s", diff)
	}

	// Stable: the same inputs give the same changes, in the same order.
	for range 20 {
		if again := Diff([]*Domain{api, old}, []*Domain{web, api2}); !gocmp.Equal(got, again) {
			t.Fatalf("Diff is not stable:\n%v\n%v", got, again)
		}
	}
	if d := Diff([]*Domain{api, web}, []*Domain{web, api}); d != nil {
		t.Errorf("Diff of equal rulesets = %v", d)
	}
}

func TestDiffLimitBecomesUnlimited(t *testing.T) {
	t.Parallel()
	a := mustParse(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n    shards: 2\n")
	b := mustParse(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true}\n    shadow_mode: true\n")
	got := Diff([]*Domain{a}, []*Domain{b})
	want := []Change{{Kind: LimitChanged, Domain: "d", Path: []Entry{{Key: "k"}}, Name: "k", Fields: []FieldChange{
		{Field: "rate_limit.unit", Before: "second"},
		{Field: "rate_limit.requests_per_unit", Before: "5"},
		{Field: "rate_limit.unlimited", After: "true"},
		{Field: "shadow_mode", After: "true"},
		{Field: "algorithm", Before: "token_bucket"},
		{Field: "burst", Before: "5"},
		{Field: "shards", Before: "2"},
		{Field: "failure_mode", Before: "open"},
		{Field: "on_limit.action", Before: "reject"},
		{Field: "on_limit.status", Before: "429"},
	}}}
	if diff := gocmp.Diff(want, got); diff != "" {
		t.Errorf("Diff (-want +got):\n%s", diff)
	}
}

func TestDiffPathsAreExact(t *testing.T) {
	t.Parallel()
	// Lyft-style names collide ("a_b" key vs key a with value b); paths do not.
	a := mustParse(t, "domain: d\ndescriptors:\n  - key: a_b\n    rate_limit: {unit: second, requests_per_unit: 1, name: x}\n")
	b := mustParse(t, "domain: d\ndescriptors:\n  - key: a\n    value: b\n    rate_limit: {unit: second, requests_per_unit: 1, name: x}\n")
	got := Diff([]*Domain{a}, []*Domain{b})
	if len(got) != 2 || got[0].Kind != LimitAdded || got[1].Kind != LimitRemoved {
		t.Errorf("Diff = %v; want the a=b limit added and a_b removed", got)
	}
}

func TestChangeJSON(t *testing.T) {
	t.Parallel()
	c := Change{Kind: LimitChanged, Domain: "api", Path: []Entry{{Key: "api_key"}, {Key: "route", Value: "/x"}}, Name: "n",
		Fields: []FieldChange{{Field: "rate_limit.requests_per_unit", Before: "1", After: "2"}}}
	got, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"kind":"limit_changed","domain":"api","path":[{"key":"api_key"},{"key":"route","value":"/x"}],"name":"n","fields":[{"field":"rate_limit.requests_per_unit","before":"1","after":"2"}]}`
	if string(got) != want {
		t.Errorf("JSON = %s\nwant %s", got, want)
	}
}

func TestChangeString(t *testing.T) {
	t.Parallel()
	tests := []struct {
		c    Change
		want string
	}{
		{Change{Kind: DomainAdded, Domain: "web"}, "web: domain added"},
		{Change{Kind: LimitChanged, Domain: "api", Name: "per-key", Fields: []FieldChange{{Field: "rate_limit.requests_per_unit", Before: "1", After: "2"}, {Field: "on_limit.max_delay", After: "1s"}}},
			"api: limit per-key changed: rate_limit.requests_per_unit 1 → 2, on_limit.max_delay (none) → 1s"},
		{Change{Kind: LimitAdded, Domain: "api", Name: "k", Fields: []FieldChange{{Field: "rate_limit.unit", After: "second"}}}, "api: limit k added: rate_limit.unit second"},
		{Change{Kind: RequestDescriptorsChanged, Domain: "api", Fields: []FieldChange{{Field: "request_descriptors[0]", Before: "a=path"}}},
			"api: request_descriptors changed: request_descriptors[0] a=path → (none)"},
	}
	for _, tt := range tests {
		if got := tt.c.String(); got != tt.want {
			t.Errorf("String() = %q\nwant %q", got, tt.want)
		}
	}
}

func TestDiffRulesets(t *testing.T) {
	t.Parallel()
	api := "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n"
	api2 := "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 10}\n"
	comment := "# only a comment\n" + api
	old := map[string]string{"api": api, "gone": "domain: gone\n", "same": "domain: same\n", "text": api, "broken": "domain: [\n"}
	cur := map[string]string{"api": api2, "new": "domain: new\n", "same": "domain: same\n", "text": comment, "broken": "domain: broken\n"}
	got := DiffRulesets(old, cur)
	var names []string
	for _, d := range got {
		names = append(names, d.Name+":"+d.Change)
	}
	if want := "[api:changed broken:changed gone:removed new:added text:changed]"; fmt.Sprint(names) != want {
		t.Fatalf("domains = %v, want %s", names, want)
	}
	byName := map[string]DomainDiff{}
	for _, d := range got {
		byName[d.Name] = d
	}
	if d := byName["api"]; d.Added != 1 || d.Removed != 1 || d.Unified != UnifiedDiff("api.yaml", api, api2) ||
		len(d.Changes) != 1 || d.Changes[0].Kind != LimitChanged || d.Error != "" {
		t.Errorf("api = %+v", d)
	}
	if d := byName["gone"]; d.Removed != 1 || d.Added != 0 || len(d.Changes) != 1 || d.Changes[0].Kind != DomainRemoved ||
		!strings.Contains(d.Unified, "+++ /dev/null\n") {
		t.Errorf("gone = %+v", d)
	}
	if d := byName["text"]; d.Changes == nil || len(d.Changes) != 0 || d.Added != 1 {
		t.Errorf("a comment-only change = %+v, want text but no changes", d)
	}
	if d := byName["broken"]; !strings.HasPrefix(d.Error, "the rules no longer parse: ") || d.Unified == "" || d.Changes == nil {
		t.Errorf("broken = %+v", d)
	}
	if d := DiffRulesets(cur, cur); d == nil || len(d) != 0 {
		t.Errorf("DiffRulesets of equal rulesets = %#v, want empty", d)
	}
}

// TestDiffDefaultAlgorithm checks that a new default_algorithm shows as an
// algorithm change of each limit it applies to, and that writing out the
// default is no change.
func TestDiffDefaultAlgorithm(t *testing.T) {
	t.Parallel()
	const body = `descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: b
    algorithm: leaky_bucket
    rate_limit: {unit: second, requests_per_unit: 5}
`
	none := mustParse(t, "domain: d\n"+body)
	tb := mustParse(t, "domain: d\ndefault_algorithm: token_bucket\n"+body)
	fw := mustParse(t, "domain: d\ndefault_algorithm: fixed_window\n"+body)
	if got := Diff([]*Domain{none}, []*Domain{tb}); len(got) != 0 {
		t.Errorf("writing out the default: %v, want no change", got)
	}
	got := Diff([]*Domain{none}, []*Domain{fw})
	if len(got) != 1 || got[0].Name != "a" || len(got[0].Fields) != 1 || got[0].Fields[0] != (FieldChange{Field: "algorithm", Before: "token_bucket", After: "fixed_window"}) {
		t.Errorf("got %v, want one change: a's algorithm token_bucket → fixed_window", got)
	}
}
