package engine_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/enforcer/limiter"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
)

const apiYAML = `domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2, name: per-user}
  - key: global
    value: all
    rate_limit: {unit: minute, requests_per_unit: 3, name: global}
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 3, name: per-key}
  - key: internal
    rate_limit: {unlimited: true}
  - key: plan
    value: free
    rate_limit: {unit: minute, requests_per_unit: 1, name: free-plan}
    shadow_mode: true
  - key: open
    rate_limit: {unit: minute, requests_per_unit: 5}
    failure_mode: open
  - key: closed
    rate_limit: {unit: minute, requests_per_unit: 5}
    failure_mode: closed
  - key: local
    rate_limit: {unit: minute, requests_per_unit: 5}
    failure_mode: local
  - key: closed_shadow
    rate_limit: {unit: minute, requests_per_unit: 5}
    failure_mode: closed
    shadow_mode: true
`

// compile parses and compiles domain YAML sources.
func compile(t testing.TB, sources ...string) *rules.Set {
	t.Helper()
	var domains []*rules.Domain
	for _, src := range sources {
		d, err := rules.Parse("test.yaml", []byte(src))
		if err != nil {
			t.Fatalf("parse: %v", err)
		}
		domains = append(domains, d)
	}
	set, err := rules.Compile(domains)
	if err != nil {
		t.Fatalf("compile: %v", err)
	}
	return set
}

// newEngine returns an engine on the real test Redis, under a key prefix of
// its own, with apiYAML applied as version 1.
func newEngine(t *testing.T) *engine.Engine {
	t.Helper()
	client, err := limiter.NewClient(testenv.RedisURL(t), limiter.WithTimeout(2*time.Second), limiter.WithDialTimeout(2*time.Second)) // a loaded machine must not fail open
	if err != nil {
		t.Fatalf("redis client: %v", err)
	}
	t.Cleanup(func() { client.Close() })
	eng := engine.New(limiter.NewRedis(client), testenv.KeyPrefix(t))
	if err := eng.Apply(1, compile(t, apiYAML)); err != nil {
		t.Fatalf("apply: %v", err)
	}
	return eng
}

// deadStoreEngine returns an engine whose Redis address refuses connections.
func deadStoreEngine(t *testing.T) *engine.Engine {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	client, err := limiter.NewClient("redis://" + addr + "/0")
	if err != nil {
		t.Fatalf("redis client: %v", err)
	}
	t.Cleanup(func() { client.Close() })
	eng := engine.New(limiter.NewRedis(client), "sluicetest:dead:")
	if err := eng.Apply(1, compile(t, apiYAML)); err != nil {
		t.Fatalf("apply: %v", err)
	}
	return eng
}

func req(descriptors ...[]rules.Entry) engine.Request {
	r := engine.Request{Domain: "api"}
	for _, d := range descriptors {
		r.Descriptors = append(r.Descriptors, engine.Descriptor{Entries: d})
	}
	return r
}

func entry(key, value string) []rules.Entry { return []rules.Entry{{Key: key, Value: value}} }

func check(t *testing.T, eng *engine.Engine, r engine.Request) engine.Result {
	t.Helper()
	res, err := eng.Check(context.Background(), r)
	if err != nil {
		t.Fatalf("check %+v: %v", r, err)
	}
	if len(res.Statuses) != len(r.Descriptors) {
		t.Fatalf("got %d statuses, want %d", len(res.Statuses), len(r.Descriptors))
	}
	return res
}

func TestCheckNoRuleset(t *testing.T) {
	t.Parallel()
	eng := engine.New(nil, "")
	if eng.Loaded() || eng.Version() != 0 {
		t.Fatalf("new engine: loaded=%v version=%d, want false 0", eng.Loaded(), eng.Version())
	}
	_, err := eng.Check(context.Background(), req(entry("user", "a")))
	if !errors.Is(err, engine.ErrNoRuleset) {
		t.Fatalf("got %v, want ErrNoRuleset", err)
	}
}

