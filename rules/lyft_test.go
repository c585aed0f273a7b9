package rules

import (
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
)

// lyftFile parses one of Lyft's own configs in testdata/lyft (see its README)
// and compiles it alone, as Lyft's tests load them.
func lyftFile(t *testing.T, name string) (*Domain, *Set) {
	t.Helper()
	src, err := os.ReadFile("testdata/lyft/" + name)
	if err != nil {
		t.Fatal(err)
	}
	d, err := Parse(name, src)
	if err != nil {
		t.Fatalf("Lyft's %s does not load: %v", name, err)
	}
	s, err := Compile([]*Domain{d})
	if err != nil {
		t.Fatal(err)
	}
	return d, s
}

// lyftWant is what Lyft's tests assert of GetLimit: no limit (zero), or a
// limit's size and flags.
type lyftWant struct {
	rpu       uint32
	unit      Unit
	unlimited bool
	shadow    bool
	name      string // the stats name Lyft gives the limit
}

func (w lyftWant) none() bool { return w == lyftWant{} }

// TestLyftConfigs loads envoyproxy/ratelimit's own test and example configs
// unchanged and matches the requests its tests (test/config/config_test.go)
// and README make, expecting the limits they assert.
func TestLyftConfigs(t *testing.T) {
	t.Parallel()
	tests := []struct {
		file, domain, entries string
		want                  lyftWant
	}{
		// TestBasicConfig.
		{"basic_config.yaml", "test-domain", "key1=something", lyftWant{}},
		{"basic_config.yaml", "test-domain", "key1=value1", lyftWant{}},
		{"basic_config.yaml", "test-domain", "key2=value2,subkey=subvalue", lyftWant{}},
		{"basic_config.yaml", "test-domain", "key5=value5,subkey5=subvalue", lyftWant{}},
		{"basic_config.yaml", "test-domain", "key1=value1,subkey1=something", lyftWant{5, Second, false, false, "key1_value1.subkey1"}},
		{"basic_config.yaml", "test-domain", "key1=value1,subkey1=subvalue1", lyftWant{10, Second, false, false, "key1_value1.subkey1_subvalue1"}},
		{"basic_config.yaml", "test-domain", "key2=something", lyftWant{20, Minute, false, false, "key2"}},
		{"basic_config.yaml", "test-domain", "key2=value2", lyftWant{30, Minute, false, false, "key2_value2"}},
		{"basic_config.yaml", "test-domain", "key2=value3", lyftWant{}},
		{"basic_config.yaml", "test-domain", "key3=foo", lyftWant{1, Hour, false, false, "key3"}},
		{"basic_config.yaml", "test-domain", "key4=foo", lyftWant{1, Day, false, false, "key4"}},
		{"basic_config.yaml", "other-domain", "key4=foo", lyftWant{}},
		// TestWildcardConfig, and wildcards inside a value.
		{"wildcard.yaml", "test-domain", "noVal=foo1", lyftWant{20, Minute, false, false, "noVal"}},
		{"wildcard.yaml", "test-domain", "wild=foo1", lyftWant{20, Minute, false, false, "wild_foo*"}},
		{"wildcard.yaml", "test-domain", "wild=foo", lyftWant{20, Minute, false, false, "wild_foo*"}},
		{"wildcard.yaml", "test-domain", "wild=bar", lyftWant{}},
		{"wildcard.yaml", "test-domain", "noWild=foo1", lyftWant{}},
		{"wildcard.yaml", "test-domain", "midWild=barab", lyftWant{20, Minute, false, false, "midWild_bar*b"}},
		{"wildcard.yaml", "test-domain", "midWild=barb", lyftWant{20, Minute, false, false, "midWild_bar*b"}},
		{"wildcard.yaml", "test-domain", "midWild=barabc", lyftWant{}},
		{"wildcard.yaml", "test-domain", "midWild=xbarab", lyftWant{}},
		// share_threshold.yaml.
		{"share_threshold.yaml", "test-domain", "files=files/a.pdf", lyftWant{100, Minute, false, false, "files_files/*"}},
		{"share_threshold.yaml", "test-domain", "nested=parent,files=nested/a", lyftWant{200, Minute, false, false, "nested_parent.files_nested/*"}},
		{"share_threshold.yaml", "test-domain", "files=top/a,files=nested/b", lyftWant{300, Minute, false, false, "files_top/*.files_nested/*"}},
		{"share_threshold.yaml", "test-domain", "route=api/v1,method=GET", lyftWant{60, Minute, false, false, "route_api/*.method"}},
		{"share_threshold.yaml", "test-domain", "service=svc/a,endpoint=e1", lyftWant{80, Minute, false, false, "service_svc/*.endpoint_e1"}},
		{"share_threshold.yaml", "test-domain", "path=path/a,file=file/b,type=t", lyftWant{120, Minute, false, false, "path_path/*.file_file/*.type"}},
		{"share_threshold.yaml", "test-domain", "user=user/a,resource=res/b,action=read", lyftWant{150, Minute, false, false, "user_user/*.resource_res/*.action"}},
		{"share_threshold.yaml", "test-domain", "file=test1", lyftWant{50, Minute, false, false, "file_test1"}},
		{"share_threshold.yaml", "test-domain", "file=test2", lyftWant{100, Minute, false, false, "file_test*"}},
		{"share_threshold.yaml", "test-domain", "midpath=/api/users/v1", lyftWant{100, Minute, false, false, "midpath_/api*v1"}},
		{"share_threshold.yaml", "test-domain", "midpath=/api/users/v2", lyftWant{}},
		{"share_threshold.yaml", "test-domain", "multiroute=svc-a-ep-b-rpc", lyftWant{50, Minute, false, false, "multiroute_svc*ep*rpc"}},
		{"share_threshold.yaml", "test-domain", "multiroute=svcrpc", lyftWant{}},
		{"share_threshold.yaml", "test-domain", "midroute=/api/x/v2", lyftWant{80, Minute, false, false, "midroute_/api*v2"}},
		{"share_threshold.yaml", "test-domain", "tenant=t1prod,resource=res-a-v2", lyftWant{60, Minute, false, false, "tenant_t*prod.resource_res*v2"}},
		{"share_threshold.yaml", "test-domain", "tenant=t1dev,resource=res-a-v2", lyftWant{}},
		// metadata.yaml: metadata changes nothing about matching.
		{"metadata.yaml", "test-domain", "key1=value1,subkey1=something", lyftWant{5, Second, false, false, "key1_value1.subkey1"}},
		{"metadata.yaml", "test-domain", "key1=value1,subkey1=subvalue1", lyftWant{10, Second, false, false, "key1_value1.subkey1_subvalue1"}},
		{"metadata.yaml", "test-domain", "key2=any", lyftWant{20, Minute, false, false, "key2"}},
		// examples/ratelimit/config, as the README's curl examples use them.
		{"example.yaml", "rl", "source_cluster=proxy,destination_cluster=mock", lyftWant{1, Minute, false, false, "source_cluster_proxy.destination_cluster_mock"}},
		{"example.yaml", "rl", "foo=foo", lyftWant{2, Minute, false, false, "foo"}},
		{"example.yaml", "rl", "foo=foo,bar=bar", lyftWant{3, Minute, false, false, "foo.bar"}},
		{"example.yaml", "rl", "foo=foo,bar=banned", lyftWant{0, Minute, false, false, "foo.bar_banned"}},
		{"example.yaml", "rl", "foo=foo,baz=baz", lyftWant{1, Second, false, false, "foo.baz"}},
		{"example.yaml", "rl", "foo=foo,baz=shady", lyftWant{1, Minute, false, true, "foo.baz_shady"}},
		{"example.yaml", "rl", "foo=foo,bay=x", lyftWant{0, "", true, false, "foo.bay"}},
		{"example.yaml", "rl", "qux=x", lyftWant{0, "", true, false, "qux"}},
		{"config.yaml", "mongo_cps", "database=users", lyftWant{5, Minute, false, false, "database_users"}},
		{"config.yaml", "mongo_cps", "database=other", lyftWant{}},
		// unit_multiplier.yaml: the period is unit times unit_multiplier.
		{"unit_multiplier.yaml", "test-domain", "key1=a", lyftWant{20, Minute, false, false, "key1"}},
		{"unit_multiplier.yaml", "test-domain", "key2=a", lyftWant{25, Minute, false, false, "key2"}},
	}
	for _, tt := range tests {
		_, s := lyftFile(t, tt.file)
		es := entries(tt.entries)
		l := s.Match(tt.domain, es)
		var got lyftWant
		if l != nil {
			got = lyftWant{l.RequestsPerUnit, l.Unit, l.Unlimited, l.ShadowMode, l.MetricName(es)}
		}
		if got != tt.want {
			t.Errorf("%s: Match(%s, %s) = %+v, want %+v", tt.file, tt.domain, tt.entries, got, tt.want)
		}
		if l != nil && !tt.want.none() && l.Algorithm != TokenBucket {
			t.Errorf("%s: algorithm %s; a file without default_algorithm counts with token_bucket", tt.file, l.Algorithm)
		}
	}
}

