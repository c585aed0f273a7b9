package wire_test

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/rules/wire"
)

// catalogYAML is the ruleset the cleaning tests check against: a quota
// (bill/monthly, 100 a month), a plain limit (bill/per-ip) and domain api.
const catalogYAML = `domain: bill
descriptors:
  - key: key
    rate_limit: {unit: month, requests_per_unit: 100, name: monthly}
    algorithm: fixed_window
    calendar: true
  - key: ip
    rate_limit: {unit: second, requests_per_unit: 10, name: per-ip}
`

func testCatalog(t testing.TB) *wire.Catalog {
	t.Helper()
	domains := []wire.DomainConfig{{Name: "bill", YAML: catalogYAML},
		{Name: "api", YAML: "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n"}}
	set, err := wire.Compile(&wire.Snapshot{Version: 1, Checksum: wire.Checksum(domains), Domains: domains})
	if err != nil {
		t.Fatal(err)
	}
	return wire.NewCatalog(set)
}

func isText(s string) bool { return utf8.ValidString(s) && !strings.ContainsRune(s, 0) }

func TestValue(t *testing.T) {
	long := strings.Repeat("v", wire.MaxValueBytes+1)
	tests := []struct {
		name, in string
		same     bool // returned unchanged
	}{
		{"plain", "alice", true},
		{"empty", "", true},
		{"at the bound", strings.Repeat("v", wire.MaxValueBytes), true},
		{"over the bound", long, false},
		{"NUL", "\x00evil", false},
		{"invalid UTF-8", "a\xffb", false},
		{"long and NUL", long + "\x00", false},
		{"long multibyte", strings.Repeat("é", 200), false},
	}
	seen := map[string]string{}
	for _, tt := range tests {
		got := wire.Value(tt.in)
		if (got == tt.in) != tt.same {
			t.Errorf("%s: Value(%q) = %q, want it unchanged: %v", tt.name, tt.in, got, tt.same)
		}
		if !isText(got) || len(got) > wire.MaxValueBytes {
			t.Errorf("%s: Value = %q (%d bytes), want text of at most %d bytes", tt.name, got, len(got), wire.MaxValueBytes)
		}
		if again := wire.Value(got); again != got {
			t.Errorf("%s: Value(Value(v)) = %q, want %q", tt.name, again, got)
		}
		if other, dup := seen[got]; dup {
			t.Errorf("%s and %s both give %q", tt.name, other, got)
		}
		seen[got] = tt.name
	}
	// Values that clean alike stay apart.
	if wire.Value("a\x00") == wire.Value("a\xff") {
		t.Errorf("Value does not tell a NUL from an invalid byte")
	}
	if got := wire.Value("\x00evil"); !strings.HasPrefix(got, "\uFFFDevil…") {
		t.Errorf("Value(NUL evil) = %q, want the cleaned text first", got)
	}
}

func TestStatsClean(t *testing.T) {
	cat := testCatalog(t)
	s := &wire.Stats{Type: wire.TypeStats, IntervalMS: 1000, Rules: []wire.RuleStats{
		{Domain: "api", Rule: "k", Allowed: 5, Limited: 3, TopLimited: []wire.ValueCount{{Value: "\x00evil", Count: 2}, {Value: "ok", Count: 1}, {Value: "x", Count: 9}}},
		{Domain: "api", Rule: "made-up", Allowed: 1},          // unknown rule
		{Domain: "gone", Rule: "k", Allowed: 1},               // unknown domain
		{Domain: "api", Rule: rules.OverrideName, Limited: 1}, // a limit asked for at request time
		{Domain: "api", Rule: "k\x00", Allowed: 1},            // not text
		{Domain: "bill", Rule: "per-ip", Allowed: -1},         // negative
		{Domain: "bill", Rule: "monthly", Allowed: wire.MaxStatsCount + 1},
		{Domain: "bill", Rule: "per-ip", Allowed: 7},
		{Domain: "api", Rule: "k", Allowed: 1}, // twice
	}, Preview: []wire.RulePreview{
		{Domain: "api", Rule: "k", T: 60, SpanS: 60, Requests: 1},
		{Domain: "api", Rule: "nope", T: 60, SpanS: 60, Requests: 1},
		{Domain: "api", Rule: "k", T: 60, SpanS: 0},
		{Domain: "api", Rule: "k", T: 61, SpanS: 60, Requests: 1}, // not at a span's start
	}}
	cl, err := s.Clean(cat)
	if err != nil {
		t.Fatal(err)
	}
	var kept []string
	for _, r := range s.Rules {
		kept = append(kept, r.Domain+"/"+r.Rule)
	}
	if got, want := strings.Join(kept, ","), "api/k,api/override,bill/per-ip"; got != want {
		t.Errorf("kept %s, want %s", got, want)
	}
	if got := s.Rules[0].TopLimited; len(got) != 2 || got[0].Value != wire.Value("\x00evil") || got[1].Value != "ok" {
		t.Errorf("top values %+v, want the NUL one cleaned and the one over limited dropped", got)
	}
	if len(s.Preview) != 1 || s.Preview[0].Rule != "k" {
		t.Errorf("previews %+v, want only api/k's valid one", s.Preview)
	}
	want := map[string]int{wire.DropInvalid: 6, wire.DropUnknownRule: 3}
	if fmt.Sprint(cl.Dropped) != fmt.Sprint(want) || cl.Cleaned != 1 {
		t.Errorf("cleaning %+v, want dropped %v and 1 cleaned", cl, want)
	}
	if err := s.Validate(); err != nil {
		t.Errorf("cleaned report: %v", err)
	}
	for _, bad := range []*wire.Stats{{IntervalMS: 0}, {IntervalMS: 1, Rules: make([]wire.RuleStats, wire.MaxStatsRules+1)}} {
		if _, err := bad.Clean(cat); err == nil {
			t.Errorf("Clean of %d rules, interval %d: no error", len(bad.Rules), bad.IntervalMS)
		}
	}
}