func TestCheckInvalidRequest(t *testing.T) {
	t.Parallel()
	eng := newEngine(t)
	tests := []struct {
		name string
		req  engine.Request
	}{
		{"empty domain", engine.Request{Descriptors: []engine.Descriptor{{Entries: entry("user", "a")}}}},
		{"no descriptors", engine.Request{Domain: "api"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := eng.Check(context.Background(), tt.req)
			if !errors.Is(err, engine.ErrInvalidRequest) {
				t.Fatalf("got %v, want ErrInvalidRequest", err)
			}
		})
	}
}

func TestCheckBurstThenOverLimit(t *testing.T) {
	t.Parallel()
	eng := newEngine(t)
	for i, wantRemaining := range []int64{2, 1, 0} {
		res := check(t, eng, req(entry("api_key", "k1")))
		s := res.Statuses[0]
		if res.Code != engine.OK || s.Code != engine.OK {
			t.Fatalf("request %d: got %v/%v, want ok", i+1, res.Code, s.Code)
		}
		if s.Limit == nil || s.Limit.Name != "per-key" {
			t.Fatalf("request %d: limit %+v, want per-key", i+1, s.Limit)
		}
		if s.Remaining != wantRemaining {
			t.Errorf("request %d: remaining %d, want %d", i+1, s.Remaining, wantRemaining)
		}
		if s.ResetAfter <= 0 || s.ResetAfter > time.Minute {
			t.Errorf("request %d: reset after %v, want (0, 1m]", i+1, s.ResetAfter)
		}
	}
	res := check(t, eng, req(entry("api_key", "k1")))
	if res.Code != engine.OverLimit || res.Statuses[0].Code != engine.OverLimit {
		t.Fatalf("4th request: got %v/%v, want over_limit", res.Code, res.Statuses[0].Code)
	}
	if ra := res.Statuses[0].RetryAfter; ra <= 0 || ra > 20*time.Second+time.Second {
		t.Errorf("retry after %v, want about 20s (one token of 3/min)", ra)
	}
	if got := res.MostRestrictive(); got != 0 {
		t.Errorf("most restrictive %d, want 0", got)
	}
	// Another value has its own counter.
	if res := check(t, eng, req(entry("api_key", "k2"))); res.Code != engine.OK {
		t.Errorf("other key: got %v, want ok", res.Code)
	}
}

func TestCheckNoLimitAndUnlimited(t *testing.T) {
	t.Parallel()
	eng := newEngine(t)
	for range 5 {
		res := check(t, eng, req(entry("nothing", "x"), entry("internal", "svc")))
		if res.Code != engine.OK {
			t.Fatalf("got %v, want ok", res.Code)
		}
		if s := res.Statuses[0]; s.Limit != nil || s.Code != engine.OK {
			t.Errorf("unmatched: %+v, want ok without limit", s)
		}
		if s := res.Statuses[1]; s.Limit == nil || !s.Limit.Unlimited || s.Code != engine.OK {
			t.Errorf("unlimited: %+v, want ok with an unlimited limit", s)
		}
		if got := res.MostRestrictive(); got != -1 {
			t.Errorf("most restrictive %d, want -1", got)
		}
	}
	// Unknown domain: nothing applies.
	res := check(t, eng, engine.Request{Domain: "other", Descriptors: []engine.Descriptor{{Entries: entry("user", "a")}}})
	if res.Code != engine.OK || res.Statuses[0].Limit != nil {
		t.Errorf("unknown domain: %+v, want ok without limit", res)
	}
	if eng.HasDomain("other") || !eng.HasDomain("api") {
		t.Errorf("HasDomain: other=%v api=%v, want false true", eng.HasDomain("other"), eng.HasDomain("api"))
	}
}

