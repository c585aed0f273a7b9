package checkserver_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/enforcer/checkserver"
	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/enforcer/internal/sfv"
	"github.com/sluicehq/sluice/enforcer/limiter"
	"github.com/sluicehq/sluice/enforcer/metrics"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
)

const apiYAML = `domain: api
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 2, name: per-key}
  - key: internal
    rate_limit: {unlimited: true}
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 10, name: per-tenant}
  - key: shadow
    rate_limit: {unit: minute, requests_per_unit: 1, name: shadowed}
    shadow_mode: true
  - key: detailed
    rate_limit: {unit: minute, requests_per_unit: 100, name: detailed}
    detailed_metric: true
  - key: anon
    rate_limit: {unit: minute, requests_per_unit: 3}
`

type fixture struct {
	eng *engine.Engine
	srv *checkserver.Server
	url string
}

// newFixture serves a Server over a real HTTP listener, counting in the
// real test Redis. The ruleset is not applied yet.
func newFixture(t *testing.T, ping func(context.Context) error) *fixture {
	t.Helper()
	client, err := limiter.NewClient(testenv.RedisURL(t), limiter.WithTimeout(2*time.Second), limiter.WithDialTimeout(2*time.Second)) // a loaded machine must not fail open
	if err != nil {
		t.Fatalf("redis client: %v", err)
	}
	t.Cleanup(func() { client.Close() })
	if ping == nil {
		ping = func(ctx context.Context) error { return limiter.Ping(ctx, client) }
	}
	eng := engine.New(limiter.NewRedis(client), testenv.KeyPrefix(t))
	srv, err := checkserver.New(eng, checkserver.Options{Ping: ping})
	if err != nil {
		t.Fatalf("new server: %v", err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	return &fixture{eng: eng, srv: srv, url: hs.URL}
}

func (f *fixture) apply(t *testing.T) {
	t.Helper()
	d, err := rules.Parse("api.yaml", []byte(apiYAML))
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	set, err := rules.Compile([]*rules.Domain{d})
	if err != nil {
		t.Fatalf("compile: %v", err)
	}
	if err := f.eng.Apply(1, set); err != nil {
		t.Fatal(err)
	}
}

type reply struct {
	status int
	header http.Header
	body   string
}

func (f *fixture) do(t *testing.T, method, path, body string) reply {
	t.Helper()
	req, err := http.NewRequest(method, f.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

func decode(t *testing.T, body string) *rlsv3.RateLimitResponse {
	t.Helper()
	var out rlsv3.RateLimitResponse
	if err := protojson.Unmarshal([]byte(body), &out); err != nil {
		t.Fatalf("response is not a RateLimitResponse: %v\n%s", err, body)
	}
	return &out
}

const keyReq = `{"domain":"api","descriptors":[{"entries":[{"key":"api_key","value":"k1"}]}]}`

// rateLimitFields parses the IETF fields of h strictly (RFC 8941) and
// returns, per limit name, its RateLimit-Policy and RateLimit parameters.
func rateLimitFields(t *testing.T, h http.Header) (policy, state map[string]map[string]int64) {
	t.Helper()
	read := func(name string) map[string]map[string]int64 {
		out := map[string]map[string]int64{}
		items, err := sfv.ParseList(h.Values(name)...)
		if err != nil {
			t.Fatalf("%s %q: %v", name, h.Values(name), err)
		}
		for _, it := range items {
			n, ok := it.Value.(string)
			if !ok {
				t.Fatalf("%s: member %v is not a string", name, it.Value)
			}
			params := map[string]int64{}
			for _, p := range it.Params {
				v, ok := p.Value.(int64)
				if !ok {
					t.Fatalf("%s: %s=%v is not an integer", name, p.Key, p.Value)
				}
				params[p.Key] = v
			}
			out[n] = params
		}
		return out
	}
	return read("RateLimit-Policy"), read("RateLimit")
}

func TestHTTPCheckThenOverLimit(t *testing.T) {
	t.Parallel()
	for _, path := range []string{"/json", "/v1/check"} {
		t.Run(path, func(t *testing.T) {
			f := newFixture(t, nil)
			f.apply(t)
			for i, wantRemaining := range []int64{1, 0} {
				r := f.do(t, "POST", path, keyReq)
				if r.status != http.StatusOK {
					t.Fatalf("request %d: status %d, want 200: %s", i+1, r.status, r.body)
				}
				if ct := r.header.Get("Content-Type"); ct != "application/json" {
					t.Errorf("request %d: Content-Type %q, want application/json", i+1, ct)
				}
				out := decode(t, r.body)
				if out.OverallCode != rlsv3.RateLimitResponse_OK {
					t.Errorf("request %d: overall %v, want OK", i+1, out.OverallCode)
				}
				st := out.Statuses[0]
				if st.CurrentLimit.GetName() != "per-key" || st.CurrentLimit.GetRequestsPerUnit() != 2 ||
					st.CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE {
					t.Errorf("request %d: current limit %v, want per-key 2/MINUTE", i+1, st.CurrentLimit)
				}
				if int64(st.LimitRemaining) != wantRemaining {
					t.Errorf("request %d: limit_remaining %d, want %d", i+1, st.LimitRemaining, wantRemaining)
				}
				policy, state := rateLimitFields(t, r.header)
				if got := policy["per-key"]; got["q"] != 2 || got["w"] != 60 {
					t.Errorf("request %d: RateLimit-Policy %q, want per-key q=2 w=60", i+1, r.header.Get("RateLimit-Policy"))
				}
				if got := state["per-key"]; got["r"] != wantRemaining || got["t"] < 1 || got["t"] > 60 {
					t.Errorf("request %d: RateLimit %q, want per-key r=%d, t in 1..60", i+1, r.header.Get("RateLimit"), wantRemaining)
				}
				if got := r.header.Get("X-RateLimit-Remaining"); got != strconv.FormatInt(wantRemaining, 10) {
					t.Errorf("request %d: X-RateLimit-Remaining %q, want %d", i+1, got, wantRemaining)
				}
				if r.header.Get("Retry-After") != "" {
					t.Errorf("request %d: Retry-After on an allowed answer", i+1)
				}
			}

			r := f.do(t, "POST", path, keyReq)
			if r.status != http.StatusTooManyRequests {
				t.Fatalf("3rd request: status %d, want 429: %s", r.status, r.body)
			}
			// Both bodies decode as a RateLimitResponse; /v1/check's is also
			// a problem document.
			var out rlsv3.RateLimitResponse
			if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal([]byte(r.body), &out); err != nil {
				t.Fatalf("429 body is not a RateLimitResponse: %v\n%s", err, r.body)
			}
			if out.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || out.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT {
				t.Errorf("3rd request: %v, want OVER_LIMIT", &out)
			}
			if d := out.Statuses[0].DurationUntilReset.AsDuration(); d <= 0 {
				t.Errorf("duration_until_reset %v, want > 0", d)
			}
			if path == "/json" {
				if ct := r.header.Get("Content-Type"); ct != "application/json" {
					t.Errorf("/json 429 Content-Type %q, want application/json as Lyft", ct)
				}
				decode(t, r.body) // strictly a RateLimitResponse, nothing else
			} else {
				if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
					t.Errorf("/v1/check 429 Content-Type %q, want application/problem+json", ct)
				}
				var p struct {
					Type, Title, Detail, Instance, Limit string
					Status                               int
					RetryAfter                           int `json:"retry_after"`
				}
				if err := json.Unmarshal([]byte(r.body), &p); err != nil {
					t.Fatalf("problem body: %v", err)
				}
				if p.Type != "about:blank" || p.Title != "Too Many Requests" || p.Status != 429 || p.Instance != "/v1/check" ||
					p.Limit != "per-key" || p.Detail == "" || p.RetryAfter < 1 {
					t.Errorf("problem %+v", p)
				}
			}
			ra, err := strconv.Atoi(r.header.Get("Retry-After"))
			if err != nil || ra < 1 || ra > 30 {
				t.Errorf("Retry-After %q, want 1..30 seconds (one token of 2/min)", r.header.Get("Retry-After"))
			}
			_, state := rateLimitFields(t, r.header)
			if got := state["per-key"]; got["r"] != 0 {
				t.Errorf("429 RateLimit %q, want r=0", r.header.Get("RateLimit"))
			}
			if got := r.header.Get("X-RateLimit-Limit"); got != "2" {
				t.Errorf("X-RateLimit-Limit %q, want 2", got)
			}
		})
	}
}

// TestJSONLikeLyft pins /json to envoyproxy/ratelimit's answers.
func TestJSONLikeLyft(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	lyftBadRequest := func(t *testing.T, r reply) {
		t.Helper()
		if r.status != http.StatusBadRequest || r.body != "Bad Request\n" || !strings.HasPrefix(r.header.Get("Content-Type"), "text/plain") {
			t.Errorf("got %d %q %q, want 400 text/plain \"Bad Request\\n\"", r.status, r.header.Get("Content-Type"), r.body)
		}
	}
	t.Run("no ruleset yet", func(t *testing.T) { lyftBadRequest(t, f.do(t, "POST", "/json", keyReq)) })
	f.apply(t)
	for name, body := range map[string]string{
		"not json":       "{",
		"unknown field":  `{"domain":"api","bogus":1}`,
		"empty domain":   `{"descriptors":[{"entries":[{"key":"a","value":"b"}]}]}`,
		"no descriptors": `{"domain":"api"}`,
	} {
		t.Run(name, func(t *testing.T) { lyftBadRequest(t, f.do(t, "POST", "/json", body)) })
	}
	t.Run("unknown domain is OK", func(t *testing.T) {
		r := f.do(t, "POST", "/json", `{"domain":"nope","descriptors":[{"entries":[{"key":"a","value":"b"}]}]}`)
		if r.status != 200 || decode(t, r.body).OverallCode != rlsv3.RateLimitResponse_OK {
			t.Errorf("got %d %s, want 200 OK", r.status, r.body)
		}
	})
}

func TestHTTPNoLimitAndUnlimited(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.apply(t)
	r := f.do(t, "POST", "/v1/check", `{"domain":"api","descriptors":[{"entries":[{"key":"nothing","value":"x"}]},{"entries":[{"key":"internal","value":"x"}]}],"hitsAddend":5}`)
	if r.status != http.StatusOK {
		t.Fatalf("status %d, want 200: %s", r.status, r.body)
	}
	out := decode(t, r.body)
	if st := out.Statuses[0]; st.Code != rlsv3.RateLimitResponse_OK || st.CurrentLimit != nil {
		t.Errorf("unmatched status %v, want OK without current_limit", st)
	}
	if st := out.Statuses[1]; st.Code != rlsv3.RateLimitResponse_OK || st.CurrentLimit != nil || st.LimitRemaining != 1<<32-1 {
		t.Errorf("unlimited status %v, want OK, no current_limit, remaining MaxUint32", st)
	}
	if r.header.Get("RateLimit") != "" {
		t.Errorf("RateLimit header %q without a counted limit", r.header.Get("RateLimit"))
	}
}

func TestHTTPBadRequests(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.apply(t)
	tests := []struct {
		name, method, path, body string
		status                   int
		code                     string
	}{
		{"not json", "POST", "/v1/check", "{", 400, "invalid_request"},
		{"unknown field", "POST", "/v1/check", `{"domain":"api","bogus":1}`, 400, "invalid_request"},
		{"wrong type", "POST", "/v1/check", `{"domain":"api","descriptors":"x"}`, 400, "invalid_request"},
		{"empty domain", "POST", "/v1/check", `{"descriptors":[{"entries":[{"key":"a","value":"b"}]}]}`, 400, "invalid_request"},
		{"bad override unit", "POST", "/v1/check", `{"domain":"api","descriptors":[{"entries":[{"key":"a","value":"b"}],"limit":{"requestsPerUnit":1}}]}`, 400, "invalid_request"},
		{"no descriptors", "POST", "/v1/check", `{"domain":"api"}`, 400, "invalid_request"},
		{"negative hits", "POST", "/v1/check", `{"domain":"api","descriptors":[{"entries":[{"key":"a","value":"b"}],"isNegativeHits":true}]}`, 400, "invalid_request"},
		{"too large", "POST", "/json", `{"domain":"` + strings.Repeat("a", checkserver.MaxBodyBytes) + `"}`, 413, "too_large"},
		{"wrong method", "GET", "/json", "", 405, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := f.do(t, tt.method, tt.path, tt.body)
			if r.status != tt.status {
				t.Fatalf("status %d, want %d: %s", r.status, tt.status, r.body)
			}
			if tt.code == "" {
				return
			}
			var body struct {
				Error struct{ Code, Message string }
			}
			if err := json.Unmarshal([]byte(r.body), &body); err != nil {
				t.Fatalf("error body is not JSON: %v: %s", err, r.body)
			}
			if body.Error.Code != tt.code || body.Error.Message == "" {
				t.Errorf("error %+v, want code %q and a message", body.Error, tt.code)
			}
		})
	}
}

func TestHealthAndReadiness(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	if r := f.do(t, "GET", "/healthz", ""); r.status != 200 {
		t.Errorf("/healthz %d, want 200", r.status)
	}
	r := f.do(t, "GET", "/readyz", "")
	if r.status != 503 || !strings.Contains(r.body, "no ruleset") {
		t.Errorf("/readyz before a ruleset: %d %s, want 503 no ruleset", r.status, r.body)
	}
	r = f.do(t, "POST", "/v1/check", keyReq)
	if r.status != 503 || !strings.Contains(r.body, "not_ready") {
		t.Errorf("check before a ruleset: %d %s, want 503 not_ready", r.status, r.body)
	}

	f.apply(t)
	if r := f.do(t, "GET", "/readyz", ""); r.status != 200 {
		t.Errorf("/readyz with ruleset and Redis: %d %s, want 200", r.status, r.body)
	}
	f.srv.Drain()
	if r := f.do(t, "GET", "/readyz", ""); r.status != 503 || !strings.Contains(r.body, "shutting down") {
		t.Errorf("/readyz while draining: %d %s, want 503", r.status, r.body)
	}

	down := newFixture(t, func(context.Context) error { return errors.New("dial tcp: connection refused") })
	down.apply(t)
	r = down.do(t, "GET", "/readyz", "")
	if r.status != 503 || !strings.Contains(r.body, "store unreachable") || strings.Contains(r.body, "refused") {
		t.Errorf("/readyz with store down: %d %s, want 503 with a generic reason", r.status, r.body)
	}
}

func TestMetrics(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.apply(t)
	for range 3 {
		f.do(t, "POST", "/json", keyReq)
	}
	f.do(t, "POST", "/json", `{"domain":"someone-elses","descriptors":[{"entries":[{"key":"a","value":"b"}]}]}`)
	f.do(t, "POST", "/json", `{`)
	r := f.do(t, "GET", "/metrics", "")
	if r.status != 200 {
		t.Fatalf("/metrics %d", r.status)
	}
	for _, want := range []string{
		`sluice_enforcer_decisions_total{code="ok",domain="api"} 2`,
		`sluice_enforcer_decisions_total{code="over_limit",domain="api"} 1`,
		`sluice_enforcer_decisions_total{code="ok",domain="_unknown"} 1`,
		`sluice_enforcer_rule_decisions_total{domain="api",result="limited",rule="per-key"} 1`,
		`sluice_enforcer_rule_decisions_total{domain="api",result="allowed",rule="per-key"} 2`,
		`sluice_enforcer_ruleset_version 1`,
		`sluice_enforcer_check_duration_seconds_count{transport="http"} 4`,
		`sluice_enforcer_store_errors_total 0`,
	} {
		if !strings.Contains(r.body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

func TestGRPCShouldRateLimit(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	g := grpc.NewServer()
	f.srv.RegisterGRPC(g)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go g.Serve(ln)
	t.Cleanup(g.Stop)

	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	client := rlsv3.NewRateLimitServiceClient(conn)
	ctx := context.Background()
	req := &rlsv3.RateLimitRequest{
		Domain: "api",
		Descriptors: []*ratelimitv3.RateLimitDescriptor{{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "api_key", Value: "grpc"}},
		}},
	}

	_, err = client.ShouldRateLimit(ctx, req)
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("before a ruleset: %v, want Unavailable", err)
	}
	f.apply(t)

	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		resp, err := client.ShouldRateLimit(ctx, req)
		if err != nil {
			t.Fatalf("request %d: %v", i+1, err)
		}
		if resp.OverallCode != want || resp.Statuses[0].Code != want {
			t.Errorf("request %d: %v, want %v", i+1, resp, want)
		}
		if resp.Statuses[0].CurrentLimit.GetName() != "per-key" {
			t.Errorf("request %d: current limit %v, want per-key", i+1, resp.Statuses[0].CurrentLimit)
		}
	}

	_, err = client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Descriptors: req.Descriptors})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("empty domain: %v, want InvalidArgument", err)
	}

	// gRPC and HTTP share the engine and its counters.
	r := f.do(t, "POST", "/json", `{"domain":"api","descriptors":[{"entries":[{"key":"api_key","value":"grpc"}]}]}`)
	if r.status != http.StatusTooManyRequests {
		t.Errorf("HTTP after gRPC drained the key: %d, want 429", r.status)
	}
}