func TestQuotaClean(t *testing.T) {
	cat := testCatalog(t)
	u := func(edit func(*wire.QuotaUsage)) wire.QuotaUsage {
		x := wire.QuotaUsage{Domain: "bill", Rule: "monthly", Unit: "month", Value: "alice", Start: 1796083200, Hits: 3, Limit: 100}
		if edit != nil {
			edit(&x)
		}
		return x
	}
	q := &wire.Quota{Type: wire.TypeQuota, Epoch: "e", Seq: 1, Usage: []wire.QuotaUsage{
		u(nil),
		u(func(x *wire.QuotaUsage) { x.Value = "\u0000evil" }),
		u(func(x *wire.QuotaUsage) { x.Value = strings.Repeat("v", 300) }),
		u(func(x *wire.QuotaUsage) { x.Hits = math.MaxInt64 }),       // over its limit
		u(func(x *wire.QuotaUsage) { x.Hits, x.Limit = 1000, 1000 }), // limit above the rule's
		u(func(x *wire.QuotaUsage) { x.Rule = "made-up" }),           // no such quota
		u(func(x *wire.QuotaUsage) { x.Domain = "gone" }),            // no such domain
		u(func(x *wire.QuotaUsage) { x.Rule = "per-ip" }),            // not a quota
		u(func(x *wire.QuotaUsage) { x.Unit = "day" }),               // not its unit
		u(func(x *wire.QuotaUsage) { x.Unit = "minute" }),            // not a calendar unit
		u(func(x *wire.QuotaUsage) { x.Hits = 0 }),                   // nothing
		u(func(x *wire.QuotaUsage) { x.Domain = "bill\x00" }),        // not text
		u(nil), // twice
		u(func(x *wire.QuotaUsage) { x.Value = "bob"; x.Hits = 100 }),      // at the limit
		u(func(x *wire.QuotaUsage) { x.Start = 253402300800; x.Hits = 1 }), // after 9999
	}}
	cl, err := q.Clean(cat)
	if err != nil {
		t.Fatal(err)
	}
	var kept []string
	for _, x := range q.Usage {
		kept = append(kept, fmt.Sprintf("%s:%d", x.Value, x.Hits))
	}
	want := []string{"alice:3", wire.Value("\x00evil") + ":3", wire.Value(strings.Repeat("v", 300)) + ":3", "bob:100"}
	if fmt.Sprint(kept) != fmt.Sprint(want) {
		t.Errorf("kept %q, want %q", kept, want)
	}
	wantDrops := map[string]int{wire.DropInvalid: 5, wire.DropUnknownRule: 4, wire.DropOverLimit: 2}
	if fmt.Sprint(cl.Dropped) != fmt.Sprint(wantDrops) || cl.Cleaned != 2 {
		t.Errorf("cleaning %+v, want dropped %v and 2 cleaned", cl, wantDrops)
	}
	if err := q.Validate(); err != nil {
		t.Errorf("cleaned batch: %v", err)
	}
	if _, err := (&wire.Quota{Epoch: "e", Seq: 0}).Clean(cat); err == nil || !strings.Contains(err.Error(), "seq") {
		t.Errorf("Clean of seq 0: %v, want an error naming the seq", err)
	}
	// Nothing is known to a node sent nothing.
	none := &wire.Quota{Epoch: "e", Seq: 1, Usage: []wire.QuotaUsage{u(nil)}}
	if cl, _ := none.Clean(); len(none.Usage) != 0 || cl.Dropped[wire.DropUnknownRule] != 1 {
		t.Errorf("without catalogs: kept %d, cleaning %+v", len(none.Usage), cl)
	}
}

