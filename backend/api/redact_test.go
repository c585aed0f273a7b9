package api_test

import (
	"strings"
	"testing"
)

// TestAuditRedactsWebhookURLs: a webhook URL's secret path reaches admins
// only, in the JSON trail and in the CSV export; the chain still verifies.
func TestAuditRedactsWebhookURLs(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const secret = "T0SECRET/B0SECRET/xoxSECRETxox"
	body := `{"webhooks":[{"url":"https://hooks.slack.com/services/` + secret + `?k=q","events":["spike.start"]}],` +
		`"spike_defaults":{"floor_per_s":5,"factor":5,"for_s":3},"domains":{}}`
	if status, got := f.call(t, "PUT", "/api/v1/alerts", "admin", body); status != 200 {
		t.Fatalf("put alerts: %d %s", status, got)
	}
	for _, path := range []string{"/api/v1/audit?action=alerts.update", "/api/v1/audit?action=alerts.update&format=csv"} {
		for _, cred := range []string{"viewer", "editor"} {
			status, got := f.call(t, "GET", path, cred, "")
			if status != 200 {
				t.Fatalf("%s as %s: %d %s", path, cred, status, got)
			}
			if strings.Contains(got, "SECRET") {
				t.Errorf("%s as %s shows the webhook secret: %s", path, cred, excerpt(got))
			}
			if !strings.Contains(got, "https://hooks.slack.com/[redacted]") {
				t.Errorf("%s as %s lacks the redacted URL: %s", path, cred, excerpt(got))
			}
		}
		if _, got := f.call(t, "GET", path, "admin", ""); !strings.Contains(got, secret) {
			t.Errorf("%s as admin lacks the full URL: %s", path, excerpt(got))
		}
	}
	if status, got := f.call(t, "GET", "/api/v1/audit/verify", "viewer", ""); !strings.Contains(got, `"ok":true`) {
		t.Errorf("audit chain: %d %s", status, got)
	}
}