// grpcClient serves f's gRPC service on a loopback listener and returns a
// client built on go-control-plane's types, as Envoy calls it.
func grpcClient(t *testing.T, f *fixture) rlsv3.RateLimitServiceClient {
	t.Helper()
	g := grpc.NewServer()
	f.srv.RegisterGRPC(g)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go g.Serve(ln)
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

func descriptor(key, value string) *ratelimitv3.RateLimitDescriptor {
	return &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: key, Value: value}}}
}

func TestGRPCStatusesHitsAndHeaders(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.apply(t)
	client := grpcClient(t, f)
	ctx := context.Background()

	tenant := descriptor("tenant", "t1")
	tenant.HitsAddend = wrapperspb.UInt64(5) // overrides the request's 3
	resp, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
		Domain:      "api",
		Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("api_key", "g1"), tenant, descriptor("nothing", "x")},
		HitsAddend:  2,
	})
	if err != nil {
		t.Fatal(err)
	}
	if resp.OverallCode != rlsv3.RateLimitResponse_OK || len(resp.Statuses) != 3 {
		t.Fatalf("response %v, want OK with 3 statuses", resp)
	}
	key, ten, none := resp.Statuses[0], resp.Statuses[1], resp.Statuses[2]
	if key.CurrentLimit.GetName() != "per-key" || key.LimitRemaining != 0 || key.DurationUntilReset.AsDuration() <= 0 {
		t.Errorf("api_key status %v, want per-key with 0 remaining after 2 hits", key)
	}
	if ten.CurrentLimit.GetName() != "per-tenant" || ten.CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_HOUR ||
		ten.LimitRemaining != 5 || ten.DurationUntilReset.AsDuration() <= 0 {
		t.Errorf("tenant status %v, want per-tenant/HOUR with 5 remaining after 5 hits", ten)
	}
	if none.Code != rlsv3.RateLimitResponse_OK || none.CurrentLimit != nil {
		t.Errorf("unmatched status %v, want OK without a limit", none)
	}

	// The headers Envoy adds to the response, parsed as a client would.
	h := http.Header{}
	for _, hv := range resp.ResponseHeadersToAdd {
		h.Add(hv.Key, hv.Value)
	}
	policy, state := rateLimitFields(t, h)
	if policy["per-key"]["q"] != 2 || policy["per-tenant"]["q"] != 10 || policy["per-tenant"]["w"] != 3600 {
		t.Errorf("RateLimit-Policy %q, want per-key q=2 and per-tenant q=10 w=3600", h.Get("RateLimit-Policy"))
	}
	if state["per-key"]["r"] != 0 || state["per-tenant"]["r"] != 5 {
		t.Errorf("RateLimit %q, want per-key r=0, per-tenant r=5", h.Get("RateLimit"))
	}
	if h.Get("X-RateLimit-Limit") != "2" || h.Get("X-RateLimit-Remaining") != "0" || h.Get("Retry-After") != "" {
		t.Errorf("legacy headers %v, want the most restrictive (per-key) and no Retry-After", h)
	}

	// Over limit: Retry-After joins the headers; the tenant is not charged.
	resp, err = client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
		Domain:      "api",
		Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("api_key", "g1"), descriptor("tenant", "t1")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT ||
		resp.Statuses[1].Code != rlsv3.RateLimitResponse_OK || resp.Statuses[1].LimitRemaining != 5 {
		t.Errorf("response %v, want OVER_LIMIT on api_key only, tenant still at 5", resp)
	}
	var retry string
	for _, hv := range resp.ResponseHeadersToAdd {
		if hv.Key == "Retry-After" {
			retry = hv.Value
		}
	}
	if n, err := strconv.Atoi(retry); err != nil || n < 1 {
		t.Errorf("Retry-After %q in response_headers_to_add, want >= 1", retry)
	}
}