// A request rejected by its per-user limit must not consume the global one,
// and one rejected by the global limit must not consume its per-user one.
func TestCheckHierarchicalAllOrNothing(t *testing.T) {
	t.Parallel()
	eng := newEngine(t)
	both := func(user string) engine.Request { return req(entry("user", user), entry("global", "all")) }

	for i := range 2 {
		if res := check(t, eng, both("a")); res.Code != engine.OK {
			t.Fatalf("a #%d: got %v, want ok", i+1, res.Code)
		}
	}
	res := check(t, eng, both("a"))
	if res.Code != engine.OverLimit {
		t.Fatalf("a #3: got %v, want over_limit", res.Code)
	}
	if s := res.Statuses[0]; s.Code != engine.OverLimit {
		t.Errorf("a #3 per-user: %v, want over_limit", s.Code)
	}
	if s := res.Statuses[1]; s.Code != engine.OK || s.Remaining != 1 {
		t.Errorf("a #3 global: code %v remaining %d, want ok 1 (untouched)", s.Code, s.Remaining)
	}

	// The global limit still has the one token a's rejection did not take.
	res = check(t, eng, both("b"))
	if res.Code != engine.OK || res.Statuses[1].Remaining != 0 {
		t.Fatalf("b: got %v global remaining %d, want ok 0", res.Code, res.Statuses[1].Remaining)
	}

	// Now the global limit rejects c, whose per-user bucket stays full.
	res = check(t, eng, both("c"))
	if res.Code != engine.OverLimit || res.Statuses[1].Code != engine.OverLimit || res.Statuses[0].Code != engine.OK {
		t.Fatalf("c: got %v (%v, %v), want over_limit by global", res.Code, res.Statuses[0].Code, res.Statuses[1].Code)
	}
	if got := res.MostRestrictive(); got != 1 {
		t.Errorf("most restrictive %d, want 1 (global)", got)
	}
	zero := uint64(0)
	peek := engine.Request{Domain: "api", Descriptors: []engine.Descriptor{{Entries: entry("user", "c"), Hits: &zero}}}
	if s := check(t, eng, peek).Statuses[0]; s.Remaining != 2 {
		t.Errorf("c per-user remaining %d, want 2 (nothing consumed)", s.Remaining)
	}
}

// Shadow-mode limits never reject, and their rejection does not stop the
// real limits from counting the request.
func TestCheckShadowMode(t *testing.T) {
	t.Parallel()
	eng := newEngine(t)
	r := req(entry("plan", "free"), entry("user", "s"))
	for i, wantUser := range []int64{1, 0} {
		res := check(t, eng, r)
		if res.Code != engine.OK {
			t.Fatalf("request %d: got %v, want ok", i+1, res.Code)
		}
		shadow := res.Statuses[0]
		if shadow.Code != engine.OK || shadow.Shadowed != (i > 0) {
			t.Errorf("request %d shadow: code %v shadowed %v, want ok %v", i+1, shadow.Code, shadow.Shadowed, i > 0)
		}
		if got := res.Statuses[1].Remaining; got != wantUser {
			t.Errorf("request %d per-user remaining %d, want %d", i+1, got, wantUser)
		}
		if got := res.MostRestrictive(); got != 1 {
			t.Errorf("request %d most restrictive %d, want 1 (shadow limits are not shown)", i+1, got)
		}
	}
	// The real limit still rejects.
	res := check(t, eng, r)
	if res.Code != engine.OverLimit || res.Statuses[1].Code != engine.OverLimit || res.Statuses[0].Code != engine.OK {
		t.Fatalf("3rd: got %v (%v, %v), want over_limit by per-user", res.Code, res.Statuses[0].Code, res.Statuses[1].Code)
	}
}

func TestCheckHits(t *testing.T) {
	t.Parallel()
	eng := newEngine(t)
	r := req(entry("api_key", "h"))
	r.Hits = 2
	if s := check(t, eng, r).Statuses[0]; s.Code != engine.OK || s.Remaining != 1 {
		t.Fatalf("hits 2: %v remaining %d, want ok 1", s.Code, s.Remaining)
	}
	// A per-descriptor hits_addend overrides the request's.
	one := uint64(1)
	r.Descriptors[0].Hits = &one
	if s := check(t, eng, r).Statuses[0]; s.Code != engine.OK || s.Remaining != 0 {
		t.Fatalf("descriptor hits 1: %v remaining %d, want ok 0", s.Code, s.Remaining)
	}
	r.Descriptors[0].Hits = nil
	if res := check(t, eng, r); res.Code != engine.OverLimit {
		t.Fatalf("hits 2 on empty bucket: %v, want over_limit", res.Code)
	}
}

