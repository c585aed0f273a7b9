package api_test

import (
	"bytes"
	"database/sql"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib"
)

func expireToken(t *testing.T, f *fixture, id int64) {
	t.Helper()
	db, err := sql.Open("pgx", f.url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec("UPDATE api_tokens SET expires_at = now() - interval '1 second' WHERE id = $1", id); err != nil {
		t.Fatal(err)
	}
}

type published struct {
	Version    int64  `json:"version"`
	RollbackOf *int64 `json:"rollback_of"`
}

func TestPublishFlow(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	var p published
	f.decodeJSON(t, "PUT", "/api/v1/domains/api", "editor", publishBody("api", 100, 0, "first"), 200, &p)
	if p.Version != 1 {
		t.Fatalf("first publish = %+v", p)
	}
	bad := []struct {
		name, method, path, body string
		status                   int
		contains                 string
	}{
		{"stale base names the version", "PUT", "/api/v1/domains/api", publishBody("api", 1, 0, "m"), 409, `"changed_in":1`},
		{"invalid YAML gives line and path", "PUT", "/api/v1/domains/api",
			`{"yaml":"domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n","message":"m","base_version":1}`,
			422, `"path":"descriptors[0].rate_limit.unit"`},
		{"YAML syntax error", "PUT", "/api/v1/domains/api", `{"yaml":"domain: [api\n","message":"m","base_version":1}`, 422, `"line":`},
		{"domain must match the URL", "PUT", "/api/v1/domains/other", publishBody("api", 1, 0, "m"), 422, "does not match"},
		{"message required", "PUT", "/api/v1/domains/api", publishBody("api", 1, 1, "  "), 400, "message is required"},
		{"base ahead of the head", "PUT", "/api/v1/domains/api", publishBody("api", 1, 99, "m"), 400, "not a published version"},
		{"unknown field named", "PUT", "/api/v1/domains/api", `{"yaml":"x","message":"m","base":1}`, 400, `unknown field \"base\"`},
		{"wrong type", "PUT", "/api/v1/domains/api", `{"yaml":1}`, 400, "invalid JSON"},
		{"trailing data", "PUT", "/api/v1/domains/api", publishBody("api", 1, 1, "m") + "{}", 400, "trailing data"},
		{"empty body", "PUT", "/api/v1/domains/api", ``, 400, "empty"},
		{"bad domain name", "PUT", "/api/v1/domains/a%20b", publishBody("api", 1, 1, "m"), 400, "domain names"},
		{"rollback needs to_version", "POST", "/api/v1/domains/api/rollback", `{"message":"m"}`, 400, "to_version"},
		{"rollback to the future", "POST", "/api/v1/versions/9/rollback", `{"message":"m"}`, 404, "not_found"},
		{"delete unknown", "DELETE", "/api/v1/domains/nope", `{"message":"m","base_version":1}`, 404, "not_found"},
	}
	for _, b := range bad {
		status, body := f.call(t, b.method, b.path, "editor", b.body)
		if status != b.status || !strings.Contains(body, b.contains) {
			t.Errorf("%s: %d %s; want %d containing %s", b.name, status, body, b.status, b.contains)
		}
	}
	f.decodeJSON(t, "PUT", "/api/v1/domains/b", "editor", publishBody("b", 5, 0, "add b"), 200, &p)       // 2
	f.decodeJSON(t, "PUT", "/api/v1/domains/api", "editor", publishBody("api", 200, 1, "raise"), 200, &p) // 3
	if p.Version != 3 {
		t.Fatalf("third publish = %+v", p)
	}

	var dom struct {
		Version        int64  `json:"version"`
		CurrentVersion int64  `json:"current_version"`
		Author         string `json:"author"`
		Message        string `json:"message"`
		Config         struct {
			Domain      string `json:"domain"`
			Descriptors []struct {
				Key       string `json:"key"`
				RateLimit struct {
					Unit            string `json:"unit"`
					RequestsPerUnit int    `json:"requests_per_unit"`
				} `json:"rate_limit"`
			} `json:"descriptors"`
		} `json:"config"`
		Limits []struct {
			Path      string `json:"path"`
			Burst     int    `json:"burst"`
			Algorithm string `json:"algorithm"`
		} `json:"limits"`
	}
	f.decodeJSON(t, "GET", "/api/v1/domains/api", "viewer", "", 200, &dom)
	if dom.Version != 3 || dom.CurrentVersion != 3 || dom.Message != "raise" || !strings.HasPrefix(dom.Author, "token:editor#") ||
		dom.Config.Domain != "api" || len(dom.Config.Descriptors) != 1 || dom.Config.Descriptors[0].RateLimit.RequestsPerUnit != 200 ||
		len(dom.Limits) != 1 || dom.Limits[0].Burst != 200 || dom.Limits[0].Algorithm != "token_bucket" || dom.Limits[0].Path != "api_key" {
		t.Fatalf("domain api = %+v", dom)
	}
	var list struct {
		Domains []struct {
			Name   string `json:"name"`
			Limits int    `json:"limits"`
		} `json:"domains"`
	}
	f.decodeJSON(t, "GET", "/api/v1/domains", "viewer", "", 200, &list)
	if len(list.Domains) != 2 || list.Domains[0].Name != "api" || list.Domains[0].Limits != 1 {
		t.Fatalf("domains = %+v", list)
	}

	// The diff of 1 → 3: api changed, b added.
	var diff struct {
		Domains []struct {
			Name    string `json:"name"`
			Change  string `json:"change"`
			Unified string `json:"unified"`
			Added   int    `json:"added"`
			Removed int    `json:"removed"`
			Changes []struct {
				Kind string `json:"kind"`
				Name string `json:"name"`
				Path []struct {
					Key string `json:"key"`
				} `json:"path"`
				Fields []struct {
					Field  string `json:"field"`
					Before string `json:"before"`
					After  string `json:"after"`
				} `json:"fields"`
			} `json:"changes"`
		} `json:"domains"`
	}
	f.decodeJSON(t, "GET", "/api/v1/versions/1/diff/3", "viewer", "", 200, &diff)
	if len(diff.Domains) != 2 {
		t.Fatalf("diff 1..3 = %+v", diff)
	}
	api, b := diff.Domains[0], diff.Domains[1]
	wantUnified := "--- a/api.yaml\n+++ b/api.yaml\n@@ -1,4 +1,4 @@\n domain: api\n descriptors:\n   - key: api_key\n" +
		"-    rate_limit: {unit: minute, requests_per_unit: 100}\n+    rate_limit: {unit: minute, requests_per_unit: 200}\n"
	if api.Name != "api" || api.Change != "changed" || api.Unified != wantUnified || api.Added != 1 || api.Removed != 1 {
		t.Errorf("api diff = %+v\nwant unified:\n%s", api, wantUnified)
	}
	if len(api.Changes) != 1 || api.Changes[0].Kind != "limit_changed" || api.Changes[0].Name != "api_key" ||
		len(api.Changes[0].Path) != 1 || api.Changes[0].Path[0].Key != "api_key" || len(api.Changes[0].Fields) != 2 ||
		fmt.Sprint(api.Changes[0].Fields[0]) != "{rate_limit.requests_per_unit 100 200}" || api.Changes[0].Fields[1].Field != "burst" {
		t.Errorf("api structured changes = %+v", api.Changes)
	}
	if b.Name != "b" || b.Change != "added" || len(b.Changes) != 2 || b.Changes[0].Kind != "domain_added" ||
		b.Changes[1].Kind != "limit_added" || !strings.Contains(b.Unified, "--- /dev/null\n+++ b/b.yaml\n") {
		t.Errorf("b diff = %+v", b)
	}
	f.decodeJSON(t, "GET", "/api/v1/versions/3/diff/3", "viewer", "", 200, &diff)
	if len(diff.Domains) != 0 {
		t.Errorf("diff of a version with itself = %+v", diff)
	}
	if status, _ := f.call(t, "GET", "/api/v1/versions/1/diff/99", "viewer", ""); status != 404 {
		t.Errorf("diff with an unknown version: %d", status)
	}
	if status, _ := f.call(t, "GET", "/api/v1/versions/1/diff/-1", "viewer", ""); status != 400 {
		t.Errorf("diff with a negative version: %d", status)
	}

	// Roll the whole ruleset back to 1 (b disappears), then b alone to 2.
	f.decodeJSON(t, "POST", "/api/v1/versions/1/rollback", "editor", `{"message":"undo"}`, 200, &p)
	if p.Version != 4 || p.RollbackOf == nil || *p.RollbackOf != 1 {
		t.Fatalf("rollback = %+v", p)
	}
	if status, _ := f.call(t, "GET", "/api/v1/domains/b", "viewer", ""); status != 404 {
		t.Fatalf("b after rollback to 1: %d", status)
	}
	f.decodeJSON(t, "POST", "/api/v1/domains/b/rollback", "editor", `{"to_version":2,"message":"bring b back"}`, 200, &p)
	if p.Version != 5 || *p.RollbackOf != 2 {
		t.Fatalf("domain rollback = %+v", p)
	}
	if status, body := f.call(t, "GET", "/api/v1/domains/b", "viewer", ""); status != 200 || !strings.Contains(body, `requests_per_unit: 5`) {
		t.Fatalf("b after its rollback: %d %s", status, body)
	}
	if status, body := f.call(t, "POST", "/api/v1/domains/b/rollback", "editor", `{"to_version":2,"message":"m","base_version":4}`); status != 409 {
		t.Fatalf("domain rollback from a stale base: %d %s", status, body)
	}

	// The history keeps DESIGN's shape, newest first, and filters.
	_, raw := f.call(t, "GET", "/api/v1/versions", "viewer", "")
	var shape struct {
		Versions []map[string]json.RawMessage `json:"versions"`
	}
	json.Unmarshal([]byte(raw), &shape)
	if len(shape.Versions) != 5 {
		t.Fatalf("versions: %s", raw)
	}
	for _, key := range []string{"version", "created_at", "author", "message", "rollback_of"} {
		if _, ok := shape.Versions[0][key]; !ok {
			t.Errorf("versions[0] lacks %q: %s", key, raw)
		}
	}
	if string(shape.Versions[0]["version"]) != "5" || string(shape.Versions[4]["rollback_of"]) != "null" {
		t.Errorf("versions not newest first or rollback_of not null: %s", raw)
	}
	pages := [][]int64{}
	cursor := ""
	for range 10 {
		var pg struct {
			Versions []published `json:"versions"`
			Next     *string     `json:"next_cursor"`
		}
		f.decodeJSON(t, "GET", "/api/v1/versions?limit=2&domain=b"+cursor, "viewer", "", 200, &pg)
		var vs []int64
		for _, v := range pg.Versions {
			vs = append(vs, v.Version)
		}
		pages = append(pages, vs)
		if pg.Next == nil {
			break
		}
		cursor = "&cursor=" + *pg.Next
	}
	if fmt.Sprint(pages) != "[[5 4] [2]]" {
		t.Errorf("versions of b, two per page: %v, want [[5 4] [2]]", pages)
	}
	author := "token:editor%23" + strconv.FormatInt(f.ids["token:editor"], 10)
	if _, body := f.call(t, "GET", "/api/v1/versions?author="+author+"&since=2000-01-01T00:00:00Z", "viewer", ""); strings.Count(body, `"version":`) != 5 {
		t.Errorf("versions by author: %s", body)
	}
	if status, _ := f.call(t, "GET", "/api/v1/versions?since=yesterday", "viewer", ""); status != 400 {
		t.Errorf("bad since: %d", status)
	}

	if status, _ := f.call(t, "DELETE", "/api/v1/domains/b", "editor", `{"message":"bye","base_version":2}`); status != 409 {
		t.Errorf("stale delete: %d", status)
	}
	f.decodeJSON(t, "DELETE", "/api/v1/domains/b", "editor", `{"message":"bye","base_version":5}`, 200, &p)
	if status, body := f.call(t, "GET", "/api/v1/audit/verify", "viewer", ""); !strings.Contains(body, `"ok":true`) {
		t.Errorf("audit verify: %d %s", status, body)
	}
}

type changeJSON struct {
	ID         int64  `json:"id"`
	Kind       string `json:"kind"`
	Status     string `json:"status"`
	Author     string `json:"author"`
	Reviewer   string `json:"reviewer"`
	Version    *int64 `json:"version"`
	RollbackOf *int64 `json:"rollback_of"`
}

func TestFourEyesAPI(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.decodeJSON(t, "PUT", "/api/v1/settings", "admin", `{"require_approval":true}`, 200, nil)
	if _, body := f.call(t, "GET", "/api/v1/settings", "viewer", ""); !strings.Contains(body, `"require_approval":true`) {
		t.Fatalf("settings: %s", body)
	}
	var proposed struct {
		Change changeJSON `json:"change"`
	}
	f.decodeJSON(t, "PUT", "/api/v1/domains/api", "editor", publishBody("api", 100, 0, "first"), 202, &proposed)
	first := proposed.Change
	if first.Status != "pending" || first.Kind != "publish" || first.Version != nil {
		t.Fatalf("proposed %+v", first)
	}
	if status, _ := f.call(t, "GET", "/api/v1/domains/api", "viewer", ""); status != 404 {
		t.Fatalf("a pending change is already published: %d", status)
	}
	var view struct {
		Diff []struct {
			Name   string `json:"name"`
			Change string `json:"change"`
		} `json:"diff"`
	}
	f.decodeJSON(t, "GET", fmt.Sprintf("/api/v1/changes/%d", first.ID), "viewer", "", 200, &view)
	if len(view.Diff) != 1 || view.Diff[0].Name != "api" || view.Diff[0].Change != "added" {
		t.Fatalf("pending change's diff = %+v", view)
	}
	approve := func(id int64) string { return fmt.Sprintf("/api/v1/changes/%d/approve", id) }
	if status, body := f.call(t, "POST", approve(first.ID), "editor", ""); status != 403 || !strings.Contains(body, "self_approval") {
		t.Fatalf("self-approval: %d %s", status, body)
	}
	if status, _ := f.call(t, "POST", approve(first.ID), "viewer", ""); status != 403 {
		t.Fatalf("viewer approval: %d", status)
	}
	if _, err := f.store.CreateUser(t.Context(), "bob", "password1", "editor", sys); err != nil {
		t.Fatal(err)
	}
	bob := f.browser(t)
	bob.login("bob", "password1")
	status, body := bob.do("POST", approve(first.ID), `{"message":"lgtm"}`)
	var approved changeJSON
	json.Unmarshal([]byte(body), &approved)
	if status != 200 || approved.Status != "approved" || approved.Version == nil || *approved.Version != 1 || approved.Reviewer != "user:bob" {
		t.Fatalf("approval by bob: %d %s", status, body)
	}
	if _, body := f.call(t, "GET", "/api/v1/versions/1", "viewer", ""); !strings.Contains(body, `"approved_by":"user:bob"`) || !strings.Contains(body, `"author":"token:editor#`) {
		t.Fatalf("version 1: %s", body)
	}

	// Two requests on one base: the second cannot be approved after the first.
	var one, two struct {
		Change changeJSON `json:"change"`
	}
	f.decodeJSON(t, "PUT", "/api/v1/domains/api", "editor", publishBody("api", 200, 1, "raise"), 202, &one)
	f.decodeJSON(t, "PUT", "/api/v1/domains/api", "editor", publishBody("api", 300, 1, "raise more"), 202, &two)
	if status, body := bob.do("POST", approve(one.Change.ID), ""); status != 200 {
		t.Fatalf("approve one: %d %s", status, body)
	}
	if status, body := bob.do("POST", approve(two.Change.ID), ""); status != 409 || !strings.Contains(body, `"changed_in":2`) {
		t.Fatalf("approve two on a moved base: %d %s", status, body)
	}
	var pending struct {
		Changes []changeJSON `json:"changes"`
	}
	f.decodeJSON(t, "GET", "/api/v1/changes?status=pending", "viewer", "", 200, &pending)
	if len(pending.Changes) != 1 || pending.Changes[0].ID != two.Change.ID {
		t.Fatalf("pending = %+v", pending)
	}
	reject := fmt.Sprintf("/api/v1/changes/%d/reject", two.Change.ID)
	if status, _ := f.call(t, "POST", reject, "editor", `{}`); status != 400 {
		t.Fatalf("reject without a reason: %d", status)
	}
	f.decodeJSON(t, "POST", reject, "editor", `{"message":"superseded"}`, 200, nil)
	if status, body := bob.do("POST", approve(two.Change.ID), ""); status != 409 || !strings.Contains(body, "already rejected") {
		t.Fatalf("approve a rejected change: %d %s", status, body)
	}

	// Break glass: admins only, audited.
	breakGlass := `{"yaml":` + jsonString(domainYAML("api", 5)) + `,"message":"incident","base_version":2,"break_glass_reason":"INC-42 outage"}`
	if status, _ := f.call(t, "PUT", "/api/v1/domains/api", "editor", breakGlass); status != 403 {
		t.Fatalf("editor breaks glass: %d", status)
	}
	var p published
	f.decodeJSON(t, "PUT", "/api/v1/domains/api", "admin", breakGlass, 200, &p)
	if p.Version != 3 {
		t.Fatalf("break glass = %+v", p)
	}
	if _, body := f.call(t, "GET", "/api/v1/audit?action=change.break_glass", "viewer", ""); !strings.Contains(body, `"message":"INC-42 outage"`) {
		t.Fatalf("break glass not audited: %s", body)
	}

	// Rollbacks and deletions become change requests too.
	var rb struct {
		Change changeJSON `json:"change"`
	}
	f.decodeJSON(t, "POST", "/api/v1/versions/1/rollback", "editor", `{"message":"back to 1"}`, 202, &rb)
	if rb.Change.Kind != "rollback" || *rb.Change.RollbackOf != 1 {
		t.Fatalf("rollback request = %+v", rb.Change)
	}
	if status, body := bob.do("POST", approve(rb.Change.ID), ""); status != 200 {
		t.Fatalf("approve rollback: %d %s", status, body)
	}
	if _, body := f.call(t, "GET", "/api/v1/domains/api", "viewer", ""); !strings.Contains(body, "requests_per_unit: 100}") {
		t.Fatalf("api after the approved rollback: %s", body)
	}
	f.decodeJSON(t, "POST", "/api/v1/domains/api/rollback", "editor", `{"to_version":2,"message":"m"}`, 202, &rb)
	if rb.Change.Kind != "domain_rollback" {
		t.Fatalf("domain rollback request = %+v", rb.Change)
	}
	f.decodeJSON(t, "DELETE", "/api/v1/domains/api", "editor", `{"message":"m","base_version":4}`, 202, &rb)
	if rb.Change.Kind != "delete" {
		t.Fatalf("delete request = %+v", rb.Change)
	}

	// A token its author created cannot approve the author's change.
	if _, err := f.store.CreateUser(t.Context(), "root", "password1", "admin", sys); err != nil {
		t.Fatal(err)
	}
	root := f.browser(t)
	root.login("root", "password1")
	status, body = root.do("POST", "/api/v1/tokens", `{"name":"root-ci","role":"editor"}`)
	var tok struct {
		Token string `json:"token"`
	}
	json.Unmarshal([]byte(body), &tok)
	if status != 201 {
		t.Fatalf("create token: %d %s", status, body)
	}
	f.tokens["root-ci"] = tok.Token
	status, body = root.do("POST", "/api/v1/changes", `{"domain":"x","yaml":`+jsonString(domainYAML("x", 1))+`,"message":"m"}`)
	var mine changeJSON
	json.Unmarshal([]byte(body), &mine)
	if status != 201 {
		t.Fatalf("propose: %d %s", status, body)
	}
	if status, body := f.call(t, "POST", approve(mine.ID), "root-ci", ""); status != 403 {
		t.Fatalf("approval through the author's own token: %d %s", status, body)
	}

	// With approval off, publishes are direct again.
	f.decodeJSON(t, "PUT", "/api/v1/settings", "admin", `{"require_approval":false}`, 200, nil)
	f.decodeJSON(t, "PUT", "/api/v1/domains/y", "editor", publishBody("y", 1, 0, "m"), 200, &p)
	_, body = f.call(t, "GET", "/api/v1/audit?limit=1000", "viewer", "")
	for _, action := range []string{"settings.update", "change.propose", "change.approve", "change.reject", "change.break_glass"} {
		if !strings.Contains(body, `"action":"`+action+`"`) {
			t.Errorf("audit lacks %s", action)
		}
	}
	if _, body := f.call(t, "GET", "/api/v1/audit/verify", "viewer", ""); !strings.Contains(body, `"ok":true`) {
		t.Errorf("audit verify: %s", body)
	}
}

func TestAuditListAndExport(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	var p published
	f.decodeJSON(t, "PUT", "/api/v1/domains/api", "editor", publishBody("api", 1, 0, `=HYPERLINK("http://evil")`), 200, &p)
	f.decodeJSON(t, "PUT", "/api/v1/domains/b", "editor", publishBody("b", 1, 0, "plain, with \"quotes\"\nand a newline"), 200, &p)
	f.decodeJSON(t, "PUT", "/api/v1/domains/api", "editor", publishBody("api", 2, 1, "m"), 200, &p)

	var all struct {
		Events []struct {
			ID     int64  `json:"id"`
			Action string `json:"action"`
			Target string `json:"target"`
		} `json:"events"`
		Next *string `json:"next_cursor"`
	}
	f.decodeJSON(t, "GET", "/api/v1/audit?limit=1000", "viewer", "", 200, &all)
	if all.Next != nil || len(all.Events) < 9 { // fixture tokens and user, then three publishes
		t.Fatalf("audit = %+v", all)
	}
	// Walking pages of two visits every event once, newest first.
	var walked []int64
	cursor := ""
	for range 100 {
		var pg struct {
			Events []struct {
				ID int64 `json:"id"`
			} `json:"events"`
			Next *string `json:"next_cursor"`
		}
		f.decodeJSON(t, "GET", "/api/v1/audit?limit=2"+cursor, "viewer", "", 200, &pg)
		for _, e := range pg.Events {
			walked = append(walked, e.ID)
		}
		if pg.Next == nil {
			break
		}
		cursor = "&cursor=" + *pg.Next
	}
	if len(walked) != len(all.Events) {
		t.Fatalf("paged walk saw %d events, want %d", len(walked), len(all.Events))
	}
	for i, e := range all.Events {
		if walked[i] != e.ID {
			t.Fatalf("paged walk %v differs from the list", walked)
		}
	}
	var api struct {
		Events []struct {
			Target string `json:"target"`
		} `json:"events"`
	}
	f.decodeJSON(t, "GET", "/api/v1/audit?domain=api&action=domain.publish", "viewer", "", 200, &api)
	if len(api.Events) != 2 || api.Events[0].Target != "domain:api" {
		t.Fatalf("domain filter = %+v", api)
	}

	resp := f.do(t, "GET", "/api/v1/audit?format=csv", "viewer", "", nil)
	defer resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/csv") ||
		!strings.Contains(resp.Header.Get("Content-Disposition"), "attachment") {
		t.Fatalf("csv export: %d %v", resp.StatusCode, resp.Header)
	}
	var buf bytes.Buffer
	buf.ReadFrom(resp.Body)
	rows, err := csv.NewReader(&buf).ReadAll()
	if err != nil {
		t.Fatalf("export is not valid CSV: %v", err)
	}
	if strings.Join(rows[0], ",") != "id,at,actor,action,target,before,after,message,ip,user_agent,request_id,prev_hash,hash" {
		t.Fatalf("header = %v", rows[0])
	}
	if len(rows)-1 != len(all.Events) {
		t.Fatalf("csv has %d events, want %d", len(rows)-1, len(all.Events))
	}
	messages := map[string]bool{}
	for _, r := range rows[1:] {
		messages[r[7]] = true
		if r[12] == "" || r[11] == "" && r[0] != "1" {
			t.Errorf("row %v lacks its hashes", r)
		}
	}
	if !messages[`'=HYPERLINK("http://evil")`] {
		t.Errorf("a formula in a message was not defused: %v", messages)
	}
	if !messages["plain, with \"quotes\"\nand a newline"] {
		t.Errorf("a message with commas, quotes and a newline did not survive: %v", messages)
	}
	status, body := f.call(t, "GET", "/api/v1/audit?format=csv&action=domain.publish", "viewer", "")
	if status != 200 || strings.Count(body, "domain.publish") != 3 || strings.Contains(body, "token.create") {
		t.Fatalf("filtered export: %d %s", status, body)
	}
	for _, q := range []string{"format=xml", "since=now", "limit=5000", "cursor=-1"} {
		if status, _ := f.call(t, "GET", "/api/v1/audit?"+q, "viewer", ""); status != 400 {
			t.Errorf("audit?%s = %d, want 400", q, status)
		}
	}

	// Someone with database access edits a row behind the trigger's back.
	db, err := sql.Open("pgx", f.url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		"ALTER TABLE audit_events DISABLE TRIGGER audit_events_no_update",
		fmt.Sprintf("UPDATE audit_events SET actor = 'user:nobody' WHERE id = %d", all.Events[1].ID),
		"ALTER TABLE audit_events ENABLE TRIGGER audit_events_no_update",
	} {
		if _, err := tx.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	var ver struct {
		OK       bool  `json:"ok"`
		BrokenID int64 `json:"broken_id"`
	}
	f.decodeJSON(t, "GET", "/api/v1/audit/verify", "viewer", "", 200, &ver)
	if ver.OK || ver.BrokenID != all.Events[1].ID {
		t.Fatalf("verify after tampering with event %d = %+v", all.Events[1].ID, ver)
	}
}

// TestConcurrentPublishAPI has 20 publishers on 4 domains through the API,
// each re-reading its base and retrying on 409: versions are contiguous,
// nothing is lost, the latest version holds every domain's last change and
// the audit chain verifies.
func TestConcurrentPublishAPI(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const publishers, each = 20, 3
	type last struct {
		version int64
		yaml    string
	}
	var (
		mu     sync.Mutex
		latest = map[string]last{}
		wg     sync.WaitGroup
		errs   = make(chan string, publishers)
	)
	for p := range publishers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			domain := fmt.Sprintf("d%d", p%4)
			for i := 0; i < each; {
				base := int64(0)
				resp, err := http.DefaultClient.Do(f.request("GET", "/api/v1/domains/"+domain, "editor", ""))
				if err != nil {
					errs <- err.Error()
					return
				}
				var d struct {
					Version int64 `json:"version"`
				}
				json.NewDecoder(resp.Body).Decode(&d)
				resp.Body.Close()
				base = d.Version
				n := p*100 + i + 1
				resp, err = http.DefaultClient.Do(f.request("PUT", "/api/v1/domains/"+domain, "editor", publishBody(domain, n, base, "m")))
				if err != nil {
					errs <- err.Error()
					return
				}
				var out published
				json.NewDecoder(resp.Body).Decode(&out)
				resp.Body.Close()
				switch resp.StatusCode {
				case 409:
					continue
				case 200:
				default:
					errs <- fmt.Sprintf("publish: %d", resp.StatusCode)
					return
				}
				mu.Lock()
				if out.Version > latest[domain].version {
					latest[domain] = last{out.Version, domainYAML(domain, n)}
				}
				mu.Unlock()
				i++
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
	var vs struct {
		Versions []published `json:"versions"`
	}
	f.decodeJSON(t, "GET", "/api/v1/versions?limit=1000", "viewer", "", 200, &vs)
	if len(vs.Versions) != publishers*each {
		t.Fatalf("%d versions, want %d", len(vs.Versions), publishers*each)
	}
	for i, v := range vs.Versions {
		if want := int64(len(vs.Versions) - i); v.Version != want {
			t.Fatalf("versions not contiguous: position %d is %d, want %d", i, v.Version, want)
		}
	}
	var rs struct {
		Version int64 `json:"version"`
		Domains []struct {
			Name    string `json:"name"`
			YAML    string `json:"yaml"`
			Version int64  `json:"version"`
		} `json:"domains"`
	}
	f.decodeJSON(t, "GET", "/api/v1/ruleset", "viewer", "", 200, &rs)
	if rs.Version != publishers*each || len(rs.Domains) != 4 {
		t.Fatalf("ruleset at %d with %d domains", rs.Version, len(rs.Domains))
	}
	for _, d := range rs.Domains {
		if want := latest[d.Name]; d.Version != want.version || d.YAML != want.yaml {
			t.Errorf("domain %s at version %d, want its last publish %d", d.Name, d.Version, want.version)
		}
	}
	var ver struct {
		OK     bool  `json:"ok"`
		Events int64 `json:"events"`
	}
	f.decodeJSON(t, "GET", "/api/v1/audit/verify", "viewer", "", 200, &ver)
	if !ver.OK || ver.Events < publishers*each {
		t.Fatalf("audit verify = %+v", ver)
	}
}

func (f *fixture) request(method, path, cred, body string) *http.Request {
	req, _ := http.NewRequest(method, f.srv.URL+path, strings.NewReader(body))
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if cred != "" {
		req.Header.Set("Authorization", "Bearer "+f.tokens[cred])
	}
	return req
}

func TestHardening(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	huge := `{"yaml":"` + strings.Repeat("#", 3<<20) + `","message":"m"}`
	if status, body := f.call(t, "PUT", "/api/v1/domains/api", "editor", huge); status != 413 {
		t.Errorf("3 MiB body: %d %s", status, excerpt(body))
	}
	bigLogin := `{"username":"alice","password":"` + strings.Repeat("x", 20<<10) + `"}`
	if status, _ := f.call(t, "POST", "/api/v1/auth/login", "", bigLogin); status != 413 {
		t.Errorf("20 KiB login body: %d", status)
	}
	ws := func(origin string) (int, string) {
		h := http.Header{"Connection": {"Upgrade"}, "Upgrade": {"websocket"}, "Sec-Websocket-Version": {"13"}}
		if origin != "" {
			h.Set("Origin", origin)
		}
		resp := f.do(t, "GET", "/api/v1/nodes/stream", "node", "", h)
		defer resp.Body.Close()
		var buf bytes.Buffer
		buf.ReadFrom(resp.Body)
		return resp.StatusCode, buf.String()
	}
	if status, body := ws("https://evil.example"); status != 403 || !strings.Contains(body, "forbidden_origin") {
		t.Errorf("cross-origin websocket: %d %s", status, body)
	}
	if status, body := ws("null"); status != 403 {
		t.Errorf("opaque-origin websocket: %d %s", status, body)
	}
	// Same origin, and no origin (programs), pass the check and reach the
	// handshake, which then wants a Sec-WebSocket-Key.
	for _, origin := range []string{f.srv.URL, ""} {
		if status, body := ws(origin); status == 403 {
			t.Errorf("websocket with origin %q: %d %s", origin, status, body)
		}
	}
	resp := f.do(t, "GET", "/healthz", "", "", http.Header{"X-Request-Id": {"evil id <script>"}})
	resp.Body.Close()
	if id := resp.Header.Get("X-Request-Id"); strings.Contains(id, "evil") || id == "" {
		t.Errorf("unsafe request id echoed: %q", id)
	}
	for _, h := range []string{"Content-Security-Policy", "X-Content-Type-Options", "Referrer-Policy", "X-Frame-Options"} {
		if resp.Header.Get(h) == "" {
			t.Errorf("missing header %s", h)
		}
	}
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "frame-ancestors 'none'") {
		t.Errorf("CSP = %q", csp)
	}

	// With the database gone, errors are 500 without their text.
	f.store.Close()
	status, body := f.call(t, "GET", "/api/v1/ruleset", "viewer", "")
	if status != 500 || body != `{"error":{"code":"internal","message":"internal error"}}` {
		t.Errorf("database down: %d %s", status, body)
	}
}
