package headers_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/enforcer/headers"
	"github.com/sluicehq/sluice/rules"
)

func TestSet(t *testing.T) {
	perMinute := &rules.Limit{Name: "per-key", Unit: rules.Minute, RequestsPerUnit: 100, Period: time.Minute}
	perSecond := &rules.Limit{Name: `we"ird\näme`, Unit: rules.Second, RequestsPerUnit: 10, Period: time.Second}
	shadow := &rules.Limit{Name: "shadow", Unit: rules.Minute, RequestsPerUnit: 1, Period: time.Minute, ShadowMode: true}

	tests := []struct {
		name string
		res  engine.Result
		want http.Header
	}{
		{
			name: "no limits",
			res:  engine.Result{Code: engine.OK, Statuses: []engine.Status{{Code: engine.OK}}},
			want: http.Header{},
		},
		{
			name: "allowed picks fewest remaining",
			res: engine.Result{Code: engine.OK, Statuses: []engine.Status{
				{Code: engine.OK, Limit: perMinute, Remaining: 40, ResetAfter: 1500 * time.Millisecond},
				{Code: engine.OK, Limit: perSecond, Remaining: 3, ResetAfter: 700 * time.Millisecond},
				{Code: engine.OK, Limit: shadow, Remaining: 0, Shadowed: true},
			}},
			want: http.Header{
				"Ratelimit-Policy":      {`"we\"ird\\n_me";q=10;w=1`},
				"Ratelimit":             {`"we\"ird\\n_me";r=3;t=1`},
				"X-Ratelimit-Limit":     {"10"},
				"X-Ratelimit-Remaining": {"3"},
				"X-Ratelimit-Reset":     {"1"},
			},
		},
		{
			name: "over limit picks the rejecting status and sets Retry-After",
			res: engine.Result{Code: engine.OverLimit, Statuses: []engine.Status{
				{Code: engine.OK, Limit: perSecond, Remaining: 0, ResetAfter: time.Second},
				{Code: engine.OverLimit, Limit: perMinute, Remaining: 0, ResetAfter: 59 * time.Second, RetryAfter: 599 * time.Millisecond},
			}},
			want: http.Header{
				"Ratelimit-Policy":      {`"per-key";q=100;w=60`},
				"Ratelimit":             {`"per-key";r=0;t=59`},
				"Retry-After":           {"1"},
				"X-Ratelimit-Limit":     {"100"},
				"X-Ratelimit-Remaining": {"0"},
				"X-Ratelimit-Reset":     {"59"},
			},
		},
		{
			name: "fail closed has only Retry-After",
			res: engine.Result{Code: engine.OverLimit, Statuses: []engine.Status{
				{Code: engine.OverLimit, Limit: perMinute, StoreFailed: true},
			}},
			want: http.Header{"Retry-After": {"1"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := http.Header{}
			headers.Set(got, tt.res)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("headers (-want +got):\n%s", diff)
			}
		})
	}
}
