package api_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// rulesetBody is a PUT /api/v1/ruleset body.
func rulesetBody(domains map[string]string, del []string, base int64, message string) string {
	b, _ := json.Marshal(map[string]any{"domains": domains, "delete": del, "base_version": base, "message": message})
	return string(b)
}

type versionJSON struct {
	Version int64    `json:"version"`
	Domains []string `json:"domains"`
}

func (f *fixture) head(t *testing.T) int64 {
	t.Helper()
	var snap struct {
		Version int64 `json:"version"`
	}
	f.decodeJSON(t, "GET", "/api/v1/ruleset", "viewer", "", 200, &snap)
	return snap.Version
}

// TestRulesetPublish: several domains set and one removed make exactly one
// version, with one audit event per domain in the chain.
func TestRulesetPublish(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	var pub struct {
		Version int64 `json:"version"`
	}
	f.decodeJSON(t, "PUT", "/api/v1/ruleset", "editor",
		rulesetBody(map[string]string{"a": domainYAML("a", 1), "b": domainYAML("b", 2), "old": domainYAML("old", 3)}, nil, 0, "seed"), 200, &pub)
	if pub.Version != 1 {
		t.Fatalf("first ruleset publish = version %d, want 1", pub.Version)
	}
	f.decodeJSON(t, "PUT", "/api/v1/ruleset", "editor",
		rulesetBody(map[string]string{"a": domainYAML("a", 10), "c": domainYAML("c", 30)}, []string{"old"}, 1, "apply"), 200, &pub)
	if pub.Version != 2 {
		t.Fatalf("second ruleset publish = version %d, want 2", pub.Version)
	}
	var v struct {
		Version versionJSON `json:"version"`
		Domains []struct {
			Name string `json:"name"`
			YAML string `json:"yaml"`
		} `json:"domains"`
	}
	f.decodeJSON(t, "GET", "/api/v1/versions/2", "viewer", "", 200, &v)
	if got := strings.Join(v.Version.Domains, ","); got != "a,c,old" {
		t.Errorf("version 2 changed %s, want a,c,old", got)
	}
	have := map[string]string{}
	for _, d := range v.Domains {
		have[d.Name] = d.YAML
	}
	want := map[string]string{"a": domainYAML("a", 10), "b": domainYAML("b", 2), "c": domainYAML("c", 30)}
	if fmt.Sprint(have) != fmt.Sprint(want) {
		t.Errorf("version 2 = %v, want %v", have, want)
	}
	var audit struct {
		Events []struct {
			Action string          `json:"action"`
			Target string          `json:"target"`
			After  json.RawMessage `json:"after"`
		} `json:"events"`
	}
	f.decodeJSON(t, "GET", "/api/v1/audit?limit=3", "viewer", "", 200, &audit)
	var got []string
	for _, e := range audit.Events {
		got = append(got, e.Action+" "+e.Target)
		if !strings.Contains(string(e.After), `"version":2`) {
			t.Errorf("audit %s %s after = %s, want version 2", e.Action, e.Target, e.After)
		}
	}
	if strings.Join(got, ", ") != "domain.delete domain:old, domain.publish domain:c, domain.publish domain:a" {
		t.Errorf("audit = %v", got)
	}
	if _, body := f.call(t, "GET", "/api/v1/audit/verify", "viewer", ""); !strings.Contains(body, `"ok":true`) {
		t.Errorf("audit chain: %s", body)
	}
}

// TestRulesetRefusals: every bad request is refused with its reason and
// publishes nothing.
func TestRulesetRefusals(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.decodeJSON(t, "PUT", "/api/v1/ruleset", "editor",
		rulesetBody(map[string]string{"a": domainYAML("a", 1), "b": domainYAML("b", 2)}, nil, 0, "seed"), 200, nil)
	f.decodeJSON(t, "PUT", "/api/v1/domains/b", "editor", publishBody("b", 3, 1, "b moves"), 200, nil)
	broken := "domain: bad\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"
	big := strings.Repeat("x", 2<<20)
	cases := []struct {
		name, body string
		status     int
		want       []string
	}{
		{"empty", `{"message":"m"}`, 400, []string{"nothing to change"}},
		{"no message", rulesetBody(map[string]string{"c": domainYAML("c", 1)}, nil, 2, ""), 400, []string{"message is required"}},
		{"unknown field", `{"domains":{},"message":"m","base":1}`, 400, []string{"unknown field"}},
		{"both set and deleted", rulesetBody(map[string]string{"a": domainYAML("a", 1)}, []string{"a"}, 2, "m"), 400, []string{"both in domains and in delete"}},
		{"deleted twice", rulesetBody(nil, []string{"a", "a"}, 2, "m"), 400, []string{"twice"}},
		{"bad name", rulesetBody(map[string]string{"a/b": "x"}, nil, 2, "m"), 400, []string{"domain names use"}},
		{"invalid domain", rulesetBody(map[string]string{"a": domainYAML("a", 5), "bad": broken, "mismatch": domainYAML("other", 1)}, nil, 2, "m"), 422,
			[]string{`"file":"bad.yaml","line":4`, "descriptors[0].rate_limit.unit", `"file":"mismatch.yaml"`, "does not match"}},
		{"stale base", rulesetBody(map[string]string{"a": domainYAML("a", 5), "b": domainYAML("b", 5)}, nil, 1, "m"), 409,
			[]string{`domain \"b\" changed in version 2`, `"changed_in":2`}},
		{"delete unknown", rulesetBody(nil, []string{"zz"}, 2, "m"), 404, []string{"not_found"}},
		{"future base", rulesetBody(map[string]string{"c": domainYAML("c", 1)}, nil, 9, "m"), 400, []string{"not a published version"}},
		{"too large", rulesetBody(map[string]string{"c": big}, nil, 2, "m"), 413, []string{"too_large"}},
		{"viewer", rulesetBody(map[string]string{"c": domainYAML("c", 1)}, nil, 2, "m"), 403, []string{"forbidden"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cred := "editor"
			if tc.name == "viewer" {
				cred = "viewer"
			}
			status, body := f.call(t, "PUT", "/api/v1/ruleset", cred, tc.body)
			if status != tc.status {
				t.Fatalf("status %d %s, want %d", status, excerpt(body), tc.status)
			}
			for _, w := range tc.want {
				if !strings.Contains(body, w) {
					t.Errorf("body %s lacks %s", excerpt(body), w)
				}
			}
			if h := f.head(t); h != 2 {
				t.Fatalf("version %d after a refused request, want 2", h)
			}
		})
	}
	// A domain outside the change may have moved since base: a is set on
	// base 1 although b changed in 2.
	var pub struct {
		Version int64 `json:"version"`
	}
	f.decodeJSON(t, "PUT", "/api/v1/ruleset", "editor", rulesetBody(map[string]string{"a": domainYAML("a", 7)}, nil, 1, "m"), 200, &pub)
	if pub.Version != 3 {
		t.Fatalf("publish on an older base untouched since = version %d, want 3", pub.Version)
	}
}