// checkCleanStats is what the console relies on after Stats.Clean.
func checkCleanStats(t *testing.T, s *wire.Stats, cat *wire.Catalog) {
	t.Helper()
	if err := s.Validate(); err != nil {
		t.Fatalf("cleaned report is invalid: %v", err)
	}
	seen := map[[2]string]bool{}
	for _, r := range s.Rules {
		k := [2]string{r.Domain, r.Rule}
		if seen[k] {
			t.Fatalf("rule %q twice", k)
		}
		seen[k] = true
		if !isText(r.Domain) || !isText(r.Rule) || len(r.Domain) > wire.MaxNameBytes || len(r.Rule) > wire.MaxNameBytes {
			t.Fatalf("name %q/%q kept", r.Domain, r.Rule)
		}
		for _, v := range r.TopLimited {
			if !isText(v.Value) || len(v.Value) > wire.MaxValueBytes || v.Count < 0 || v.Count > r.Limited {
				t.Fatalf("top value %q (%d of %d) kept", v.Value, v.Count, r.Limited)
			}
		}
	}
	again := *s
	if cl, err := again.Clean(cat); err != nil || cl.Total() != 0 || cl.Cleaned != 0 {
		t.Fatalf("cleaning a cleaned report: %+v, %v; want nothing to do", cl, err)
	}
}

// FuzzStatsMessage: whatever a node sends as stats, Clean either refuses
// the message as a whole or leaves rows the console can store, once each,
// naming rules of the catalog; and a cleaned report needs no more cleaning.
func FuzzStatsMessage(f *testing.F) {
	for _, s := range []string{
		`{"type":"stats","interval_ms":1000,"rules":[{"domain":"api","rule":"k","allowed":1,"limited":2,"top_limited":[{"value":"\u0000evil","count":2}]}]}`,
		`{"type":"stats","interval_ms":1000,"rules":[{"domain":"api","rule":"fake-1","allowed":1},{"domain":"api","rule":"k","limited":1},{"domain":"api","rule":"k","limited":1}]}`,
		`{"type":"stats","interval_ms":1000,"rules":[{"domain":"bill","rule":"per-ip","allowed":-5,"top_limited":[{"value":"\udc00","count":-1}]}]}`,
		`{"type":"stats","interval_ms":1000,"preview":[{"domain":"api","rule":"k","t":60,"span_s":60,"requests":3,"limited":1,"sec":[[1,3,3]]}]}`,
		`{"type":"stats","interval_ms":0}`,
	} {
		f.Add([]byte(s))
	}
	cat := testCatalog(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		msg, err := wire.Decode(data)
		s, ok := msg.(*wire.Stats)
		if err != nil || !ok {
			return
		}
		if _, err := s.Clean(cat); err != nil {
			return
		}
		for _, r := range s.Rules {
			if r.Rule != rules.OverrideName && r.Domain+"/"+r.Rule != "api/k" && r.Domain != "bill" {
				t.Fatalf("rule %s/%s is not in the catalog", r.Domain, r.Rule)
			}
		}
		checkCleanStats(t, s, cat)
	})
}

