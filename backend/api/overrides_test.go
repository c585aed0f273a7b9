package api_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend/store"
)

func overrideBody(domain, value string, expires time.Time, extra string) string {
	return fmt.Sprintf(`{"domain":%q,"entries":[{"key":"api_key","value":%q}],"rate_limit":{"unit":"hour","requests_per_unit":8},"expires_at":%q,"message":"ticket 42"%s}`,
		domain, value, expires.UTC().Format(time.RFC3339), extra)
}

type overrideJSON struct {
	ID      int64  `json:"id"`
	Domain  string `json:"domain"`
	Entries []struct {
		Key   string `json:"key"`
		Value string `json:"value"`
	} `json:"entries"`
	RateLimit struct {
		Unit            string `json:"unit"`
		RequestsPerUnit int    `json:"requests_per_unit"`
	} `json:"rate_limit"`
	ExpiresAt string `json:"expires_at"`
	Status    string `json:"status"`
	Author    string `json:"author"`
	Message   string `json:"message"`
	Version   int64  `json:"version"`
}

func (f *fixture) overrides(t *testing.T, query string) []overrideJSON {
	t.Helper()
	var out struct {
		Overrides []overrideJSON `json:"overrides"`
	}
	f.decodeJSON(t, "GET", "/api/v1/overrides"+query, "viewer", "", 200, &out)
	return out.Overrides
}

// TestOverridesAPI: support staff give a customer another rate; it is a
// version (in the diff), survives a YAML edit, and ends early by DELETE.
func TestOverridesAPI(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.token(t, "support", store.RoleSupport, nil)
	ctx := context.Background()
	v1, err := f.store.Publish(ctx, store.Change{Domain: "api", YAML: validYAML, Message: "m", Actor: sys})
	if err != nil {
		t.Fatal(err)
	}
	expires := time.Now().Add(2 * time.Hour)

	var created struct {
		ID      int64 `json:"id"`
		Version int64 `json:"version"`
	}
	f.decodeJSON(t, "POST", "/api/v1/overrides", "support", overrideBody("api", "k1", expires, ""), 201, &created)
	if created.Version != v1+1 || created.ID == 0 {
		t.Fatalf("created %+v, want version %d", created, v1+1)
	}
	list := f.overrides(t, "?domain=api")
	if len(list) != 1 {
		t.Fatalf("overrides: %+v", list)
	}
	o := list[0]
	if o.ID != created.ID || o.Status != "active" || o.Author != "token:support#"+fmt.Sprint(f.ids["token:support"]) && !strings.HasPrefix(o.Author, "token:support") ||
		o.Version != created.Version || o.Message != "ticket 42" || o.RateLimit.Unit != "hour" || o.RateLimit.RequestsPerUnit != 8 ||
		len(o.Entries) != 1 || o.Entries[0].Value != "k1" {
		t.Errorf("listed override: %+v", o)
	}
	if got := f.overrides(t, "?domain=other"); len(got) != 0 {
		t.Errorf("overrides of another domain: %+v", got)
	}

	// The diff shows it; the domain's YAML does not hold it.
	status, diff := f.call(t, "GET", fmt.Sprintf("/api/v1/versions/%d/diff/%d", v1, created.Version), "viewer", "")
	if status != 200 || !strings.Contains(diff, "value: k1") || !strings.Contains(diff, "requests_per_unit: 8") {
		t.Errorf("diff: %d %s", status, diff)
	}
	status, dom := f.call(t, "GET", "/api/v1/domains/api", "viewer", "")
	if status != 200 || strings.Contains(dom, "overrides") {
		t.Errorf("domain: %d %s", status, dom)
	}

	// Staff edit the domain meanwhile: the override stays.
	var put struct {
		Version int64 `json:"version"`
	}
	f.decodeJSON(t, "PUT", "/api/v1/domains/api", "editor", publishBody("api", 300, v1, "more for everyone"), 200, &put)
	var ver struct {
		Domains []struct {
			YAML      string `json:"yaml"`
			Overrides []struct {
				ID int64 `json:"id"`
			} `json:"overrides"`
		} `json:"domains"`
	}
	f.decodeJSON(t, "GET", fmt.Sprintf("/api/v1/versions/%d", put.Version), "viewer", "", 200, &ver)
	if len(ver.Domains) != 1 || len(ver.Domains[0].Overrides) != 1 || ver.Domains[0].Overrides[0].ID != created.ID ||
		strings.Contains(ver.Domains[0].YAML, "overrides") {
		t.Errorf("version %d after the edit: %+v", put.Version, ver)
	}
	// Staff may not write the section themselves.
	own := validYAML + "overrides:\n  - entries: [{key: api_key, value: k9}]\n    rate_limit: {unit: hour, requests_per_unit: 8}\n"
	status, body := f.call(t, "PUT", "/api/v1/domains/api", "editor",
		fmt.Sprintf(`{"yaml":%s,"message":"m","base_version":%d}`, jsonString(own), put.Version))
	if status != 422 || !strings.Contains(body, "managed by the console") || !strings.Contains(body, `"line":5`) {
		t.Errorf("YAML with an overrides section: %d %s", status, body)
	}

	// Ended early.
	var ended struct {
		Version int64 `json:"version"`
	}
	f.decodeJSON(t, "DELETE", fmt.Sprintf("/api/v1/overrides/%d", created.ID), "support", `{"message":"launch done"}`, 200, &ended)
	if ended.Version != put.Version+1 {
		t.Errorf("ended in version %d, want %d", ended.Version, put.Version+1)
	}
	if got := f.overrides(t, "?domain=api&status=ended"); len(got) != 1 || got[0].Status != "ended" {
		t.Errorf("after DELETE: %+v", got)
	}
	if got := f.overrides(t, "?status=active"); len(got) != 0 {
		t.Errorf("active after DELETE: %+v", got)
	}
	status, body = f.call(t, "DELETE", fmt.Sprintf("/api/v1/overrides/%d", created.ID), "support", `{"message":"again"}`)
	if status != 409 {
		t.Errorf("DELETE twice: %d %s", status, body)
	}
	status, body = f.call(t, "GET", "/api/v1/audit?action=override.end", "viewer", "")
	if status != 200 || !strings.Contains(body, "launch done") {
		t.Errorf("audit: %d %s", status, body)
	}
}

