package lyft_test

import (
	"strings"
	"testing"

	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/backend/xds/lyft"
	"github.com/sluicehq/sluice/rules"
)

func parse(t *testing.T, src string) *rules.Domain {
	t.Helper()
	d, err := rules.Parse("test.yaml", []byte(src))
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	return d
}

// TestTranslateLyft: what Lyft can express goes out as its xDS resource,
// field by field.
func TestTranslateLyft(t *testing.T) {
	t.Parallel()
	d := parse(t, `domain: api
default_algorithm: fixed_window
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 100, name: per-key}
    detailed_metric: true
    value_to_metric: true
    descriptors:
      - key: route
        value: /search*
        shadow_mode: true
        rate_limit: {unit: second, requests_per_unit: 5, replaces: [{name: per-key}]}
  - key: plan
    value: free
    calendar: true
    rate_limit: {unit: day, requests_per_unit: 0}
  - key: internal
    rate_limit: {unlimited: true}
  - key: path
    algorithm: fixed_window
    failure_mode: open
    on_limit: {action: reject, status: 429}
    rate_limit: {unit: HOUR, requests_per_unit: 7}
`)
	got, reasons := lyft.Translate(d)
	if reasons != nil {
		t.Fatalf("Translate: reasons %q, want none", reasons)
	}
	want := &rlsconf.RateLimitConfig{Name: "api", Domain: "api", Descriptors: []*rlsconf.RateLimitDescriptor{
		{Key: "api_key", DetailedMetric: true,
			RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_MINUTE, RequestsPerUnit: 100, Name: "per-key"},
			Descriptors: []*rlsconf.RateLimitDescriptor{{Key: "route", Value: "/search*", ShadowMode: true,
				RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_SECOND, RequestsPerUnit: 5,
					Replaces: []*rlsconf.RateLimitReplace{{Name: "per-key"}}}}}},
		{Key: "plan", Value: "free", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_DAY}},
		{Key: "internal", RateLimit: &rlsconf.RateLimitPolicy{Unlimited: true}},
		{Key: "path", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_HOUR, RequestsPerUnit: 7}},
	}}
	if !proto.Equal(got, want) {
		t.Errorf("Translate =\n%s\nwant\n%s", prototext.Format(got), prototext.Format(want))
	}
}

// TestTranslateOverrides: an override becomes a descriptor of its exact
// values with its rate, copied from what its entries matched.
func TestTranslateOverrides(t *testing.T) {
	t.Parallel()
	d := parse(t, `domain: api
default_algorithm: fixed_window
descriptors:
  - key: plan
    descriptors:
      - key: api_key
        rate_limit: {unit: minute, requests_per_unit: 100, name: per-key}
        shadow_mode: true
overrides:
  - entries: [{key: plan, value: gold}, {key: api_key, value: k1}]
    rate_limit: {unit: hour, requests_per_unit: 9000}
`)
	got, reasons := lyft.Translate(d)
	if reasons != nil {
		t.Fatalf("Translate: reasons %q, want none", reasons)
	}
	perKey := func(unit rlsconf.RateLimitUnit, n uint32) *rlsconf.RateLimitDescriptor {
		return &rlsconf.RateLimitDescriptor{Key: "api_key", ShadowMode: true, RateLimit: &rlsconf.RateLimitPolicy{Unit: unit, RequestsPerUnit: n, Name: "per-key"}}
	}
	gold := perKey(rlsconf.RateLimitUnit_HOUR, 9000)
	gold.Value = "k1"
	want := &rlsconf.RateLimitConfig{Name: "api", Domain: "api", Descriptors: []*rlsconf.RateLimitDescriptor{
		{Key: "plan", Descriptors: []*rlsconf.RateLimitDescriptor{perKey(rlsconf.RateLimitUnit_MINUTE, 100)}},
		{Key: "plan", Value: "gold", Descriptors: []*rlsconf.RateLimitDescriptor{perKey(rlsconf.RateLimitUnit_MINUTE, 100), gold}},
	}}
	if !proto.Equal(got, want) {
		t.Errorf("Translate =\n%s\nwant\n%s", prototext.Format(got), prototext.Format(want))
	}
}