// TestRulesetFourEyes: with approval required a ruleset change becomes one
// change request that a second person approves into one version.
func TestRulesetFourEyes(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.decodeJSON(t, "PUT", "/api/v1/ruleset", "editor",
		rulesetBody(map[string]string{"a": domainYAML("a", 1), "gone": domainYAML("gone", 1)}, nil, 0, "seed"), 200, nil)
	f.decodeJSON(t, "PUT", "/api/v1/settings", "admin", `{"require_approval":true}`, 200, nil)

	body := rulesetBody(map[string]string{"a": domainYAML("a", 2), "b": domainYAML("b", 2)}, []string{"gone"}, 1, "together")
	var proposed struct {
		Change struct {
			changeJSON
			Edits []struct {
				Domain  string `json:"domain"`
				YAML    string `json:"yaml"`
				Deleted bool   `json:"deleted"`
			} `json:"edits"`
		} `json:"change"`
	}
	f.decodeJSON(t, "PUT", "/api/v1/ruleset", "editor", body, 202, &proposed)
	cr := proposed.Change
	if cr.Kind != "ruleset" || cr.Status != "pending" || len(cr.Edits) != 3 || cr.Edits[2].Domain != "gone" || !cr.Edits[2].Deleted ||
		cr.Edits[0].YAML != domainYAML("a", 2) {
		t.Fatalf("proposed %+v", cr)
	}
	if h := f.head(t); h != 1 {
		t.Fatalf("a proposal published version %d", h)
	}
	var view struct {
		Diff []struct {
			Name   string `json:"name"`
			Change string `json:"change"`
		} `json:"diff"`
	}
	f.decodeJSON(t, "GET", fmt.Sprintf("/api/v1/changes/%d", cr.ID), "viewer", "", 200, &view)
	if fmt.Sprint(view.Diff) != "[{a changed} {b added} {gone removed}]" {
		t.Fatalf("pending diff = %v", view.Diff)
	}
	var list struct {
		Changes []changeJSON `json:"changes"`
	}
	f.decodeJSON(t, "GET", "/api/v1/changes?domain=b", "viewer", "", 200, &list)
	if len(list.Changes) != 1 || list.Changes[0].ID != cr.ID {
		t.Fatalf("changes touching b = %+v", list.Changes)
	}

	approve := fmt.Sprintf("/api/v1/changes/%d/approve", cr.ID)
	if status, body := f.call(t, "POST", approve, "editor", ""); status != 403 || !strings.Contains(body, "self_approval") {
		t.Fatalf("self-approval: %d %s", status, body)
	}
	if _, err := f.store.CreateUser(t.Context(), "bob", "password1", "editor", sys); err != nil {
		t.Fatal(err)
	}
	bob := f.browser(t)
	bob.login("bob", "password1")
	status, got := bob.do("POST", approve, `{"message":"lgtm"}`)
	var approved changeJSON
	json.Unmarshal([]byte(got), &approved)
	if status != 200 || approved.Version == nil || *approved.Version != 2 {
		t.Fatalf("approval: %d %s", status, got)
	}
	var v struct {
		Version struct {
			versionJSON
			ApprovedBy string `json:"approved_by"`
		} `json:"version"`
	}
	f.decodeJSON(t, "GET", "/api/v1/versions/2", "viewer", "", 200, &v)
	if strings.Join(v.Version.Domains, ",") != "a,b,gone" || v.Version.ApprovedBy != "user:bob" {
		t.Fatalf("version 2 = %+v", v.Version)
	}

	// Break glass: admins only.
	glass := `{"domains":{"a":` + jsonString(domainYAML("a", 9)) + `},"message":"incident","base_version":2,"break_glass_reason":"INC-7"}`
	if status, _ := f.call(t, "PUT", "/api/v1/ruleset", "editor", glass); status != 403 {
		t.Fatalf("editor breaks glass: %d", status)
	}
	var pub struct {
		Version int64 `json:"version"`
	}
	f.decodeJSON(t, "PUT", "/api/v1/ruleset", "admin", glass, 200, &pub)
	if pub.Version != 3 {
		t.Fatalf("break glass = version %d, want 3", pub.Version)
	}
	if _, body := f.call(t, "GET", "/api/v1/audit?action=change.break_glass", "viewer", ""); !strings.Contains(body, "INC-7") {
		t.Fatalf("break glass not audited: %s", body)
	}
}