// TestOverridesBadInput: every refusal says why and publishes nothing.
func TestOverridesBadInput(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	if _, err := f.store.Publish(ctx, store.Change{Domain: "api", YAML: validYAML, Message: "m", Actor: sys}); err != nil {
		t.Fatal(err)
	}
	soon := time.Now().Add(time.Hour)
	many := make([]string, 10000)
	for i := range many {
		many[i] = fmt.Sprintf(`{"key":"k%d","value":"v"}`, i)
	}
	for _, tc := range []struct {
		name, cred, body string
		status           int
		want             string
	}{
		{"unknown domain", "editor", overrideBody("nope", "k1", soon, ""), 404, "not_found"},
		{"matches no limit", "editor", strings.Replace(overrideBody("api", "k1", soon, ""), `"api_key"`, `"user"`, 1), 422,
			`entries (user=k1) match no limit in domain \"api\"`},
		{"expired", "editor", overrideBody("api", "k1", time.Now().Add(-time.Minute), ""), 422, "not in the future"},
		{"too far", "editor", overrideBody("api", "k1", time.Now().Add(91*24*time.Hour), ""), 422, "more than 90 days"},
		{"NUL", "editor", strings.Replace(overrideBody("api", "k1", soon, ""), `"k1"`, `"k\u00001"`, 1), 400, "NUL"},
		{"10,000 entries", "editor", fmt.Sprintf(`{"domain":"api","entries":[%s],"rate_limit":{"unit":"hour","requests_per_unit":8},"expires_at":%q,"message":"m"}`,
			strings.Join(many, ","), soon.UTC().Format(time.RFC3339)), 400, "10000 entries"},
		{"no value", "editor", strings.Replace(overrideBody("api", "k1", soon, ""), `"k1"`, `""`, 1), 400, "a key and a value"},
		{"bad unit", "editor", strings.Replace(overrideBody("api", "k1", soon, ""), `"hour"`, `"fortnight"`, 1), 400, "fortnight"},
		{"no message", "editor", strings.Replace(overrideBody("api", "k1", soon, ""), `"ticket 42"`, `""`, 1), 400, "message is required"},
		{"bad time", "editor", strings.Replace(overrideBody("api", "k1", soon, ""), soon.UTC().Format(time.RFC3339), "friday", 1), 400, "RFC 3339"},
		{"unknown field", "editor", overrideBody("api", "k1", soon, `,"burst":3`), 400, "burst"},
		{"viewer", "viewer", overrideBody("api", "k1", soon, ""), 403, "forbidden"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body := f.call(t, "POST", "/api/v1/overrides", tc.cred, tc.body)
			if status != tc.status || !strings.Contains(body, tc.want) {
				t.Errorf("POST = %d %s; want %d with %q", status, excerpt(body), tc.status, tc.want)
			}
		})
	}
	if v, _ := f.store.CurrentVersion(ctx); v != 1 {
		t.Errorf("refused overrides published: version %d", v)
	}
	if status, _ := f.call(t, "DELETE", "/api/v1/overrides/999", "editor", `{"message":"m"}`); status != http.StatusNotFound {
		t.Errorf("DELETE of an unknown override: %d", status)
	}
	if status, _ := f.call(t, "GET", "/api/v1/overrides?status=gone", "viewer", ""); status != http.StatusBadRequest {
		t.Errorf("bad status filter: %d", status)
	}
}

