package api_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/backend/store"
)

func stagedBody(domain string, n int, base int64, rollout string) string {
	return fmt.Sprintf(`{"yaml":%s,"message":"staged","base_version":%d,"rollout":%s}`, jsonString(domainYAML(domain, n)), base, rollout)
}

type rolloutJSON struct {
	State       string            `json:"state"`
	Labels      map[string]string `json:"labels"`
	BaseVersion int64             `json:"base_version"`
	EndedIn     *int64            `json:"ended_in"`
	EndedBy     string            `json:"ended_by"`
	Reason      string            `json:"reason"`
}

func (f *fixture) rolloutOf(t *testing.T, v int64) *rolloutJSON {
	t.Helper()
	var out struct {
		Version struct {
			Rollout *rolloutJSON `json:"rollout"`
		} `json:"version"`
	}
	f.decodeJSON(t, "GET", fmt.Sprintf("/api/v1/versions/%d", v), "viewer", "", 200, &out)
	return out.Version.Rollout
}

// TestRolloutAPI covers staging, the refusals while a version is staged,
// promote, rollback and halt of a staged version, and bad input.
func TestRolloutAPI(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	var p published
	f.decodeJSON(t, "PUT", "/api/v1/domains/api", "editor", publishBody("api", 100, 0, "first"), 200, &p) // 1

	bad := []struct {
		name, rollout, contains string
	}{
		{"no labels", `{"labels":{}}`, "at least one label"},
		{"labels missing", `{}`, "at least one label"},
		{"bad key", `{"labels":{"bad key":"v"}}`, `label key \"bad key\"`},
		{"empty value", `{"labels":{"canary":""}}`, "values are 1-63"},
		{"long value", `{"labels":{"canary":"` + strings.Repeat("x", 64) + `"}}`, "values are 1-63"},
		{"unknown field", `{"labels":{"canary":"true"},"percent":5}`, `unknown field \"percent\"`},
		{"labels not strings", `{"labels":{"canary":true}}`, "invalid JSON"},
		{"factor under 1", `{"labels":{"canary":"true"},"auto_halt":{"factor":0.5,"min_limited_per_s":5}}`, "auto_halt.factor"},
		{"no floor", `{"labels":{"canary":"true"},"auto_halt":{"factor":3}}`, "auto_halt.min_limited_per_s"},
		{"long for_s", `{"labels":{"canary":"true"},"auto_halt":{"factor":3,"min_limited_per_s":1,"for_s":601}}`, "auto_halt.for_s"},
	}
	for _, b := range bad {
		status, body := f.call(t, "PUT", "/api/v1/domains/api", "editor", stagedBody("api", 50, 1, b.rollout))
		if status != 400 || !strings.Contains(body, b.contains) {
			t.Errorf("%s: %d %s; want 400 containing %s", b.name, status, body, b.contains)
		}
	}
	if v, _ := f.store.CurrentVersion(context.Background()); v != 1 {
		t.Fatalf("a refused publish wrote version %d", v)
	}

	// Stage version 2.
	status, body := f.call(t, "PUT", "/api/v1/domains/api", "editor",
		stagedBody("api", 50, 1, `{"labels":{"canary":"true"},"auto_halt":{"factor":3,"min_limited_per_s":5}}`))
	if status != 200 || !strings.Contains(body, `"version":2`) || !strings.Contains(body, `"state":"staged"`) {
		t.Fatalf("staged publish: %d %s", status, body)
	}
	if r := f.rolloutOf(t, 2); r == nil || r.State != "staged" || r.Labels["canary"] != "true" || r.BaseVersion != 1 {
		t.Fatalf("version 2 rollout = %+v", r)
	}
	if r := f.rolloutOf(t, 1); r != nil {
		t.Errorf("version 1 rollout = %+v, want null", r)
	}
	if _, body := f.call(t, "GET", "/api/v1/nodes", "viewer", ""); !strings.Contains(body, `"rollout":{"version":2`) {
		t.Errorf("nodes: %s", body)
	}

	// While 2 is staged nothing else is published; promote checks its version.
	refused := []struct {
		name, method, path, body string
		status                   int
		contains                 string
	}{
		{"another publish", "PUT", "/api/v1/domains/api", publishBody("api", 10, 2, "m"), 409, "is staged"},
		{"another staged publish", "PUT", "/api/v1/domains/b", stagedBody("b", 10, 0, `{"labels":{"canary":"true"}}`), 409, "is staged"},
		{"delete", "DELETE", "/api/v1/domains/api", `{"message":"m","base_version":2}`, 409, "is staged"},
		{"domain rollback", "POST", "/api/v1/domains/api/rollback", `{"to_version":1,"message":"m"}`, 409, "is staged"},
		{"promote unknown version", "POST", "/api/v1/versions/99/promote", `{"message":"m"}`, 404, "not_found"},
		{"promote a version not staged", "POST", "/api/v1/versions/1/promote", `{"message":"m"}`, 409, "was not staged"},
		{"promote needs a message", "POST", "/api/v1/versions/2/promote", `{"message":" "}`, 400, "message is required"},
		{"promote takes a number", "POST", "/api/v1/versions/two/promote", `{"message":"m"}`, 400, "positive integer"},
		{"promote unknown field", "POST", "/api/v1/versions/2/promote", `{"message":"m","force":true}`, 400, "unknown field"},
		{"viewer cannot promote", "POST", "/api/v1/versions/2/promote", `{"message":"m"}`, 403, ""},
		{"cohorts of a version not staged", "GET", "/api/v1/versions/1/cohorts", "", 404, "was not staged"},
	}
	for _, r := range refused {
		cred := "editor"
		if strings.HasPrefix(r.name, "viewer") {
			cred = "viewer"
		}
		status, body := f.call(t, r.method, r.path, cred, r.body)
		if status != r.status || !strings.Contains(body, r.contains) {
			t.Errorf("%s: %d %s; want %d containing %s", r.name, status, body, r.status, r.contains)
		}
	}
	if _, body := f.call(t, "GET", "/api/v1/versions/2/cohorts", "viewer", ""); !strings.Contains(body, `"domains":["api"]`) || !strings.Contains(body, `"points":[]`) {
		t.Errorf("cohorts of 2: %s", body)
	}

	// Promote: 200 {"version":2}, audited; a second promote is refused.
	var promoted struct {
		Version int64 `json:"version"`
	}
	f.decodeJSON(t, "POST", "/api/v1/versions/2/promote", "editor", `{"message":"looks good"}`, 200, &promoted)
	if promoted.Version != 2 {
		t.Errorf("promote = %+v", promoted)
	}
	if r := f.rolloutOf(t, 2); r == nil || r.State != "promoted" || !strings.HasPrefix(r.EndedBy, "token:editor") || r.Reason != "looks good" {
		t.Errorf("after promote: %+v", r)
	}
	if status, body := f.call(t, "POST", "/api/v1/versions/2/promote", "editor", `{"message":"again"}`); status != 409 || !strings.Contains(body, "promoted already") {
		t.Errorf("second promote: %d %s", status, body)
	}
	if _, body := f.call(t, "GET", "/api/v1/audit?action=version.promote", "viewer", ""); !strings.Contains(body, `"target":"version:2"`) {
		t.Errorf("promote audit: %s", body)
	}

	// Publishing works again; stage 4 and roll it back: an ordinary rollback.
	f.decodeJSON(t, "PUT", "/api/v1/domains/api", "editor", publishBody("api", 70, 2, "m"), 200, &p) // 3
	f.decodeJSON(t, "PUT", "/api/v1/domains/api", "editor", stagedBody("api", 60, 3, `{"labels":{"zone":"eu-1"}}`), 200, &p)
	if p.Version != 4 {
		t.Fatalf("staged = %+v", p)
	}
	f.decodeJSON(t, "POST", "/api/v1/versions/3/rollback", "editor", `{"message":"undo the canary"}`, 200, &p)
	if p.Version != 5 {
		t.Fatalf("rollback = %+v", p)
	}
	if r := f.rolloutOf(t, 4); r == nil || r.State != "rolled_back" || r.EndedIn == nil || *r.EndedIn != 5 {
		t.Errorf("after rollback: %+v", r)
	}
	if status, body := f.call(t, "POST", "/api/v1/versions/4/promote", "editor", `{"message":"m"}`); status != 409 || !strings.Contains(body, "rolled back in version 5") {
		t.Errorf("promote after rollback: %d %s", status, body)
	}

	// The halt the console does by itself: a rollback by "system".
	f.decodeJSON(t, "PUT", "/api/v1/domains/api", "editor", stagedBody("api", 1, 5, `{"labels":{"canary":"true"}}`), 200, &p) // 6
	hv, err := f.store.Halt(context.Background(), 6, "automatic halt: test")
	if err != nil || hv != 7 {
		t.Fatalf("halt = %d, %v", hv, err)
	}
	if r := f.rolloutOf(t, 6); r == nil || r.State != "halted" || r.EndedBy != "system" || r.Reason != "automatic halt: test" {
		t.Errorf("after halt: %+v", r)
	}
	if _, body := f.call(t, "GET", "/api/v1/versions/7", "viewer", ""); !strings.Contains(body, `"author":"system"`) || !strings.Contains(body, `"rollback_of":5`) {
		t.Errorf("halt version: %s", body)
	}
	if _, err := f.store.Halt(context.Background(), 6, "again"); err == nil {
		t.Error("a second halt of 6 succeeded")
	}
	if _, body := f.call(t, "GET", "/api/v1/audit?action=version.halt", "viewer", ""); !strings.Contains(body, `"actor":"system"`) {
		t.Errorf("halt audit: %s", body)
	}
	if _, body := f.call(t, "GET", "/api/v1/audit/verify", "viewer", ""); !strings.Contains(body, `"ok":true`) {
		t.Errorf("audit chain: %s", body)
	}
}

// TestRolloutWithApproval: a staged publish cannot wait for approval (the
// request would lose its rollout); an admin breaking glass stages it.
func TestRolloutWithApproval(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	var p published
	f.decodeJSON(t, "PUT", "/api/v1/domains/api", "editor", publishBody("api", 100, 0, "first"), 200, &p)
	f.decodeJSON(t, "PUT", "/api/v1/settings", "admin", `{"require_approval":true}`, 200, nil)
	if status, body := f.call(t, "PUT", "/api/v1/domains/api", "editor", stagedBody("api", 5, 1, `{"labels":{"canary":"true"}}`)); status != 400 || !strings.Contains(body, "cannot wait for approval") {
		t.Errorf("staged publish needing approval: %d %s", status, body)
	}
	body := strings.TrimSuffix(stagedBody("api", 5, 1, `{"labels":{"canary":"true"}}`), "}") + `,"break_glass_reason":"incident 7"}`
	f.decodeJSON(t, "PUT", "/api/v1/domains/api", "admin", body, 200, &p)
	rs, err := f.store.FindRollouts(context.Background(), p.Version)
	if err != nil || rs[p.Version].State != store.RolloutStaged {
		t.Errorf("break-glass staged publish: %+v, %v", rs, err)
	}
}
