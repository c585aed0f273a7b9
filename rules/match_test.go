package rules

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
	"gopkg.in/yaml.v3"
)

const matchYAML = `
domain: api
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 1000, name: per-key}
    burst: 1500
    failure_mode: closed
    descriptors:
      - key: route
        value: /search
        rate_limit: {unit: minute, requests_per_unit: 100}
      - key: route
        value: /api/*
        rate_limit: {unit: minute, requests_per_unit: 50}
      - key: route
        value: /api/admin/*
        rate_limit: {unit: minute, requests_per_unit: 5}
      - key: route
        rate_limit: {unit: minute, requests_per_unit: 500}
  - key: api_key
    value: vip
    rate_limit: {unlimited: true}
  - key: plan
    value: free
    descriptors:
      - key: user
        rate_limit: {unit: day, requests_per_unit: 10}
        shadow_mode: true
        detailed_metric: true
  - key: leaf
    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: per-key}]}
  - key: tree
    value: ex*
    rate_limit: {unit: hour, requests_per_unit: 7}
  - key: tree
    value: "*"
    rate_limit: {unit: hour, requests_per_unit: 8}
  - key: quota
    value: q*
    share_threshold: true
    value_to_metric: true
    rate_limit: {unit: month, requests_per_unit: 5000, name: monthly}
    algorithm: fixed_window
    calendar: true
    shards: 4
    failure_mode: local
    on_limit: {status: 503}
  - key: slow
    rate_limit: {unit: second, requests_per_unit: 5}
    algorithm: leaky_bucket
    burst: 10
    on_limit: {action: delay, max_delay: 1.5s}
  - key: blocked
    rate_limit: {unit: second, requests_per_unit: 0}
`

func mustSet(t testing.TB, sources ...string) *Set {
	t.Helper()
	var domains []*Domain
	for i, src := range sources {
		d, err := Parse(fmt.Sprintf("domain%d.yaml", i), []byte(src))
		if err != nil {
			t.Fatalf("Parse: %v", err)
		}
		domains = append(domains, d)
	}
	s, err := Compile(domains)
	if err != nil {
		t.Fatalf("Compile: %v", err)
	}
	return s
}

// entries parses "k=v,k=v" (a key without "=" has an empty value).
func entries(s string) []Entry {
	if s == "" {
		return nil
	}
	var es []Entry
	for _, kv := range strings.Split(s, ",") {
		k, v, _ := strings.Cut(kv, "=")
		es = append(es, Entry{Key: k, Value: v})
	}
	return es
}

func TestMatch(t *testing.T) {
	t.Parallel()
	s := mustSet(t, matchYAML)
	tests := []struct {
		name    string
		domain  string
		entries string
		want    string // limit name; "" for no limit
	}{
		{"key only", "api", "api_key=k1", "per-key"},
		{"key only, empty value", "api", "api_key", "per-key"},
		{"exact beats key only", "api", "api_key=vip", "api_key_vip"},
		{"nested exact", "api", "api_key=k1,route=/search", "api_key.route_/search"},
		{"wildcard beats key only", "api", "api_key=k1,route=/api/users", "api_key.route_/api/*"},
		{"longest wildcard wins", "api", "api_key=k1,route=/api/admin/users", "api_key.route_/api/admin/*"},
		{"wildcard prefix itself", "api", "api_key=k1,route=/api/", "api_key.route_/api/*"},
		{"nested key only", "api", "api_key=k1,route=/other", "api_key.route"},
		{"exact match is not backtracked", "api", "api_key=vip,route=/search", ""},
		{"no limit on the last node", "api", "plan=free", ""},
		{"deeper limit", "api", "plan=free,user=u1", "plan_free.user"},
		{"no match at the first level", "api", "plan=pro,user=u1", ""},
		{"limit only for the last entry", "api", "leaf=a,more=b", ""},
		{"leaf with limit", "api", "leaf=a", "leaf"},
		{"more entries than levels", "api", "api_key=k1,route=/search,extra=z", ""},
		{"unknown key", "api", "user=u1", ""},
		{"nested key at the top", "api", "route=/search", ""},
		{"unknown domain", "web", "api_key=k1", ""},
		{"no entries", "api", "", ""},
		{"wildcard value matches itself exactly", "api", "tree=ex*", "tree_ex*"},
		{"wildcard", "api", "tree=exit", "tree_ex*"},
		{"bare star is the shortest prefix", "api", "tree=other", "tree_*"},
		{"bare star matches empty", "api", "tree", "tree_*"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := s.Match(tt.domain, entries(tt.entries))
			got := ""
			if l != nil {
				got = l.Name
			}
			if got != tt.want {
				t.Errorf("Match(%q, %s) = %q, want %q", tt.domain, tt.entries, got, tt.want)
			}
		})
	}
}