// TestLyftShareThreshold checks which requests share a counter, as
// share_threshold.yaml's comments say: every value a shared wildcard
// matches counts against one counter, level by level; other values and
// levels keep their own.
func TestLyftShareThreshold(t *testing.T) {
	t.Parallel()
	_, s := lyftFile(t, "share_threshold.yaml")
	tests := []struct {
		a, b   string
		shared bool
	}{
		{"files=files/a.pdf", "files=files/b.csv", true},
		{"nested=parent,files=nested/a", "nested=parent,files=nested/b", true},
		{"files=top/a,files=nested/b", "files=top/c,files=nested/d", true},
		{"route=api/v1,method=GET", "route=api/v2,method=GET", true},
		{"route=api/v1,method=GET", "route=api/v1,method=POST", false}, // method has no value: one counter per method
		{"path=path/a,file=file/b,type=t", "path=path/c,file=file/b,type=t", true},
		{"path=path/a,file=file/b,type=t", "path=path/a,file=file/c,type=t", false}, // file/* does not share
		{"user=user/a,resource=res/b,action=r", "user=user/c,resource=res/d,action=r", true},
		{"file=test2", "file=test3", true},
		{"midpath=/api/a/v1", "midpath=/api/b/v1", true},
		{"multiroute=svc1ep2rpc", "multiroute=svc-x-ep-y-rpc", true},
		{"midroute=/api/a/v2", "midroute=/api/b/v2", true},
		{"tenant=t1prod,resource=res1v2", "tenant=t2prod,resource=res2v2", true},
	}
	for _, tt := range tests {
		ea, eb := entries(tt.a), entries(tt.b)
		la, lb := s.Match("test-domain", ea), s.Match("test-domain", eb)
		if la == nil || la != lb {
			t.Fatalf("%s and %s: limits %v and %v, want the same", tt.a, tt.b, la, lb)
		}
		ka, kb := la.CounterEntries(ea, nil), lb.CounterEntries(eb, nil)
		if got := slices.Equal(ka, kb); got != tt.shared {
			t.Errorf("%s and %s: counter entries %v and %v; shared %t, want %t", tt.a, tt.b, ka, kb, got, tt.shared)
		}
	}
	// share_threshold wins over value_to_metric in the metric name: all the
	// values that share a counter are reported under the wildcard.
	es := entries("midroute=/api/a/v2")
	if got, want := s.Match("test-domain", es).MetricName(es), "midroute_/api*v2"; got != want {
		t.Errorf("MetricName = %q, want %q", got, want)
	}
}