func TestGRPCShadowModeCounts(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.apply(t)
	client := grpcClient(t, f)
	req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("shadow", "s1")}}
	for i := range 3 {
		resp, err := client.ShouldRateLimit(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].Code != rlsv3.RateLimitResponse_OK {
			t.Errorf("request %d: %v, want OK (shadow mode never rejects)", i+1, resp)
		}
		if resp.Statuses[0].CurrentLimit.GetName() != "shadowed" {
			t.Errorf("request %d: current_limit %v, want the shadow limit reported", i+1, resp.Statuses[0].CurrentLimit)
		}
	}
	r := f.do(t, "GET", "/metrics", "")
	for _, want := range []string{
		`sluice_enforcer_rule_decisions_total{domain="api",result="allowed",rule="shadowed"} 1`,
		`sluice_enforcer_rule_decisions_total{domain="api",result="shadow_limited",rule="shadowed"} 2`,
		`sluice_enforcer_decisions_total{code="ok",domain="api"} 3`,
	} {
		if !strings.Contains(r.body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

func TestGRPCLimitOverride(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.apply(t)
	client := grpcClient(t, f)
	d := descriptor("unconfigured", "o1")
	d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_MINUTE}
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		resp, err := client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}})
		if err != nil {
			t.Fatal(err)
		}
		st := resp.Statuses[0]
		if st.Code != want || st.CurrentLimit.GetRequestsPerUnit() != 1 || st.CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE {
			t.Errorf("request %d: %v, want %v under the 1/MINUTE override", i+1, st, want)
		}
	}
	// In a domain the ruleset does not know, an override applies nothing.
	resp, err := client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "other", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}})
	if err != nil || resp.Statuses[0].CurrentLimit != nil {
		t.Errorf("unknown domain: %v %v, want no limit", resp, err)
	}
}