func TestMatchLimit(t *testing.T) {
	t.Parallel()
	s := mustSet(t, matchYAML)
	reject := OnLimit{Action: Reject, Status: 429}
	tests := []struct {
		entries string
		want    *Limit
	}{
		{"api_key=k1", &Limit{
			Domain: "api", Name: "per-key", Named: true, Path: []Level{{Key: "api_key"}}, Unit: Minute, RequestsPerUnit: 1000, Burst: 1500,
			Algorithm: TokenBucket, FailureMode: FailClosed, Period: time.Minute, Shards: 1, OnLimit: reject,
		}},
		{"api_key=k1,route=/search", &Limit{
			Domain: "api", Name: "api_key.route_/search", Path: []Level{{Key: "api_key"}, {Key: "route", Value: "/search"}},
			Unit: Minute, RequestsPerUnit: 100, Burst: 100,
			Algorithm: TokenBucket, FailureMode: FailOpen, Period: time.Minute, Shards: 1, OnLimit: reject,
		}},
		{"api_key=vip", &Limit{
			Domain: "api", Name: "api_key_vip", Path: []Level{{Key: "api_key", Value: "vip"}}, Unlimited: true,
			Algorithm: TokenBucket, FailureMode: FailOpen, Shards: 1, OnLimit: reject,
		}},
		{"plan=free,user=u1", &Limit{
			Domain: "api", Name: "plan_free.user", Path: []Level{{Key: "plan", Value: "free"}, {Key: "user"}},
			Unit: Day, RequestsPerUnit: 10, Burst: 10, Algorithm: TokenBucket, FailureMode: FailOpen, Period: 24 * time.Hour,
			ShadowMode: true, DetailedMetric: true, Shards: 1, OnLimit: reject,
		}},
		{"leaf=x", &Limit{
			Domain: "api", Name: "leaf", Path: []Level{{Key: "leaf"}}, Unit: Second, RequestsPerUnit: 1, Burst: 1,
			Algorithm: TokenBucket, FailureMode: FailOpen, Period: time.Second, Replaces: []string{"per-key"}, Shards: 1, OnLimit: reject,
		}},
		{"quota=q1", &Limit{
			Domain: "api", Name: "monthly", Named: true, Path: []Level{{Key: "quota", Value: "q*", ShareThreshold: true, ValueToMetric: true}},
			Unit: Month, RequestsPerUnit: 5000, Burst: 5000, Algorithm: FixedWindow, FailureMode: FailLocal, Period: 30 * 24 * time.Hour,
			Calendar: true, Shards: 4, OnLimit: OnLimit{Action: Reject, Status: 503},
		}},
		{"slow=s", &Limit{
			Domain: "api", Name: "slow", Path: []Level{{Key: "slow"}}, Unit: Second, RequestsPerUnit: 5, Burst: 10,
			Algorithm: LeakyBucket, FailureMode: FailOpen, Period: time.Second, Shards: 1,
			OnLimit: OnLimit{Action: Delay, MaxDelay: 1500 * time.Millisecond, Status: 429},
		}},
		{"blocked=1.2.3.4", &Limit{
			Domain: "api", Name: "blocked", Path: []Level{{Key: "blocked"}}, Unit: Second, Algorithm: TokenBucket,
			FailureMode: FailOpen, Period: time.Second, Shards: 1, OnLimit: reject,
		}},
	}
	for _, tt := range tests {
		if diff := gocmp.Diff(tt.want, s.Match("api", entries(tt.entries))); diff != "" {
			t.Errorf("Match(%s) (-want +got):\n%s", tt.entries, diff)
		}
	}
	if l := s.Match("api", entries("blocked=1.2.3.4")); !l.BlocksAll() {
		t.Errorf("a limit of 0: BlocksAll() = false")
	}
	for _, q := range []string{"api_key=k1", "api_key=vip"} {
		if l := s.Match("api", entries(q)); l.BlocksAll() {
			t.Errorf("Match(%s).BlocksAll() = true", q)
		}
	}
}

// TestCounterEntries checks share_threshold: values matching a shared
// wildcard count against one counter, others against their own.
func TestCounterEntries(t *testing.T) {
	// Not parallel: testing.AllocsPerRun refuses to run in a parallel test.
	s := mustSet(t, `domain: files
descriptors:
  - key: path
    value: /files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 100}
    descriptors:
      - key: user
        rate_limit: {unit: hour, requests_per_unit: 10}
  - key: path
    value: /img/*
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: tenant
    descriptors:
      - key: path
        value: /api/*
        share_threshold: true
        rate_limit: {unit: hour, requests_per_unit: 100}
`)
	tests := []struct{ entries, want string }{
		{"path=/files/a.pdf", "path=/files/*"},
		{"path=/files/b.csv", "path=/files/*"},
		{"path=/files/a.pdf,user=u1", "path=/files/*,user=u1"},
		{"path=/img/a.png", "path=/img/a.png"},
		{"tenant=t1,path=/api/x", "tenant=t1,path=/api/*"},
	}
	for _, tt := range tests {
		es := entries(tt.entries)
		l := s.Match("files", es)
		if l == nil {
			t.Fatalf("Match(%s) = nil", tt.entries)
		}
		if got := l.CounterEntries(es, nil); !slices.Equal(got, entries(tt.want)) {
			t.Errorf("CounterEntries(%s) = %v, want %v", tt.entries, got, entries(tt.want))
		}
		if !slices.Equal(es, entries(tt.entries)) {
			t.Errorf("CounterEntries changed its argument: %v", es)
		}
	}
	es := entries("path=/files/a.pdf,user=u1")
	l := s.Match("files", es)
	buf := make([]Entry, 0, 4)
	if n := testing.AllocsPerRun(100, func() { l.CounterEntries(es, buf) }); n != 0 {
		t.Errorf("CounterEntries with a buffer allocates %v times", n)
	}
}

