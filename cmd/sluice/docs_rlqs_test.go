package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	xdsmatcherv3 "github.com/cncf/xds/go/xds/type/matcher/v3"
	rlqsfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3" // the header input's type, for typed_config
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"
	sigsyaml "sigs.k8s.io/yaml"
)

// rlqsFilterBlock returns the envoy.filters.http.rate_limit_quota filter
// block of docs/envoy.md.
func rlqsFilterBlock(t *testing.T) fence {
	t.Helper()
	md, err := loadMarkdown(filepath.Join(repoRoot, "docs", "envoy.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range md.fences {
		if f.info == "yaml" && strings.Contains(f.body, "name: envoy.filters.http.rate_limit_quota\n") {
			return f
		}
	}
	t.Fatal("docs/envoy.md has no envoy.filters.http.rate_limit_quota block")
	return fence{}
}

// decodeRLQSFilter decodes a YAML list of one HTTP filter as Envoy would
// (its types, strictly), runs Envoy's field validations on the filter
// config and on every typed_config of its bucket matchers, and returns the
// config and the bucket id keys its bucket settings build.
func decodeRLQSFilter(src []byte) (*rlqsfilterv3.RateLimitQuotaFilterConfig, []string, error) {
	js, err := sigsyaml.YAMLToJSON(src)
	if err != nil {
		return nil, nil, err
	}
	var items []json.RawMessage
	if err := json.Unmarshal(js, &items); err != nil || len(items) != 1 {
		return nil, nil, fmt.Errorf("want a list of one http filter (%v)", err)
	}
	var hf hcmv3.HttpFilter
	if err := protojson.Unmarshal(items[0], &hf); err != nil {
		return nil, nil, err
	}
	if err := hf.ValidateAll(); err != nil {
		return nil, nil, err
	}
	var cfg rlqsfilterv3.RateLimitQuotaFilterConfig
	if err := hf.GetTypedConfig().UnmarshalTo(&cfg); err != nil {
		return nil, nil, fmt.Errorf("typed_config: %w", err)
	}
	if err := cfg.ValidateAll(); err != nil {
		return nil, nil, err
	}
	type validator interface{ ValidateAll() error }
	check := func(what string, a *anypb.Any) error {
		m, err := a.UnmarshalNew()
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		v, ok := m.(validator)
		if !ok {
			return fmt.Errorf("%s: %s has no validation", what, a.GetTypeUrl())
		}
		if err := v.ValidateAll(); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		return nil
	}
	var keys []string
	settings := func(what string, om *xdsmatcherv3.Matcher_OnMatch) error {
		if om.GetMatcher() != nil {
			return fmt.Errorf("%s: nested matchers are not checked here", what)
		}
		a := om.GetAction().GetTypedConfig()
		if err := check(what+" action", a); err != nil {
			return err
		}
		var bs rlqsfilterv3.RateLimitQuotaBucketSettings
		if err := a.UnmarshalTo(&bs); err != nil {
			return fmt.Errorf("%s action: %w", what, err)
		}
		for k, vb := range bs.GetBucketIdBuilder().GetBucketIdBuilder() {
			keys = append(keys, k)
			if cv := vb.GetCustomValue(); cv != nil {
				if err := check(what+" bucket id "+k, cv.GetTypedConfig()); err != nil {
					return err
				}
			}
		}
		return nil
	}
	bm := cfg.GetBucketMatchers()
	for i, m := range bm.GetMatcherList().GetMatchers() {
		what := fmt.Sprintf("matchers[%d]", i)
		if sp := m.GetPredicate().GetSinglePredicate(); sp != nil {
			if err := check(what+" input", sp.GetInput().GetTypedConfig()); err != nil {
				return nil, nil, err
			}
		}
		if err := settings(what, m.GetOnMatch()); err != nil {
			return nil, nil, err
		}
	}
	if om := bm.GetOnNoMatch(); om != nil {
		if err := settings("on_no_match", om); err != nil {
			return nil, nil, err
		}
	}
	return &cfg, keys, nil
}

// TestEnvoyRLQSFilterDecodes holds docs/envoy.md's rate_limit_quota filter
// to what Envoy accepts, and to the rest of the docs: its rlqs_server is
// envoy.yaml's cluster of the enforcers' gRPC port, its domain is the one
// the page defines, and every bucket id key is a key of that domain.
func TestEnvoyRLQSFilterDecodes(t *testing.T) {
	t.Parallel()
	b := rlqsFilterBlock(t)
	cfg, keys, err := decodeRLQSFilter([]byte(b.body))
	if err != nil {
		t.Fatalf("docs/envoy.md:%d: %v", b.line, err)
	}
	if len(keys) == 0 {
		t.Fatal("no bucket id keys")
	}
	src, err := os.ReadFile(filepath.Join(repoRoot, "docs", "envoy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	boot, err := decodeEnvoyBootstrap(src)
	if err != nil {
		t.Fatal(err)
	}
	rl, _ := envoyRateLimitFilter(t, boot)
	if got, want := cfg.GetRlqsServer().GetEnvoyGrpc().GetClusterName(), rl.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName(); got != want {
		t.Errorf("rlqs_server cluster %q, want envoy.yaml's enforcer cluster %q", got, want)
	}
	if cfg.GetDomain() != rl.GetDomain() {
		t.Errorf("domain %q, want %q as the ratelimit filter's", cfg.GetDomain(), rl.GetDomain())
	}
	md, err := loadMarkdown(filepath.Join(repoRoot, "docs", "envoy.md"))
	if err != nil {
		t.Fatal(err)
	}
	var domainYAML string
	for _, d := range domainBlocks(md) {
		if strings.Contains(d.body, "domain: "+cfg.GetDomain()+"\n") {
			domainYAML = d.body
		}
	}
	for _, k := range keys {
		if !strings.Contains(domainYAML, "key: "+k+"\n") {
			t.Errorf("bucket id key %q is not a key of the domain %q in docs/envoy.md", k, cfg.GetDomain())
		}
	}
}

// TestEnvoyRLQSFilterCheckCanFail shows the decoding is strict.
func TestEnvoyRLQSFilterCheckCanFail(t *testing.T) {
	t.Parallel()
	body := rlqsFilterBlock(t).body
	for name, edit := range map[string][2]string{
		"unknown field":          {"reporting_interval: 1s", "reporting_intervall: 1s"},
		"invalid duration":       {"reporting_interval: 1s", "reporting_interval: 0s"},
		"unknown input type":     {"envoy.type.matcher.v3.HttpRequestHeaderMatchInput", "envoy.type.matcher.v3.NoSuchInput"},
		"undefined status code":  {"code: TooManyRequests", "code: 42"},
		"unknown blanket rule":   {"blanket_rule: ALLOW_ALL", "blanket_rule: ALLOW_SOME"},
		"unknown settings field": {"bucket_id_builder:\n              bucket_id_builder:", "bucket_id_builder:\n              bucket_ids:"},
	} {
		if !strings.Contains(body, edit[0]) {
			t.Fatalf("%s: %q not in the block", name, edit[0])
		}
		if _, _, err := decodeRLQSFilter([]byte(strings.Replace(body, edit[0], edit[1], 1))); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