// TestLyftMetadata checks that metadata is kept, as written, and survives
// formatting.
func TestLyftMetadata(t *testing.T) {
	t.Parallel()
	d, _ := lyftFile(t, "metadata.yaml")
	want := map[string]any{"service_with_quota": map[string]any{"name": "service_2"}}
	if diff := gocmp.Diff(want, d.Descriptors[1].Metadata); diff != "" {
		t.Errorf("key2's metadata (-want +got):\n%s", diff)
	}
	if got := d.Descriptors[0].Descriptors[0].Metadata["name"]; got != "service_1" {
		t.Errorf("subkey1's metadata name = %v, want service_1", got)
	}
	back, err := Parse("again.yaml", Format(d))
	if err != nil {
		t.Fatal(err)
	}
	if diff := gocmp.Diff(d, back); diff != "" {
		t.Errorf("Parse(Format(d)) (-d +back):\n%s", diff)
	}
}

func TestWildcardMatch(t *testing.T) {
	t.Parallel()
	tests := []struct {
		pattern, value string
		want           bool
	}{
		{"foo*", "foo", true},
		{"foo*", "foobar", true},
		{"foo*", "fo", false},
		{"*", "", true},
		{"*", "anything", true},
		{"*.example.com", "a.example.com", true},
		{"*.example.com", "example.com", false},
		{"/api*v1", "/apiv1", true},
		{"/api*v1", "/api/users/v1", true},
		{"/api*v1", "/api/v1/x", false},
		{"/api*v1", "/api/v1v1", true},
		{"svc*ep*rpc", "svc-a-ep-b-rpc", true},
		{"svc*ep*rpc", "svceprpc", true},
		{"svc*ep*rpc", "svc-rpc", false},
		{"a*b*c", "abxbc", true},
		{"a*b*c", "acb", false},
		{"a**b", "ab", true},
		{"é*ü", "éaü", true},
	}
	for _, tt := range tests {
		if got := wildcardMatch(tt.pattern, tt.value); got != tt.want {
			t.Errorf("wildcardMatch(%q, %q) = %t, want %t", tt.pattern, tt.value, got, tt.want)
		}
	}
}