func TestMetricName(t *testing.T) {
	t.Parallel()
	s := mustSet(t, `domain: m
descriptors:
  - key: key1
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: key1
    value: value1
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: route
    value: /api/*
    value_to_metric: true
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 5}
  - key: wild
    value: foo*
    rate_limit: {unit: minute, requests_per_unit: 5, name: named}
`)
	tests := []struct{ entries, want string }{
		{"key1=unspecified", "key1_unspecified"}, // Lyft's README example 8
		{"key1=value1", "key1_value1"},
		{"route=/api/users,user=u1", "route_/api/users.user"},
		{"wild=foobar", "wild_foo*"},
	}
	for _, tt := range tests {
		es := entries(tt.entries)
		if got := s.Match("m", es).MetricName(es); got != tt.want {
			t.Errorf("MetricName(%s) = %q, want %q", tt.entries, got, tt.want)
		}
	}
}

func TestRequestDescriptors(t *testing.T) {
	t.Parallel()
	s := mustSet(t, `domain: gw
request_descriptors:
  - entries:
      - {key: api_key, from: header, name: X-API-Key}
      - {key: route, from: path}
  - entries:
      - {key: scope, value: global}
  - entries:
      - {key: page, from: query, name: page}
descriptors:
  - key: api_key
    descriptors:
      - key: route
        rate_limit: {unit: second, requests_per_unit: 10}
  - key: scope
    rate_limit: {unit: second, requests_per_unit: 1000}
  - key: page
    rate_limit: {unit: second, requests_per_unit: 1000}
`, "domain: other")
	rds := s.RequestDescriptors("gw")
	if len(rds) != 3 || s.RequestDescriptors("other") != nil || s.RequestDescriptors("nope") != nil {
		t.Fatalf("RequestDescriptors = %+v", rds)
	}
	request := map[string]string{"header X-API-Key": "k1", "path ": "/search", "query page": ""}
	lookup := func(e RequestEntry) (string, bool) {
		v, ok := request[string(e.From)+" "+e.Name]
		return v, ok
	}
	tests := []struct {
		rd   RequestDescriptor
		want string
		ok   bool
	}{
		{rds[0], "api_key=k1,route=/search", true},
		{rds[1], "scope=global", true},
		{rds[2], "", false}, // an empty query parameter counts as missing
		{RequestDescriptor{Entries: []RequestEntry{{Key: "ua", From: FromHeader, Name: "User-Agent"}}}, "", false},
	}
	for i, tt := range tests {
		got, ok := tt.rd.Resolve(lookup, nil)
		if ok != tt.ok || ok && !slices.Equal(got, entries(tt.want)) {
			t.Errorf("%d: Resolve = %v, %t; want %v, %t", i, got, ok, entries(tt.want), tt.ok)
		}
		if ok && s.Match("gw", got) == nil {
			t.Errorf("%d: the resolved descriptor %v matches no limit", i, got)
		}
	}
}

// lyftSet compiles testdata/valid files.
func lyftSet(t *testing.T, files ...string) *Set {
	t.Helper()
	var sources []string
	for _, f := range files {
		src, err := os.ReadFile("testdata/valid/" + f)
		if err != nil {
			t.Fatal(err)
		}
		sources = append(sources, string(src))
	}
	return mustSet(t, sources...)
}

