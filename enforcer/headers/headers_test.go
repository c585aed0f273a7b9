package headers_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/enforcer/headers"
	"github.com/sluicehq/sluice/enforcer/internal/sfv"
	"github.com/sluicehq/sluice/rules"
)

var (
	perMinute = &rules.Limit{Name: "per-key", Unit: rules.Minute, RequestsPerUnit: 100, Period: time.Minute}
	perSecond = &rules.Limit{Name: `we"ird\näme`, Unit: rules.Second, RequestsPerUnit: 10, Period: time.Second}
	shadow    = &rules.Limit{Name: "shadow", Unit: rules.Minute, RequestsPerUnit: 1, Period: time.Minute, ShadowMode: true}
	daily     = &rules.Limit{Name: "daily", Unit: rules.Day, RequestsPerUnit: 5000, Period: 24 * time.Hour}
)

// member is one parsed list member of an IETF field: name and parameters.
type member struct {
	Name   string
	Params map[string]int64
}

// parse reads an IETF rate-limit field as a strict structured-field client
// does; each member must be a string with integer parameters.
func parse(t *testing.T, h http.Header, name string) []member {
	t.Helper()
	lines := h.Values(name)
	if len(lines) == 0 {
		return nil
	}
	items, err := sfv.ParseList(lines...)
	if err != nil {
		t.Fatalf("%s: %q is not a structured-field list: %v", name, lines, err)
	}
	var out []member
	for _, it := range items {
		s, ok := it.Value.(string)
		if !ok {
			t.Fatalf("%s: member %v is not a string", name, it.Value)
		}
		m := member{Name: s, Params: map[string]int64{}}
		for _, p := range it.Params {
			n, ok := p.Value.(int64)
			if !ok {
				t.Fatalf("%s: parameter %s=%v is not an integer", name, p.Key, p.Value)
			}
			m.Params[p.Key] = n
		}
		out = append(out, m)
	}
	return out
}

func TestSet(t *testing.T) {
	tests := []struct {
		name       string
		res        engine.Result
		wantPolicy []member
		wantState  []member
		wantLegacy []string // limit, remaining, reset
		wantRetry  string
	}{
		{
			name: "no limits",
			res:  engine.Result{Code: engine.OK, Statuses: []engine.Status{{Code: engine.OK}}},
		},
		{
			name: "allowed: fewest remaining first, shadow never reported",
			res: engine.Result{Code: engine.OK, Statuses: []engine.Status{
				{Code: engine.OK, Limit: perMinute, Remaining: 40, ResetAfter: 1500 * time.Millisecond},
				{Code: engine.OK, Limit: perSecond, Remaining: 3, ResetAfter: 700 * time.Millisecond},
				{Code: engine.OK, Limit: shadow, Remaining: 0, Shadowed: true},
			}},
			wantPolicy: []member{
				{`we"ird\n_me`, map[string]int64{"q": 10, "w": 1}},
				{"per-key", map[string]int64{"q": 100, "w": 60}},
			},
			wantState: []member{
				{`we"ird\n_me`, map[string]int64{"r": 3, "t": 1}},
				{"per-key", map[string]int64{"r": 40, "t": 2}},
			},
			wantLegacy: []string{"10", "3", "1"},
		},
		{
			name: "over limit: the rejecting limit first, Retry-After rounded up",
			res: engine.Result{Code: engine.OverLimit, Statuses: []engine.Status{
				{Code: engine.OK, Limit: perSecond, Remaining: 0, ResetAfter: time.Second},
				{Code: engine.OverLimit, Limit: perMinute, Remaining: 0, ResetAfter: 59 * time.Second, RetryAfter: 599 * time.Millisecond},
				{Code: engine.OK, Limit: daily, Remaining: 4000, ResetAfter: time.Hour},
			}},
			wantPolicy: []member{
				{"per-key", map[string]int64{"q": 100, "w": 60}},
				{`we"ird\n_me`, map[string]int64{"q": 10, "w": 1}},
				{"daily", map[string]int64{"q": 5000, "w": 86400}},
			},
			wantState: []member{
				{"per-key", map[string]int64{"r": 0, "t": 59}},
				{`we"ird\n_me`, map[string]int64{"r": 0, "t": 1}},
				{"daily", map[string]int64{"r": 4000, "t": 3600}},
			},
			wantLegacy: []string{"100", "0", "59"},
			wantRetry:  "1",
		},
		{
			name: "one name reported once",
			res: engine.Result{Code: engine.OK, Statuses: []engine.Status{
				{Code: engine.OK, Limit: perMinute, Remaining: 40, ResetAfter: time.Second},
				{Code: engine.OK, Limit: perMinute, Remaining: 20, ResetAfter: time.Second},
			}},
			wantPolicy: []member{{"per-key", map[string]int64{"q": 100, "w": 60}}},
			wantState:  []member{{"per-key", map[string]int64{"r": 20, "t": 1}}},
			wantLegacy: []string{"100", "20", "1"},
		},
		{
			name: "local fallback decisions are reported",
			res: engine.Result{Code: engine.OK, Statuses: []engine.Status{
				{Code: engine.OK, Limit: perMinute, Remaining: 7, ResetAfter: time.Second, StoreFailed: true, Local: true},
			}},
			wantPolicy: []member{{"per-key", map[string]int64{"q": 100, "w": 60}}},
			wantState:  []member{{"per-key", map[string]int64{"r": 7, "t": 1}}},
			wantLegacy: []string{"100", "7", "1"},
		},
		{
			name: "fail closed has only Retry-After",
			res: engine.Result{Code: engine.OverLimit, Statuses: []engine.Status{
				{Code: engine.OverLimit, Limit: perMinute, StoreFailed: true},
			}},
			wantRetry: "1",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			headers.Set(h, tt.res)
			if diff := cmp.Diff(tt.wantPolicy, parse(t, h, "RateLimit-Policy")); diff != "" {
				t.Errorf("RateLimit-Policy %q (-want +got):\n%s", h.Get("RateLimit-Policy"), diff)
			}
			if diff := cmp.Diff(tt.wantState, parse(t, h, "RateLimit")); diff != "" {
				t.Errorf("RateLimit %q (-want +got):\n%s", h.Get("RateLimit"), diff)
			}
			var legacy []string
			if h.Get("X-RateLimit-Limit") != "" {
				legacy = []string{h.Get("X-RateLimit-Limit"), h.Get("X-RateLimit-Remaining"), h.Get("X-RateLimit-Reset")}
			}
			if diff := cmp.Diff(tt.wantLegacy, legacy); diff != "" {
				t.Errorf("legacy headers (-want +got):\n%s", diff)
			}
			if got := h.Get("Retry-After"); got != tt.wantRetry {
				t.Errorf("Retry-After %q, want %q", got, tt.wantRetry)
			}
		})
	}
}