// TestOverridesApproval: with four-eyes on, an override is a change request
// (its diff shows it) unless urgent, which publishes and is audited.
func TestOverridesApproval(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.token(t, "support", store.RoleSupport, nil)
	ctx := context.Background()
	if _, err := f.store.Publish(ctx, store.Change{Domain: "api", YAML: validYAML, Message: "m", Actor: sys}); err != nil {
		t.Fatal(err)
	}
	f.decodeJSON(t, "PUT", "/api/v1/settings", "admin", `{"require_approval":true}`, 200, nil)
	expires := time.Now().Add(time.Hour)

	var proposed struct {
		Change struct {
			ID   int64  `json:"id"`
			Kind string `json:"kind"`
		} `json:"change"`
	}
	f.decodeJSON(t, "POST", "/api/v1/overrides", "support", overrideBody("api", "k1", expires, ""), 202, &proposed)
	if proposed.Change.Kind != "override" {
		t.Fatalf("proposed: %+v", proposed)
	}
	if got := f.overrides(t, ""); len(got) != 0 {
		t.Errorf("listed before approval: %+v", got)
	}
	status, body := f.call(t, "GET", fmt.Sprintf("/api/v1/changes/%d", proposed.Change.ID), "viewer", "")
	if status != 200 || !strings.Contains(body, "value: k1") {
		t.Errorf("pending override's diff: %d %s", status, excerpt(body))
	}
	if _, err := f.store.CreateUser(ctx, "bob", "password1", "editor", sys); err != nil {
		t.Fatal(err)
	}
	bob := f.browser(t)
	bob.login("bob", "password1")
	if status, body := bob.do("POST", fmt.Sprintf("/api/v1/changes/%d/approve", proposed.Change.ID), `{"message":"ok"}`); status != 200 {
		t.Fatalf("approve: %d %s", status, body)
	}
	if got := f.overrides(t, "?status=active"); len(got) != 1 || got[0].Entries[0].Value != "k1" {
		t.Errorf("after approval: %+v", got)
	}

	var created struct {
		Version int64 `json:"version"`
	}
	f.decodeJSON(t, "POST", "/api/v1/overrides", "support", overrideBody("api", "k2", expires, `,"urgent":true`), 201, &created)
	status, body = f.call(t, "GET", "/api/v1/audit?action=override.break_glass", "viewer", "")
	if status != 200 || !strings.Contains(body, "ticket 42") || !strings.Contains(body, "token:support") {
		t.Errorf("break-glass audit: %d %s", status, excerpt(body))
	}
}