// TestMatchLyftReadme loads every example config of envoyproxy/ratelimit's
// README unchanged and checks that requests match as the README says.
func TestMatchLyftReadme(t *testing.T) {
	t.Parallel()
	type want struct {
		name      string // "" for no limit
		rpu       uint32
		unit      Unit
		unlimited bool
		shadow    bool
	}
	tests := []struct {
		file    string
		domain  string
		entries string
		want    want
	}{
		// Example 1: two values of one key.
		{"lyft_example1.yaml", "mongo_cps", "database=users", want{"database_users", 500, Second, false, false}},
		{"lyft_example1.yaml", "mongo_cps", "database=default", want{"database_default", 500, Second, false, false}},
		{"lyft_example1.yaml", "mongo_cps", "database=other", want{}},
		// Example 2: a placeholder level, and a key without a value.
		{"lyft_example2.yaml", "messaging", "message_type=marketing,to_number=2061111111", want{"message_type_marketing.to_number", 5, Day, false, false}},
		{"lyft_example2.yaml", "messaging", "message_type=marketing,to_number=2062222222", want{"message_type_marketing.to_number", 5, Day, false, false}},
		{"lyft_example2.yaml", "messaging", "to_number=2061111111", want{"to_number", 100, Day, false, false}},
		{"lyft_example2.yaml", "messaging", "message_type=marketing", want{}},
		// Example 3: the exact value beats the key alone; 0 blocks.
		{"lyft_example3.yaml", "edge_proxy_per_ip", "remote_address=50.0.0.1", want{"remote_address", 10, Second, false, false}},
		{"lyft_example3.yaml", "edge_proxy_per_ip", "remote_address=50.0.0.5", want{"remote_address_50.0.0.5", 0, Second, false, false}},
		// Example 4: a request matches only at its own depth.
		{"lyft_example4a.yaml", "example4", "key=value,subkey=subvalue", want{}},
		{"lyft_example4a.yaml", "example4", "key=value", want{"key_value", 300, Second, false, false}},
		{"lyft_example4b.yaml", "example4", "key=value,subkey=subvalue", want{"key_value.subkey", 300, Second, false, false}},
		{"lyft_example4b.yaml", "example4", "key=value", want{}},
		// Example 5: unlimited.
		{"lyft_example5.yaml", "internal", "ldap=cn", want{"ldap", 0, "", true, false}},
		{"lyft_example5.yaml", "internal", "azure=x", want{"azure", 100, Minute, false, false}},
		// Example 6: shadow mode.
		{"lyft_example6.yaml", "example6", "service=auth-service,user=user-a", want{"service.user_user-a", 10, Second, false, true}},
		{"lyft_example6.yaml", "example6", "service=auth-service,user=user-b", want{"service.user_user-b", 20, Second, false, false}},
		{"lyft_example6.yaml", "example6", "service=auth-service,user=user-c", want{}},
		// Example 7: named limits (replaces is checked below).
		{"lyft_example7.yaml", "example7", "key_1=value_1,user=bkthomps", want{"specific_limit", 5, Second, false, false}},
		{"lyft_example7.yaml", "example7", "key_2=value_2,user=bkthomps", want{"key_2_value_2.user_bkthomps", 10, Second, false, false}},
		// Example 8: detailed_metric changes metrics, not matching.
		{"lyft_example8.yaml", "example8", "key1=unspecified_value", want{"key1", 10, Minute, false, false}},
		{"lyft_example8.yaml", "example8", "key1=value1", want{"key1_value1", 20, Minute, false, false}},
		// Example 9: a wildcard value.
		{"lyft_example9.yaml", "example9", "key1=value_1", want{"key1_value*", 20, Minute, false, false}},
		{"lyft_example9.yaml", "example9", "key1=value_2", want{"key1_value*", 20, Minute, false, false}},
		{"lyft_example9.yaml", "example9", "key1=other", want{}},
	}
	for _, tt := range tests {
		s := lyftSet(t, tt.file)
		l := s.Match(tt.domain, entries(tt.entries))
		var got want
		if l != nil {
			got = want{l.Name, l.RequestsPerUnit, l.Unit, l.Unlimited, l.ShadowMode}
		}
		if got != tt.want {
			t.Errorf("%s: Match(%s) = %+v, want %+v", tt.file, tt.entries, got, tt.want)
		}
	}

	s := lyftSet(t, "lyft_example3.yaml")
	if !s.Match("edge_proxy_per_ip", entries("remote_address=50.0.0.5")).BlocksAll() {
		t.Errorf("example 3: the black-listed address is not blocked")
	}
	s = lyftSet(t, "lyft_example7.yaml")
	if l := s.Match("example7", entries("key_2=value_2,user=bkthomps")); !slices.Equal(l.Replaces, []string{"specific_limit"}) {
		t.Errorf("example 7: Replaces = %q, want [specific_limit]", l.Replaces)
	}
	s = lyftSet(t, "lyft_example8.yaml")
	es := entries("key1=unspecified_value")
	if got := s.Match("example8", es).MetricName(es); got != "key1_unspecified_value" {
		t.Errorf("example 8: MetricName = %q, want key1_unspecified_value", got)
	}
}