// TestLyftUnitMultiplier: a limit's period is its unit times
// unit_multiplier, and a multiplier of 0 is refused, as Lyft refuses it.
func TestLyftUnitMultiplier(t *testing.T) {
	t.Parallel()
	_, s := lyftFile(t, "unit_multiplier.yaml")
	if l := s.Match("test-domain", entries("key1=a")); l.Period != 5*time.Minute {
		t.Errorf("key1: period %v, want 5m", l.Period)
	}
	if l := s.Match("test-domain", entries("key2=a")); l.Period != time.Minute {
		t.Errorf("key2: period %v, want 1m", l.Period)
	}
	src, err := os.ReadFile("testdata/lyft/zero_unit_multiplier.yaml")
	if err != nil {
		t.Fatal(err)
	}
	_, err = Parse("zero_unit_multiplier.yaml", src)
	if err == nil || !strings.Contains(err.Error(), "zero_unit_multiplier.yaml:8:24: descriptors[0].rate_limit.unit_multiplier: unit_multiplier must be greater than 0") {
		t.Errorf("unit_multiplier 0: %v, want refused with its position", err)
	}
}

// TestMetadataRoundTrip: whatever a metadata mapping holds survives Format
// and FormatSource (comments included), and reads back the same.
func TestMetadataRoundTrip(t *testing.T) {
	t.Parallel()
	src := []byte(`domain: meta
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 1}
    # who owns it
    metadata:
      owner: edge # the team
      since: 2024-01-02
      tags: [a, "b c", 3, true, null]
      nested: {deep: {deeper: [1, {x: y}]}}
      blob: !!binary aGk=
      "quoted key": 'single'
      empty: {}
`)
	d, err := Parse("meta.yaml", src)
	if err != nil {
		t.Fatal(err)
	}
	for _, out := range [][]byte{Format(d), mustFormatSource(t, src)} {
		back, err := Parse("again.yaml", out)
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		if diff := gocmp.Diff(d, back); diff != "" {
			t.Errorf("round trip (-d +back):\n%s\n%s", diff, out)
		}
	}
	if got := string(mustFormatSource(t, src)); !strings.Contains(got, "# the team") || !strings.Contains(got, "# who owns it") {
		t.Errorf("FormatSource lost metadata comments:\n%s", got)
	}
}

func mustFormatSource(t *testing.T, src []byte) []byte {
	t.Helper()
	out, err := FormatSource("meta.yaml", src)
	if err != nil {
		t.Fatalf("FormatSource: %v", err)
	}
	return out
}