// FuzzQuotaMessage: whatever a node sends as a quota batch, Clean either
// refuses it as a whole or leaves usage the console can store: text of
// bounded length, a known quota, hits within the quota's limit, each entry
// once; and a cleaned batch needs no more cleaning.
func FuzzQuotaMessage(f *testing.F) {
	for _, s := range []string{
		`{"type":"quota","epoch":"e","seq":1,"usage":[{"domain":"bill","rule":"monthly","unit":"month","value":"\u0000evil","start":1796083200,"hits":3,"limit":100}]}`,
		`{"type":"quota","epoch":"e","seq":1,"usage":[{"domain":"bill","rule":"monthly","unit":"month","value":"a","start":0,"hits":9223372036854775807,"limit":100}]}`,
		`{"type":"quota","epoch":"e","seq":1,"usage":[{"domain":"nope","rule":"monthly","unit":"month","value":"a","start":0,"hits":1,"limit":1},{"domain":"bill","rule":"monthly","unit":"year","value":"\xff","start":1,"hits":1,"limit":1}]}`,
		`{"type":"quota","epoch":"","seq":0}`,
	} {
		f.Add([]byte(s))
	}
	cat := testCatalog(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		msg, err := wire.Decode(data)
		q, ok := msg.(*wire.Quota)
		if err != nil || !ok {
			return
		}
		if _, err := q.Clean(cat); err != nil {
			return
		}
		if err := q.Validate(); err != nil {
			t.Fatalf("cleaned batch is invalid: %v", err)
		}
		seen := map[string]bool{}
		var sum int64
		for _, u := range q.Usage {
			if u.Domain != "bill" || u.Rule != "monthly" || u.Unit != "month" || u.Hits > u.Limit || u.Limit > 100 {
				t.Fatalf("usage %+v kept", u)
			}
			k := fmt.Sprintf("%q %d", u.Value, u.Start)
			if seen[k] {
				t.Fatalf("usage %s twice", k)
			}
			seen[k] = true
			sum += u.Hits // at most 2000 × 100: never overflows
		}
		if sum < 0 {
			t.Fatalf("hits sum %d", sum)
		}
		again := *q
		if cl, err := again.Clean(cat); err != nil || cl.Total() != 0 || cl.Cleaned != 0 {
			t.Fatalf("cleaning a cleaned batch: %+v, %v; want nothing to do", cl, err)
		}
	})
}

// FuzzNackMessage: a nack's free text, cleaned and cut as the console
// stores and logs it, is text of at most the bound, whatever the node sent.
func FuzzNackMessage(f *testing.F) {
	for _, s := range []string{
		`{"type":"nack","version":1,"error":"bad\u0000yaml \ud800"}`,
		`{"type":"nack","version":1,"error":"` + strings.Repeat("é", 1500) + `"}`,
		`{"type":"nack","version":-1}`,
	} {
		f.Add([]byte(s), 2000)
	}
	f.Fuzz(func(t *testing.T, data []byte, n int) {
		msg, err := wire.Decode(data)
		m, ok := msg.(*wire.Nack)
		if err != nil || !ok || n < 0 || n > 1<<20 {
			return
		}
		got := wire.Cut(wire.CleanText(m.Error), n)
		if !isText(got) || len(got) > n {
			t.Fatalf("stored nack %q (%d bytes), want text of at most %d bytes", got, len(got), n)
		}
		if isText(m.Error) && !strings.HasPrefix(m.Error, got) {
			t.Fatalf("stored nack %q is not a prefix of the text %q", got, m.Error)
		}
	})
}

// BenchmarkStatsClean: what checking a node's report costs the console,
// for a report of 1,000 rules against the catalog of a 1,000-rule ruleset
// (a node's hub checks against up to six catalogs; this is one).
func BenchmarkStatsClean(b *testing.B) {
	var y strings.Builder
	y.WriteString("domain: api\ndescriptors:\n")
	for i := range 1000 {
		fmt.Fprintf(&y, "  - key: k%04d\n    rate_limit: {unit: second, requests_per_unit: 5}\n", i)
	}
	domains := []wire.DomainConfig{{Name: "api", YAML: y.String()}}
	set, err := wire.Compile(&wire.Snapshot{Checksum: wire.Checksum(domains), Domains: domains})
	if err != nil {
		b.Fatal(err)
	}
	cat := wire.NewCatalog(set)
	report := make([]wire.RuleStats, 1000)
	for i := range report {
		report[i] = wire.RuleStats{Domain: "api", Rule: fmt.Sprintf("k%04d", i), Allowed: 10, Limited: 2,
			TopLimited: []wire.ValueCount{{Value: "alice", Count: 2}}}
	}
	rs := make([]wire.RuleStats, len(report))
	b.ReportAllocs()
	for b.Loop() {
		copy(rs, report)
		s := wire.Stats{IntervalMS: 1000, Rules: rs}
		if cl, err := s.Clean(cat); err != nil || cl.Total() != 0 {
			b.Fatal(cl, err)
		}
	}
}