// TestMatchLyft checks Lyft-format configs beyond the README's examples.
func TestMatchLyft(t *testing.T) {
	t.Parallel()
	s := lyftSet(t, "lyft_edge_proxy.yaml", "lyft_nested.yaml", "lyft_units.yaml", "lyft_share_threshold.yaml")
	tests := []struct {
		domain, entries string
		want            string
		rpu             uint32
	}{
		{"edge_proxy", "remote_address=10.0.0.2", "remote_address", 10},
		{"edge_proxy", "remote_address=10.0.0.1", "remote_address_10.0.0.1", 0},
		{"edge_proxy", "remote_address=50.0.0.9", "remote_address_50.0.0.*", 60},
		{"proxy", "source_cluster=proxy,destination_cluster=bkthomps", "source_cluster_proxy.destination_cluster_bkthomps", 30},
		{"proxy", "source_cluster=proxy,destination_cluster=mock1", "source_cluster_proxy.destination_cluster_mock*", 100},
		{"proxy", "source_cluster=proxy,destination_cluster=mock_special_1", "source_cluster_proxy.destination_cluster_mock_special*", 200},
		{"proxy", "source_cluster=proxy,destination_cluster=other", "source_cluster_proxy.destination_cluster", 1000},
		{"proxy", "api_key=a,path=/x", "per-path", 20},
		{"proxy", "api_key=a,path=/health", "api_key.path_/health", 200},
		{"lyft_share_threshold", "files=files/a.pdf", "files_files/*", 100},
	}
	for _, tt := range tests {
		l := s.Match(tt.domain, entries(tt.entries))
		var name string
		var rpu uint32
		if l != nil {
			name, rpu = l.Name, l.RequestsPerUnit
		}
		if name != tt.want || rpu != tt.rpu {
			t.Errorf("Match(%s, %s) = %q %d, want %q %d", tt.domain, tt.entries, name, rpu, tt.want, tt.rpu)
		}
	}
	if l := s.Match("proxy", entries("api_key=a,path=/health")); !slices.Equal(l.Replaces, []string{"per-path"}) {
		t.Errorf("Replaces = %q, want [per-path]", l.Replaces)
	}
	if l := s.Match("edge_proxy", entries("remote_address=50.0.0.9")); !l.ShadowMode || !l.DetailedMetric {
		t.Errorf("shadow_mode, detailed_metric = %t, %t; want both", l.ShadowMode, l.DetailedMetric)
	}
	for _, u := range units {
		l := s.Match("lyft_units", []Entry{{Key: "u", Value: string(u)}})
		if l == nil || l.Unit != u || l.Period != u.Period() {
			t.Errorf("unit %s: Match = %+v", u, l)
		}
	}
	// share_threshold: files/a.pdf and files/b.csv share a counter; models/*
	// values do not.
	for _, tt := range []struct{ a, b string }{{"files=files/a.pdf", "files=files/b.csv"}, {"models=models/a", "models=models/b"}} {
		ea, eb := entries(tt.a), entries(tt.b)
		ka := s.Match("lyft_share_threshold", ea).CounterEntries(ea, nil)
		kb := s.Match("lyft_share_threshold", eb).CounterEntries(eb, nil)
		shared := strings.HasPrefix(tt.a, "files")
		if slices.Equal(ka, kb) != shared {
			t.Errorf("%s and %s: counter entries %v and %v; want shared: %t", tt.a, tt.b, ka, kb, shared)
		}
	}
}

// TestMatchPrecedence pins each rule of Lyft's matching, one case each.
func TestMatchPrecedence(t *testing.T) {
	t.Parallel()
	s := mustSet(t, `domain: p
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 1, name: key-only}
    descriptors:
      - key: sub
        rate_limit: {unit: second, requests_per_unit: 1, name: key-only.sub}
  - key: k
    value: abc
    rate_limit: {unit: second, requests_per_unit: 1, name: exact}
  - key: k
    value: ab*
    rate_limit: {unit: second, requests_per_unit: 1, name: wildcard-ab}
  - key: k
    value: abcd*
    rate_limit: {unit: second, requests_per_unit: 1, name: wildcard-abcd}
  - key: k
    value: a*
    descriptors:
      - key: sub
        rate_limit: {unit: second, requests_per_unit: 1, name: wildcard-a.sub}
  - key: parent
    descriptors:
      - key: child
        rate_limit: {unit: second, requests_per_unit: 1, name: child}
`)
	tests := []struct {
		rule, entries, want string
	}{
		{"an exact value beats every wildcard", "k=abc", "exact"},
		{"a wildcard matches any value with its prefix", "k=abcd", "wildcard-abcd"},
		{"the longest matching wildcard wins", "k=abcde", "wildcard-abcd"},
		{"a shorter wildcard when the longer does not match", "k=abx", "wildcard-ab"},
		{"a wildcard beats the key alone, even without a limit of its own", "k=ax", ""},
		{"the key alone when no value matches", "k=zzz", "key-only"},
		{"the key alone matches an empty value", "k", "key-only"},
		{"a wildcard matches its own text exactly", "k=ab*", "wildcard-ab"},
		{"the chosen descriptor is not backtracked from", "k=abc,sub=x", ""},
		{"a nested level under a wildcard", "k=a1,sub=x", "wildcard-a.sub"},
		{"a nested level under the key alone", "k=zzz,sub=x", "key-only.sub"},
		{"the limit of the last entry's descriptor applies", "parent=p,child=c", "child"},
		{"a descriptor without a limit gives none, even with nested limits", "parent=p", ""},
		{"more entries than levels match nothing", "parent=p,child=c,extra=e", ""},
		{"entries in another order match nothing", "child=c,parent=p", ""},
		{"keys are case-sensitive", "K=abc", ""},
		{"values are case-sensitive", "k=ABC", "key-only"},
	}
	for _, tt := range tests {
		l := s.Match("p", entries(tt.entries))
		got := ""
		if l != nil {
			got = l.Name
		}
		if got != tt.want {
			t.Errorf("%s: Match(%s) = %q, want %q", tt.rule, tt.entries, got, tt.want)
		}
	}
}

