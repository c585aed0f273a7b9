package api_test

import (
	"net/url"
	"strings"
	"testing"
	"time"
)

func TestValueLookupsRefuseBadInput(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.token(t, "support", "support", nil)
	// Viewers see api's values masked: they cannot look one up.
	if status, body := f.call(t, "PUT", "/api/v1/alerts", "admin", `{"domains":{"api":{"mask_values":true}}}`); status != 200 {
		t.Fatalf("mask api = %d %s", status, body)
	}
	now := time.Now().UTC()
	at := func(d time.Duration) string { return url.QueryEscape(now.Add(d).Format(time.RFC3339)) }
	long := strings.Repeat("v", 257)
	tests := []struct {
		name, cred, path string
		status           int
		want             string
	}{
		{"a value's day", "viewer", "/api/v1/stats/values?domain=web&value=k1", 200, `"rules":[]`},
		{"a range", "viewer", "/api/v1/stats/values?domain=web&value=k1&from=" + at(-2*time.Hour) + "&to=" + at(-time.Hour), 200, `"step_s":60`},
		{"no domain", "viewer", "/api/v1/stats/values?value=k1", 400, "domain is required"},
		{"no value", "viewer", "/api/v1/stats/values?domain=web", 400, "value is required"},
		{"NUL in the value", "viewer", "/api/v1/stats/values?domain=web&value=k%001", 400, "NUL"},
		{"invalid UTF-8 in the value", "viewer", "/api/v1/stats/values?domain=web&value=k%ff", 400, "UTF-8"},
		{"NUL in the domain", "viewer", "/api/v1/stats/values?domain=w%00b&value=k1", 400, "NUL"},
		{"a long value", "viewer", "/api/v1/stats/values?domain=web&value=" + long, 400, "over 256 bytes"},
		{"from not a time", "viewer", "/api/v1/stats/values?domain=web&value=k1&from=yesterday", 400, "RFC 3339"},
		{"to not a time", "viewer", "/api/v1/stats/values?domain=web&value=k1&to=1700000000", 400, "RFC 3339"},
		{"inverted", "viewer", "/api/v1/stats/values?domain=web&value=k1&from=" + at(0) + "&to=" + at(-time.Hour), 400, "must be before"},
		{"over a week", "viewer", "/api/v1/stats/values?domain=web&value=k1&from=" + at(-8*24*time.Hour), 400, "over 7 days"},
		{"masked for a viewer", "viewer", "/api/v1/stats/values?domain=api&value=k1", 400, "masks its values"},
		{"masked, support sees", "support", "/api/v1/stats/values?domain=api&value=k1", 200, `"value":"k1"`},
		{"masked, editor sees", "editor", "/api/v1/stats/values?domain=api&value=k1", 200, `"value":"k1"`},
		{"anonymous", "", "/api/v1/stats/values?domain=web&value=k1", 401, ""},
		{"recent", "viewer", "/api/v1/stats/values/recent?domain=web&prefix=k", 200, `"values":[]`},
		{"recent without a prefix", "viewer", "/api/v1/stats/values/recent?domain=web", 200, `"values":[]`},
		{"recent without a domain", "viewer", "/api/v1/stats/values/recent?prefix=k", 400, "domain is required"},
		{"recent, NUL in the prefix", "viewer", "/api/v1/stats/values/recent?domain=web&prefix=%00", 400, "NUL"},
		{"recent, limit 0", "viewer", "/api/v1/stats/values/recent?domain=web&limit=0", 400, "within 1..100"},
		{"recent, limit 101", "viewer", "/api/v1/stats/values/recent?domain=web&limit=101", 400, "within 1..100"},
		{"recent, limit not a number", "viewer", "/api/v1/stats/values/recent?domain=web&limit=x", 400, "non-negative integer"},
		{"recent, masked for a viewer", "viewer", "/api/v1/stats/values/recent?domain=api", 400, "masks its values"},
		{"recent, masked, support sees", "support", "/api/v1/stats/values/recent?domain=api", 200, `"values":[]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, body := f.call(t, "GET", tt.path, tt.cred, "")
			if status != tt.status || !strings.Contains(body, tt.want) {
				t.Errorf("GET %s as %q = %d %s, want %d with %q", tt.path, tt.cred, status, body, tt.status, tt.want)
			}
		})
	}
}