func TestSetReplaces(t *testing.T) {
	h := http.Header{"Ratelimit": {`"old";r=1;t=1`}, "X-Ratelimit-Remaining": {"99"}}
	headers.Set(h, engine.Result{Code: engine.OK, Statuses: []engine.Status{{Code: engine.OK, Limit: perMinute, Remaining: 5, ResetAfter: time.Second}}})
	if got := h.Values("RateLimit"); len(got) != 1 || got[0] != `"per-key";r=5;t=1` {
		t.Errorf("RateLimit %q, want only ours", got)
	}
	if got := h.Values("X-RateLimit-Remaining"); len(got) != 1 || got[0] != "5" {
		t.Errorf("X-RateLimit-Remaining %q, want only ours", got)
	}
}

func TestWriteProblem(t *testing.T) {
	tests := []struct {
		name   string
		res    engine.Result
		status int
		want   headers.Problem
	}{
		{
			name: "over limit",
			res: engine.Result{Code: engine.OverLimit, Statuses: []engine.Status{
				{Code: engine.OverLimit, Limit: perMinute, ResetAfter: time.Minute, RetryAfter: 2500 * time.Millisecond},
			}},
			want: headers.Problem{
				Type: "about:blank", Title: "Too Many Requests", Status: 429, Instance: "/x",
				Detail: `Rate limit "per-key" exceeded; retry in 3 s.`, Limit: "per-key", RetryAfter: 3,
			},
		},
		{
			name: "fail closed with a custom status",
			res: engine.Result{Code: engine.OverLimit, Statuses: []engine.Status{
				{Code: engine.OverLimit, Limit: perMinute, StoreFailed: true},
			}},
			status: 503,
			want: headers.Problem{
				Type: "about:blank", Title: "Service Unavailable", Status: 503, Instance: "/x",
				Detail: `The rate limiter is unavailable and the limit "per-key" fails closed; retry in 1 s.`, Limit: "per-key", RetryAfter: 1,
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			headers.WriteProblem(rec, headers.RateLimited(tt.res, tt.status, "/x"))
			if rec.Code != tt.want.Status {
				t.Errorf("status %d, want %d", rec.Code, tt.want.Status)
			}
			if ct := rec.Header().Get("Content-Type"); ct != "application/problem+json" {
				t.Errorf("Content-Type %q", ct)
			}
			var got headers.Problem
			if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
				t.Fatalf("body %q: %v", rec.Body, err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("problem (-want +got):\n%s", diff)
			}
		})
	}
}

func BenchmarkAppend(b *testing.B) {
	res := engine.Result{Code: engine.OK, Statuses: []engine.Status{
		{Code: engine.OK, Limit: perMinute, Remaining: 40, ResetAfter: 1500 * time.Millisecond},
		{Code: engine.OK, Limit: daily, Remaining: 3, ResetAfter: 700 * time.Millisecond},
	}}
	var buf [6]headers.Field
	b.ReportAllocs()
	for b.Loop() {
		headers.Append(buf[:0], res)
	}
}