func TestMatchAllocs(t *testing.T) {
	// Not parallel: testing.AllocsPerRun refuses to run in a parallel test.
	s := mustSet(t, matchYAML)
	for _, q := range []string{"api_key=k1", "api_key=k1,route=/api/admin/x", "plan=pro,user=u1", "api_key=k1,route=/other"} {
		es := entries(q)
		if n := testing.AllocsPerRun(100, func() { s.Match("api", es) }); n != 0 {
			t.Errorf("Match(%s) allocates %v times", q, n)
		}
	}
}

func TestSet(t *testing.T) {
	t.Parallel()
	s := mustSet(t, matchYAML, "domain: web\ndescriptors: [{key: a, rate_limit: {unit: second, requests_per_unit: 1}}]", "domain: empty")
	if got, want := s.Domains(), []string{"api", "empty", "web"}; !slices.Equal(got, want) {
		t.Errorf("Domains() = %q, want %q", got, want)
	}
	if got, want := s.Len(), 14; got != want {
		t.Errorf("Len() = %d, want %d", got, want)
	}
	s.Domains()[0] = "changed"
	if s.Domains()[0] != "api" {
		t.Errorf("Domains() shares the set's slice")
	}

	var none *Set
	if none.Match("api", entries("a=b")) != nil || none.Len() != 0 || none.Domains() != nil {
		t.Errorf("a nil *Set is not empty")
	}
	empty, err := Compile(nil)
	if err != nil || empty.Len() != 0 || empty.Match("api", entries("a=b")) != nil {
		t.Errorf("Compile(nil) = %v, %v; want an empty set", empty, err)
	}
}

func TestCompileInvalid(t *testing.T) {
	t.Parallel()
	cyclic := make([]Descriptor, 1)
	cyclic[0] = Descriptor{Key: "loop", Descriptors: cyclic}

	many := make([]Descriptor, MaxDescriptors+1)
	for i := range many {
		many[i] = Descriptor{Key: "k", Value: fmt.Sprint(i)}
	}

	ok := &Domain{Name: "ok"}
	tests := []struct {
		name    string
		domains []*Domain
		want    []string // Problem.String()s
	}{
		{"nil domain", []*Domain{nil}, []string{"domains[0]: domain is nil"}},
		{"twice", []*Domain{ok, {Name: "ok"}}, []string{`ok: domain: domain "ok" is given twice`}},
		{"unit", []*Domain{{Name: "a", Descriptors: []Descriptor{{Key: "k", RateLimit: &RateLimit{Unit: "fortnight", RequestsPerUnit: 1}}}}},
			[]string{`a: descriptors[0].rate_limit.unit: "fortnight" is not a unit (second, minute, hour, day, week, month, year)`}},
		{"delay", []*Domain{{Name: "a", Descriptors: []Descriptor{{Key: "k", RateLimit: &RateLimit{Unit: Second, RequestsPerUnit: 1}, OnLimit: &OnLimit{Action: Delay, Status: 99}}}}},
			[]string{"a: descriptors[0].on_limit.max_delay: max_delay is required with action delay (the longest a request may wait, like 2s)",
				"a: descriptors[0].on_limit.status: status must be from 400 to 599"}},
		{"shards", []*Domain{{Name: "a", Descriptors: []Descriptor{{Key: "k", RateLimit: &RateLimit{Unit: Second, RequestsPerUnit: 100}, Shards: 65}}}},
			[]string{"a: descriptors[0].shards: shards must be at most 64"}},
		{"utf-8", []*Domain{{Name: "a", Descriptors: []Descriptor{{Key: "k\xff", Value: "\xfe"}}}},
			[]string{"a: descriptors[0].key: key must be valid UTF-8 text", "a: descriptors[0].value: value must be valid UTF-8 text"}},
		{"request descriptors", []*Domain{{Name: "a", RequestDescriptors: make([]RequestDescriptor, MaxRequestDescriptors+1)}},
			[]string{"a: request_descriptors: a domain may have at most 64 request descriptors"}},
		{"request descriptor entries", []*Domain{{Name: "a", RequestDescriptors: []RequestDescriptor{{Entries: make([]RequestEntry, MaxDepth+1)}}}},
			[]string{"a: request_descriptors[0].entries: a request descriptor may have at most 16 entries (descriptors nest at most 16 levels)"}},
		{"too much", []*Domain{{Name: "a", Descriptors: []Descriptor{{Key: "k", Burst: 2e9, RateLimit: &RateLimit{Unit: Second, RequestsPerUnit: 2e9}}}}},
			[]string{"a: descriptors[0].rate_limit.requests_per_unit: requests_per_unit must be at most 1000000000", "a: descriptors[0].burst: burst must be at most 1000000000"}},
		{"duplicate", []*Domain{{Name: "a", Descriptors: []Descriptor{{Key: "k"}, {Key: "k"}}}},
			[]string{`a: descriptors[1]: duplicate descriptor: key "k" without a value is already at descriptors[0]`}},
		{"no name", []*Domain{{}}, []string{"domain: domain is required"}},
		{"cycle", []*Domain{{Name: "a", Descriptors: cyclic}},
			[]string{"a: descriptors" + strings.Repeat("[0].descriptors", MaxDepth) + ": descriptors nest more than 16 levels deep"}},
		{"many", []*Domain{{Name: "a", Descriptors: many}}, []string{"a: descriptors[100000]: a domain may have at most 100000 descriptors"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Compile(tt.domains)
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("Compile = %v, %v; want a *ValidationError", s, err)
			}
			var got []string
			for _, p := range ve.Problems {
				got = append(got, p.String())
			}
			if diff := gocmp.Diff(tt.want, got); diff != "" {
				t.Errorf("problems (-want +got):\n%s", diff)
			}
		})
	}
}