func TestDetailedMetricIsBounded(t *testing.T) {
	t.Parallel()
	client, err := limiter.NewClient(testenv.RedisURL(t), limiter.WithTimeout(2*time.Second), limiter.WithDialTimeout(2*time.Second)) // a loaded machine must not fail open
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	eng := engine.New(limiter.NewRedis(client), testenv.KeyPrefix(t))
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg, metrics.Options{Engine: eng, MaxDetailedValues: 3})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := checkserver.New(eng, checkserver.Options{Registry: reg, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	f := &fixture{eng: eng, srv: srv, url: hs.URL}
	f.apply(t)
	for i := range 10 {
		f.do(t, "POST", "/v1/check", `{"domain":"api","descriptors":[{"entries":[{"key":"detailed","value":"v`+strconv.Itoa(i)+`"}]}]}`)
	}
	f.do(t, "POST", "/v1/check", `{"domain":"api","descriptors":[{"entries":[{"key":"detailed","value":"v0"}]}]}`)
	body := f.do(t, "GET", "/metrics", "").body
	for _, want := range []string{
		`sluice_enforcer_detailed_decisions_total{domain="api",result="allowed",rule="detailed",value="detailed_v0"} 2`,
		`sluice_enforcer_detailed_decisions_total{domain="api",result="allowed",rule="detailed",value="detailed_v2"} 1`,
		`sluice_enforcer_detailed_decisions_total{domain="api",result="allowed",rule="detailed",value="_other"} 7`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if strings.Contains(body, `value="detailed_v3"`) {
		t.Error("a 4th value got its own series past the cap of 3")
	}
	if strings.Contains(body, `rule="per-key",value=`) {
		t.Error("a limit without detailed_metric has per-value series")
	}
}

// TestRequestBoundsOnEveryTransport: the engine's bounds of one request
// reach clients as each transport reports an invalid request.
func TestRequestBoundsOnEveryTransport(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.apply(t)
	client := grpcClient(t, f)
	body := func(n int) string {
		ds := make([]string, n)
		for i := range ds {
			ds[i] = fmt.Sprintf(`{"entries":[{"key":"user","value":"u%d"}]}`, i)
		}
		return `{"domain":"api","descriptors":[` + strings.Join(ds, ",") + `]}`
	}
	msg := func(n int) *rlsv3.RateLimitRequest {
		m := &rlsv3.RateLimitRequest{Domain: "api"}
		for i := range n {
			m.Descriptors = append(m.Descriptors, descriptor("user", fmt.Sprintf("u%d", i)))
		}
		return m
	}
	for _, tt := range []struct {
		name string
		n    int
		ok   bool
	}{
		{"at the bound", engine.MaxDescriptors, true},
		{"over the bound", engine.MaxDescriptors + 1, false},
		{"the attack", 20_000, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := f.do(t, "POST", "/v1/check", body(tt.n))
			if tt.ok != (r.status == http.StatusOK) || !tt.ok && (r.status != http.StatusBadRequest || !strings.Contains(r.body, "descriptors, at most")) {
				t.Errorf("/v1/check: %d %s", r.status, r.body)
			}
			r = f.do(t, "POST", "/json", body(tt.n))
			if tt.ok != (r.status == http.StatusOK) || !tt.ok && r.status != http.StatusBadRequest {
				t.Errorf("/json: %d %s", r.status, r.body)
			}
			_, err := client.ShouldRateLimit(context.Background(), msg(tt.n))
			if tt.ok && err != nil || !tt.ok && status.Code(err) != codes.InvalidArgument {
				t.Errorf("gRPC: %v", err)
			}
		})
	}
}

// TestCurrentLimitNameOnlyWhenNamed: as in envoyproxy/ratelimit,
// current_limit.name is the configured rate_limit.name, and empty when the
// rules name none (stats still count the limit under its path name), over
// HTTP /json and gRPC alike.
func TestCurrentLimitNameOnlyWhenNamed(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.apply(t)
	for _, tt := range []struct{ key, want string }{{"anon", ""}, {"api_key", "per-key"}} {
		body := `{"domain":"api","descriptors":[{"entries":[{"key":"` + tt.key + `","value":"v"}]}]}`
		r := f.do(t, "POST", "/json", body)
		if r.status != http.StatusOK {
			t.Fatalf("%s: status %d: %s", tt.key, r.status, r.body)
		}
		st := decode(t, r.body).Statuses[0]
		if st.CurrentLimit == nil || st.CurrentLimit.GetName() != tt.want || st.CurrentLimit.GetRequestsPerUnit() == 0 {
			t.Errorf("/json %s: current_limit %v, want name %q and the limit", tt.key, st.CurrentLimit, tt.want)
		}
		resp, err := grpcClient(t, f).ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{
			Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor(tt.key, "w")},
		})
		if err != nil {
			t.Fatal(err)
		}
		if got := resp.Statuses[0].GetCurrentLimit().GetName(); got != tt.want {
			t.Errorf("gRPC %s: current_limit.name %q, want %q", tt.key, got, tt.want)
		}
	}
	// A limit override carries no name either, as in Lyft.
	resp, err := grpcClient(t, f).ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{
		Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "api_key", Value: "o"}},
			Limit:   &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 7, Unit: typev3.RateLimitUnit_HOUR},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if l := resp.Statuses[0].GetCurrentLimit(); l.GetName() != "" || l.GetRequestsPerUnit() != 7 {
		t.Errorf("override: current_limit %v, want 7 a hour without a name", l)
	}
}
