package checkserver_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/sluicehq/sluice/enforcer/checkserver"
	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/enforcer/limiter"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
)

const apiYAML = `domain: api
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 2, name: per-key}
  - key: internal
    rate_limit: {unlimited: true}
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
	client, err := limiter.NewClient(testenv.RedisURL(t))
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

func TestHTTPCheckThenOverLimit(t *testing.T) {
	for _, path := range []string{"/json", "/v1/check"} {
		t.Run(path, func(t *testing.T) {
			f := newFixture(t, nil)
			f.apply(t)
			for i, wantRemaining := range []string{"1", "0"} {
				r := f.do(t, "POST", path, keyReq)
				if r.status != http.StatusOK {
					t.Fatalf("request %d: status %d, want 200: %s", i+1, r.status, r.body)
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
				if got := strconv.Itoa(int(st.LimitRemaining)); got != wantRemaining {
					t.Errorf("request %d: limit_remaining %s, want %s", i+1, got, wantRemaining)
				}
				if got, want := r.header.Get("RateLimit-Policy"), `"per-key";q=2;w=60`; got != want {
					t.Errorf("request %d: RateLimit-Policy %q, want %q", i+1, got, want)
				}
				if got := r.header.Get("RateLimit"); !strings.HasPrefix(got, `"per-key";r=`+wantRemaining+";t=") {
					t.Errorf("request %d: RateLimit %q, want r=%s", i+1, got, wantRemaining)
				}
				if got := r.header.Get("X-RateLimit-Remaining"); got != wantRemaining {
					t.Errorf("request %d: X-RateLimit-Remaining %q, want %s", i+1, got, wantRemaining)
				}
				if r.header.Get("Retry-After") != "" {
					t.Errorf("request %d: Retry-After on an allowed answer", i+1)
				}
			}

			r := f.do(t, "POST", path, keyReq)
			if r.status != http.StatusTooManyRequests {
				t.Fatalf("3rd request: status %d, want 429: %s", r.status, r.body)
			}
			out := decode(t, r.body)
			if out.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || out.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT {
				t.Errorf("3rd request: %v, want OVER_LIMIT", out)
			}
			if d := out.Statuses[0].DurationUntilReset.AsDuration(); d <= 0 {
				t.Errorf("duration_until_reset %v, want > 0", d)
			}
			ra, err := strconv.Atoi(r.header.Get("Retry-After"))
			if err != nil || ra < 1 || ra > 30 {
				t.Errorf("Retry-After %q, want 1..30 seconds (one token of 2/min)", r.header.Get("Retry-After"))
			}
			for _, h := range []string{"RateLimit-Policy", "RateLimit", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"} {
				if r.header.Get(h) == "" {
					t.Errorf("429 without %s", h)
				}
			}
			if got := r.header.Get("X-RateLimit-Limit"); got != "2" {
				t.Errorf("X-RateLimit-Limit %q, want 2", got)
			}
		})
	}
}

func TestHTTPNoLimitAndUnlimited(t *testing.T) {
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
	f := newFixture(t, nil)
	f.apply(t)
	tests := []struct {
		name, method, path, body string
		status                   int
		code                     string
	}{
		{"not json", "POST", "/json", "{", 400, "invalid_request"},
		{"unknown field", "POST", "/json", `{"domain":"api","bogus":1}`, 400, "invalid_request"},
		{"wrong type", "POST", "/v1/check", `{"domain":"api","descriptors":"x"}`, 400, "invalid_request"},
		{"empty domain", "POST", "/json", `{"descriptors":[{"entries":[{"key":"a","value":"b"}]}]}`, 400, "invalid_request"},
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
	f := newFixture(t, nil)
	if r := f.do(t, "GET", "/healthz", ""); r.status != 200 {
		t.Errorf("/healthz %d, want 200", r.status)
	}
	r := f.do(t, "GET", "/readyz", "")
	if r.status != 503 || !strings.Contains(r.body, "no ruleset") {
		t.Errorf("/readyz before a ruleset: %d %s, want 503 no ruleset", r.status, r.body)
	}
	r = f.do(t, "POST", "/json", keyReq)
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
		`sluice_enforcer_check_duration_seconds_count{transport="http"} 4`,
		`sluice_enforcer_store_errors_total 0`,
	} {
		if !strings.Contains(r.body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

func TestGRPCShouldRateLimit(t *testing.T) {
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