// TestCompileCopies checks that a Set does not change with the domains it
// was compiled from.
func TestCompileCopies(t *testing.T) {
	t.Parallel()
	d := &Domain{Name: "a", Descriptors: []Descriptor{{Key: "k", RateLimit: &RateLimit{Unit: Second, RequestsPerUnit: 1, Replaces: []string{"x"}}}, {Key: "x", RateLimit: &RateLimit{Unit: Second, RequestsPerUnit: 1}}}}
	s, err := Compile([]*Domain{d})
	if err != nil {
		t.Fatal(err)
	}
	d.Descriptors[0].RateLimit.Replaces[0] = "changed"
	d.Descriptors[0].RateLimit.RequestsPerUnit = 99
	if l := s.Match("a", entries("k=v")); l.Replaces[0] != "x" || l.RequestsPerUnit != 1 {
		t.Errorf("the set changed with its domain: %+v", l)
	}
}

// benchSources writes 100 domains of 100 limits each: key-only, exact
// values, nested levels and wildcards, as real configs mix them.
func benchSources() [][]byte {
	var sources [][]byte
	for d := range 100 {
		var y strings.Builder
		fmt.Fprintf(&y, "domain: d%d\ndescriptors:\n", d)
		y.WriteString("  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 10}\n")
		for i := range 50 {
			fmt.Fprintf(&y, "  - key: api_key\n    value: k%d\n    rate_limit: {unit: minute, requests_per_unit: %d}\n", i, 100+i)
		}
		for p := range 10 {
			fmt.Fprintf(&y, "  - key: plan\n    value: p%d\n    rate_limit: {unit: day, requests_per_unit: 10000}\n    descriptors:\n", p)
			y.WriteString("      - {key: route, value: /search, rate_limit: {unit: minute, requests_per_unit: 100}}\n")
			y.WriteString("      - {key: route, value: /api/*, rate_limit: {unit: minute, requests_per_unit: 50}}\n")
			y.WriteString("      - {key: route, rate_limit: {unit: minute, requests_per_unit: 500}}\n")
		}
		for u := range 9 {
			fmt.Fprintf(&y, "  - key: user\n    value: u%d*\n    rate_limit: {unit: hour, requests_per_unit: 1000}\n", u+1)
		}
		sources = append(sources, []byte(y.String()))
	}
	return sources
}

func benchDomains(b *testing.B, sources [][]byte) []*Domain {
	b.Helper()
	domains := make([]*Domain, len(sources))
	for i, src := range sources {
		d, err := Parse("bench.yaml", src)
		if err != nil {
			b.Fatal(err)
		}
		domains[i] = d
	}
	return domains
}

