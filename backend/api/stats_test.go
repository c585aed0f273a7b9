package api_test

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend/api"
	"github.com/sluicehq/sluice/backend/hub"
	"github.com/sluicehq/sluice/backend/stats"
	"github.com/sluicehq/sluice/internal/apicheck"
)

func TestStatsQueriesRefuseBadRanges(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	now := time.Now().UTC()
	at := func(d time.Duration) string { return url.QueryEscape(now.Add(d).Format(time.RFC3339)) }
	tests := []struct {
		name, path string
		status     int
		want       string
	}{
		{"an hour of history", "/api/v1/stats/history?domain=api&from=" + at(-time.Hour), 200, `"step_s":60`},
		{"inverted history", "/api/v1/stats/history?from=" + at(0) + "&to=" + at(-time.Hour), 400, "must be before"},
		{"enormous history", "/api/v1/stats/history?step=86400&from=" + at(-400*24*time.Hour), 400, "over 31 days"},
		{"too many steps", "/api/v1/stats/history?from=" + at(-20*24*time.Hour), 400, "choose a larger step"},
		{"step not minutes", "/api/v1/stats/history?step=45", 400, "multiple of 60"},
		{"step not a number", "/api/v1/stats/history?step=x", 400, "whole number"},
		{"from not a time", "/api/v1/stats/history?from=yesterday", 400, "RFC 3339"},
		{"rule without domain", "/api/v1/stats/totals?rule=r", 400, "needs a domain"},
		{"inverted totals", "/api/v1/stats/totals?from=" + at(time.Hour), 400, "must be before"},
		{"totals", "/api/v1/stats/totals?domain=api", 200, `"rules":[]`},
		{"live", "/api/v1/stats/live", 200, `"step_s":1`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, body := f.call(t, "GET", tt.path, "viewer", "")
			if status != tt.status || !strings.Contains(body, tt.want) {
				t.Errorf("GET %s = %d %s, want %d with %q", tt.path, status, body, tt.status, tt.want)
			}
		})
	}
}

func TestAlertSettings(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	tests := []struct {
		name, body string
		status     int
		want       string
	}{
		{"webhook and defaults", `{"webhooks":[{"url":"https://hooks.example.com/x","events":["spike.start"]}],"spike_defaults":{"floor_per_s":2,"factor":3,"for_s":4},"domains":{"api":{"mask_values":true,"factor":10}}}`,
			200, `"floor_per_s":2`},
		{"not a URL", `{"webhooks":[{"url":"ftp://x"}]}`, 400, "webhooks[0].url"},
		{"unknown event", `{"webhooks":[{"url":"http://x","events":["spike.maybe"]}]}`, 400, "spike.maybe"},
		{"factor under one", `{"spike_defaults":{"factor":0.5}}`, 400, "spike_defaults.factor"},
		{"negative floor", `{"domains":{"api":{"floor_per_s":-1}}}`, 400, "domains.api.floor_per_s"},
		{"NUL in a domain", `{"domains":{"a\u0000b":{}}}`, 400, "NUL"},
		{"unknown field", `{"webhook":[]}`, 400, "unknown field"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, body := f.call(t, "PUT", "/api/v1/alerts", "admin", tt.body)
			if status != tt.status || !strings.Contains(body, tt.want) {
				t.Errorf("PUT = %d %s, want %d with %q", status, body, tt.status, tt.want)
			}
		})
	}
	// The good one stuck, with defaults for what it left out, and was
	// audited; viewers learn which domains mask their values.
	if status, body := f.call(t, "GET", "/api/v1/alerts", "admin", ""); status != 200 || !strings.Contains(body, `"mask_values":true`) || !strings.Contains(body, `"deliveries":[]`) {
		t.Errorf("GET /alerts = %d %s", status, body)
	}
	if status, body := f.call(t, "GET", "/api/v1/audit?action=alerts.update", "viewer", ""); status != 200 || strings.Count(body, `"alerts.update"`) != 1 {
		t.Errorf("audit = %d %s, want one alerts.update", status, body)
	}
	if status, body := f.call(t, "GET", "/api/v1/stats/settings", "viewer", ""); status != 200 || body != `{"domains":{"api":{"mask_values":true}}}` {
		t.Errorf("stats settings = %d %s", status, body)
	}
	if status, body := f.call(t, "POST", "/api/v1/alerts/test", "admin", ""); status != http.StatusAccepted || body != `{"queued":1}` {
		t.Errorf("test alert = %d %s, want 202 queued 1", status, body)
	}
	if status, body := f.call(t, "GET", "/api/v1/alerts", "admin", ""); status != 200 || !strings.Contains(body, `"event":"alert.test"`) || !strings.Contains(body, `"status":"pending"`) {
		t.Errorf("the test delivery is not listed: %d %s", status, body)
	}
}

func TestMetricsAuth(t *testing.T) {
	t.Parallel()
	f := newFixture(t) // /metrics open: the default
	if status, _ := f.call(t, "GET", "/metrics", "", ""); status != http.StatusOK {
		t.Errorf("open /metrics = %d, want 200", status)
	}
	log := slog.New(slog.DiscardHandler)
	locked := httptest.NewServer(apicheck.Handler(t, api.New(api.Config{Store: f.store, Hub: hub.New(f.store, log), Stats: stats.New(stats.Config{Store: f.store}),
		Log: log, MetricsAuth: true})))
	defer locked.Close()
	for _, tt := range []struct {
		cred   string
		status int
	}{{"", 401}, {"garbage", 401}, {"node", 403}, {"viewer", 200}, {"admin", 200}} {
		req, _ := http.NewRequest("GET", locked.URL+"/metrics", nil)
		if tt.cred != "" {
			req.Header.Set("Authorization", "Bearer "+f.tokens[tt.cred])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tt.status {
			t.Errorf("--metrics-auth: GET /metrics as %q = %d, want %d", tt.cred, resp.StatusCode, tt.status)
		}
	}
}