func TestCheckStoreFailureModes(t *testing.T) {
	// Not parallel: it bounds how long a check takes.
	eng := deadStoreEngine(t)
	tests := []struct {
		key  string
		want engine.Code
	}{
		{"open", engine.OK},
		{"closed", engine.OverLimit},
		{"local", engine.OK}, // the in-process limiter's first request
		{"closed_shadow", engine.OK},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			start := time.Now()
			res := check(t, eng, req(entry(tt.key, "x")))
			if took := time.Since(start); took > 500*time.Millisecond {
				t.Errorf("check took %v with Redis down, want well under 500ms", took)
			}
			if res.StoreErr == nil {
				t.Error("StoreErr is nil, want the store's error")
			}
			if res.Code != tt.want || res.Statuses[0].Code != tt.want {
				t.Errorf("got %v/%v, want %v", res.Code, res.Statuses[0].Code, tt.want)
			}
			if !res.Statuses[0].StoreFailed {
				t.Error("StoreFailed not set")
			}
		})
	}
	// A closed limit next to an open one rejects the whole request.
	res := check(t, eng, req(entry("open", "x"), entry("closed", "x")))
	if res.Code != engine.OverLimit || res.Statuses[0].Code != engine.OK || res.Statuses[1].Code != engine.OverLimit {
		t.Errorf("open+closed: got %v (%v, %v), want over_limit (ok, over_limit)", res.Code, res.Statuses[0].Code, res.Statuses[1].Code)
	}
	// Requests without counted limits never touch the store.
	if res := check(t, eng, req(entry("internal", "x"))); res.StoreErr != nil || res.Code != engine.OK {
		t.Errorf("unlimited with store down: %+v, want ok without store error", res)
	}
}

func TestApplySwapsRuleset(t *testing.T) {
	t.Parallel()
	eng := newEngine(t)
	if err := eng.Apply(2, compile(t, "domain: other\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n")); err != nil {
		t.Fatal(err)
	}
	if eng.Version() != 2 {
		t.Errorf("version %d, want 2", eng.Version())
	}
	res := check(t, eng, req(entry("api_key", "k1")))
	if res.Statuses[0].Limit != nil || res.Version != 2 {
		t.Errorf("old domain after swap: limit %+v version %d, want none 2", res.Statuses[0].Limit, res.Version)
	}
	if err := eng.Apply(3, nil); err == nil {
		t.Error("Apply(nil) succeeded, want error")
	}
}

// Lyft's "replaces": when a request matches both, the replacing limit
// applies and the replaced one does not.
func TestCheckReplaces(t *testing.T) {
	t.Parallel()
	eng := newEngine(t)
	set := compile(t, `domain: api
descriptors:
  - key: route
    rate_limit: {unit: minute, requests_per_unit: 1, name: default-route}
  - key: vip
    rate_limit:
      unit: minute
      requests_per_unit: 5
      name: vip
      replaces: [{name: default-route}]
`)
	if err := eng.Apply(2, set); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		res := check(t, eng, req(entry("route", "/a"), entry("vip", "v1")))
		if res.Code != engine.OK {
			t.Fatalf("request %d: %v, want ok (default-route replaced)", i+1, res.Code)
		}
		if res.Statuses[0].Limit != nil || res.Statuses[1].Limit.Name != "vip" {
			t.Fatalf("request %d: limits %+v %+v, want none and vip", i+1, res.Statuses[0].Limit, res.Statuses[1].Limit)
		}
	}
	// Without the replacing limit the route limit applies.
	check(t, eng, req(entry("route", "/b")))
	if res := check(t, eng, req(entry("route", "/b"))); res.Code != engine.OverLimit {
		t.Errorf("route alone: %v, want over_limit", res.Code)
	}
}