// benchSet compiles benchSources and the request descriptors to look up:
// hits and misses at every level.
func benchSet(b *testing.B) (*Set, []benchQuery) {
	b.Helper()
	s, err := Compile(benchDomains(b, benchSources()))
	if err != nil {
		b.Fatal(err)
	}
	if s.Len() != 10_000 {
		b.Fatalf("Len() = %d, want 10000", s.Len())
	}
	var qs []benchQuery
	for d := range 100 {
		dom := fmt.Sprintf("d%d", d)
		for _, q := range []string{
			"remote_address=10.1.2.3",           // key only
			fmt.Sprintf("api_key=k%d", d%50),    // exact
			"api_key=unknown",                   // miss
			fmt.Sprintf("plan=p%d", d%10),       // exact
			"plan=p3,route=/search",             // nested exact
			"plan=p7,route=/api/v1/users/12345", // nested wildcard
			"plan=p1,route=/other",              // nested key only
			"user=u512345",                      // wildcard among 9
			"user=zzz",                          // wildcard miss
		} {
			qs = append(qs, benchQuery{dom, entries(q)})
		}
	}
	return s, qs
}

type benchQuery struct {
	domain  string
	entries []Entry
}

// BenchmarkMatch matches request descriptors against 10,000 limits in 100
// domains. The baseline is one Go map lookup per query, keyed by the
// query's whole text made in advance: the floor for any matcher, which
// cannot do less than hash what it is given.
func BenchmarkMatch(b *testing.B) {
	s, qs := benchSet(b)
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		done := measureCPU(b)
		for i := 0; b.Loop(); i++ {
			q := qs[i%len(qs)]
			s.Match(q.domain, q.entries)
		}
		done()
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		var matched atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			n := int64(0)
			for i := 0; pb.Next(); i++ {
				q := qs[i%len(qs)]
				if s.Match(q.domain, q.entries) != nil {
					n++
				}
			}
			matched.Add(n)
		})
		if b.N >= len(qs) && matched.Load() == 0 {
			b.Error("nothing matched")
		}
	})
	b.Run("baseline_map", func(b *testing.B) {
		flat := make(map[string]*Limit, len(qs))
		keys := make([]string, len(qs))
		for i, q := range qs {
			keys[i] = fmt.Sprint(q.domain, q.entries)
			flat[keys[i]] = s.Match(q.domain, q.entries)
		}
		b.ReportAllocs()
		done := measureCPU(b)
		for i := 0; b.Loop(); i++ {
			_ = flat[keys[i%len(keys)]]
		}
		done()
	})
}

// BenchmarkLoad measures turning the 10,000-limit ruleset of BenchmarkMatch
// into a Set: parsing its 100 files (with yaml.v3 decoding them as the
// baseline) and compiling the parsed domains.
func BenchmarkLoad(b *testing.B) {
	sources := benchSources()
	b.Run("yaml_decode", func(b *testing.B) {
		b.ReportAllocs()
		done := measureCPU(b)
		for b.Loop() {
			for _, src := range sources {
				var n yaml.Node
				if err := yaml.Unmarshal(src, &n); err != nil {
					b.Fatal(err)
				}
			}
		}
		done()
	})
	b.Run("parse", func(b *testing.B) {
		b.ReportAllocs()
		done := measureCPU(b)
		for b.Loop() {
			benchDomains(b, sources)
		}
		done()
	})
	domains := benchDomains(b, sources)
	b.Run("compile", func(b *testing.B) {
		b.ReportAllocs()
		done := measureCPU(b)
		for b.Loop() {
			if _, err := Compile(domains); err != nil {
				b.Fatal(err)
			}
		}
		done()
	})
}

// TestMatchDefaultAlgorithm checks that a domain's default_algorithm is the
// algorithm of every limit that names none, and only of those; without it
// the default is token_bucket.
func TestMatchDefaultAlgorithm(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, def string
		want      map[string]Algorithm // entry key → algorithm of its limit
	}{
		{"absent", "", map[string]Algorithm{"plain": TokenBucket, "named": LeakyBucket, "nested": TokenBucket}},
		{"fixed_window", "default_algorithm: fixed_window\n", map[string]Algorithm{"plain": FixedWindow, "named": LeakyBucket, "nested": FixedWindow}},
		{"sliding_window_counter", "default_algorithm: sliding_window_counter\n", map[string]Algorithm{"plain": SlidingWindowCounter, "named": LeakyBucket, "nested": SlidingWindowCounter}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := "domain: d\n" + tt.def + `descriptors:
  - key: plain
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: named
    algorithm: leaky_bucket
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: parent
    descriptors:
      - key: nested
        rate_limit: {unit: second, requests_per_unit: 5}
`
			d, err := Parse("d.yaml", []byte(src))
			if err != nil {
				t.Fatal(err)
			}
			set, err := Compile([]*Domain{d})
			if err != nil {
				t.Fatal(err)
			}
			for key, want := range tt.want {
				entries := []Entry{{Key: key, Value: "v"}}
				if key == "nested" {
					entries = []Entry{{Key: "parent", Value: "p"}, {Key: "nested", Value: "v"}}
				}
				l := set.Match("d", entries)
				if l == nil {
					t.Fatalf("%s: no limit", key)
				}
				if l.Algorithm != want {
					t.Errorf("%s: algorithm %s, want %s", key, l.Algorithm, want)
				}
			}
		})
	}
}