// TestTranslateRefused: a domain using what Lyft cannot express is not
// translated, and the reason names the descriptor and the feature.
func TestTranslateRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, src, want string
	}{
		{"token bucket by default", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
			"descriptors[0]: counts with token_bucket; Lyft counts in fixed windows only"},
		{"sliding window", "domain: d\ndefault_algorithm: fixed_window\ndescriptors:\n  - key: k\n    algorithm: sliding_window_log\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
			"descriptors[0]: counts with sliding_window_log"},
		{"burst", "domain: d\ndescriptors:\n  - key: k\n    burst: 5\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
			"descriptors[0]: burst 5; Lyft has no bursts"},
		{"delay", "domain: d\ndescriptors:\n  - key: k\n    on_limit: {action: delay, max_delay: 1s}\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
			"descriptors[0]: on_limit delay"},
		{"status", "domain: d\ndefault_algorithm: fixed_window\ndescriptors:\n  - key: k\n    on_limit: {status: 503}\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
			"on_limit status 503"},
		{"shards", "domain: d\ndefault_algorithm: fixed_window\ndescriptors:\n  - key: k\n    descriptors:\n      - key: j\n        shards: 4\n        rate_limit: {unit: second, requests_per_unit: 100}\n",
			"descriptors[0].descriptors[0]: shards 4"},
		{"lease", "domain: d\ndefault_algorithm: fixed_window\ndescriptors:\n  - key: k\n    lease: true\n    rate_limit: {unit: second, requests_per_unit: 100}\n",
			"descriptors[0]: lease: true"},
		{"async", "domain: d\ndefault_algorithm: fixed_window\ndescriptors:\n  - key: k\n    consistency: async\n    rate_limit: {unit: second, requests_per_unit: 100}\n",
			"descriptors[0]: consistency: async"},
		{"global", "domain: d\ndefault_algorithm: fixed_window\ndescriptors:\n  - key: k\n    scope: global\n    rate_limit: {unit: second, requests_per_unit: 100}\n",
			"descriptors[0]: scope: global"},
		{"failure mode", "domain: d\ndefault_algorithm: fixed_window\ndescriptors:\n  - key: k\n    failure_mode: local\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
			"failure_mode local"},
		{"week", "domain: d\ndefault_algorithm: fixed_window\ndescriptors:\n  - key: k\n    rate_limit: {unit: week, requests_per_unit: 1}\n",
			"descriptors[0]: unit week; Lyft's xDS configuration has second, minute, hour and day"},
		{"unit multiplier", "domain: d\ndefault_algorithm: fixed_window\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, unit_multiplier: 5, requests_per_unit: 1}\n",
			"unit_multiplier 5"},
		{"inner wildcard", "domain: d\ndefault_algorithm: fixed_window\ndescriptors:\n  - key: k\n    value: /api*v1\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
			`value "/api*v1" has a "*" before its end`},
		{"share threshold", "domain: d\ndefault_algorithm: fixed_window\ndescriptors:\n  - key: k\n    value: a*\n    share_threshold: true\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
			"share_threshold"},
		{"overlapping wildcards", "domain: d\ndefault_algorithm: fixed_window\ndescriptors:\n  - key: k\n    value: a*\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: k\n    value: ab*\n    rate_limit: {unit: second, requests_per_unit: 2}\n",
			`descriptors[1]: wildcards "a*" and "ab*" overlap`},
		{"override unit", "domain: d\ndefault_algorithm: fixed_window\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\noverrides:\n  - entries: [{key: k, value: v}]\n    rate_limit: {unit: month, requests_per_unit: 5}\n",
			"overrides[0]: unit month"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, reasons := lyft.Translate(parse(t, tc.src))
			if got != nil {
				t.Errorf("Translate = %v, want nil", got)
			}
			if !strings.Contains(strings.Join(reasons, "\n"), tc.want) {
				t.Errorf("reasons = %q, want one containing %q", reasons, tc.want)
			}
		})
	}
}

// TestTranslateReasonsBounded: a domain with many problems says the first
// few and how many more.
func TestTranslateReasonsBounded(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n")
	for i := range 20 {
		b.WriteString("  - key: k\n    value: v" + strings.Repeat("x", i) + "\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	}
	_, reasons := lyft.Translate(parse(t, b.String()))
	if len(reasons) != 6 || reasons[5] != "15 more" {
		t.Errorf("reasons = %q, want 5 and \"15 more\"", reasons)
	}
}

// FuzzTranslate: any domain the parser accepts translates without a panic,
// to a resource or to reasons, never both and never neither.
func FuzzTranslate(f *testing.F) {
	for _, s := range []string{
		"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
		"domain: d\ndefault_algorithm: fixed_window\ndescriptors:\n  - key: k\n    value: a*\n    descriptors:\n      - key: j\n        rate_limit: {unit: day, requests_per_unit: 0}\noverrides:\n  - entries: [{key: k, value: ab}, {key: j, value: x}]\n    rate_limit: {unit: hour, requests_per_unit: 5}\n",
		"domain: d\ndefault_algorithm: fixed_window\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true}\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, src []byte) {
		d, err := rules.Parse("fuzz.yaml", src)
		if err != nil {
			return
		}
		conf, reasons := lyft.Translate(d)
		if (conf == nil) == (reasons == nil) {
			t.Fatalf("Translate = %v, %q: want a resource or reasons", conf, reasons)
		}
		if conf != nil && conf.Domain != d.Name {
			t.Fatalf("resource domain %q, want %q", conf.Domain, d.Name)
		}
	})
}
