package api_test

import (
	"net/http"
	"strings"
	"testing"
)

// TestTextInputsRefuseNULAndInvalidUTF8: a NUL byte or
// invalid UTF-8 in any text field of a JSON body, in any query filter or in
// a path parameter gets 400 naming the field. Before, NUL reached Postgres
// (500) and invalid UTF-8 was silently replaced with U+FFFD.
func TestTextInputsRefuseNULAndInvalidUTF8(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.decodeJSON(t, "PUT", "/api/v1/domains/api", "editor", publishBody("api", 5, 0, "v1"), http.StatusOK, nil)
	y := jsonString(validYAML)
	// In each body, @ is where the hostile text goes, inside a JSON string.
	bodies := []struct {
		method, path, cred, body, field string
	}{
		{"POST", "/api/v1/auth/login", "", `{"username":"a@","password":"correct horse"}`, "username"},
		{"POST", "/api/v1/auth/login", "", `{"username":"alice","password":"correct horse@"}`, "password"},
		{"PUT", "/api/v1/domains/api", "editor", `{"yaml":` + y + `,"message":"m@","base_version":1}`, "message"},
		{"PUT", "/api/v1/domains/api", "editor", `{"yaml":"domain: api@","message":"m","base_version":1}`, "yaml"},
		{"PUT", "/api/v1/domains/api", "admin", `{"yaml":` + y + `,"message":"m","base_version":1,"break_glass_reason":"b@"}`, "break_glass_reason"},
		{"DELETE", "/api/v1/domains/api", "editor", `{"message":"m@","base_version":1}`, "message"},
		{"POST", "/api/v1/domains/api/rollback", "editor", `{"to_version":1,"message":"m@"}`, "message"},
		{"POST", "/api/v1/versions/1/rollback", "editor", `{"message":"m@"}`, "message"},
		{"POST", "/api/v1/changes", "editor", `{"domain":"api","yaml":` + y + `,"message":"m@"}`, "message"},
		{"POST", "/api/v1/changes", "editor", `{"domain":"api@","yaml":` + y + `,"message":"m"}`, "domain"},
		{"POST", "/api/v1/changes/1/approve", "editor", `{"message":"m@"}`, "message"},
		{"POST", "/api/v1/changes/1/reject", "editor", `{"message":"m@"}`, "message"},
		{"POST", "/api/v1/tokens", "admin", `{"name":"t@","role":"viewer"}`, "name"},
		{"POST", "/api/v1/tokens", "admin", `{"name":"t","role":"viewer","expires_in":"1h@"}`, "expires_in"},
		{"POST", "/api/v1/users", "admin", `{"username":"u@","password":"long enough","role":"viewer"}`, "username"},
		{"PUT", "/api/v1/users/1/role", "admin", `{"role":"viewer@"}`, "role"},
		{"PUT", "/api/v1/users/1/password", "admin", `{"password":"long enough@"}`, "password"},
	}
	bad := []struct{ name, json, query string }{
		{"NUL", `\u0000`, "%00"},
		{"invalid UTF-8", "\xff", "%FF"},
		{"truncated sequence", "\xe2\x82", "%E2%82"},
	}
	for _, b := range bodies {
		for _, x := range bad {
			t.Run(b.method+" "+b.path+" "+b.field+" "+x.name, func(t *testing.T) {
				status, got := f.call(t, b.method, b.path, b.cred, strings.Replace(b.body, "@", x.json, 1))
				if status != http.StatusBadRequest || !strings.Contains(got, `"message":"`+b.field+` `) {
					t.Errorf("= %d %s, want 400 naming %s", status, excerpt(got), b.field)
				}
			})
		}
	}
	filters := []struct{ path, param string }{
		{"/api/v1/audit", "actor"}, {"/api/v1/audit", "action"}, {"/api/v1/audit", "target"}, {"/api/v1/audit", "domain"},
		{"/api/v1/audit", "since"},
		{"/api/v1/versions", "domain"}, {"/api/v1/versions", "author"},
		{"/api/v1/changes", "status"}, {"/api/v1/changes", "domain"}, {"/api/v1/changes", "author"},
		{"/api/v1/nodes", "status"},
		{"/api/v1/stats/totals", "domain"}, {"/api/v1/stats/live", "domain"},
	}
	for _, q := range filters {
		for _, x := range bad {
			t.Run("GET "+q.path+"?"+q.param+" "+x.name, func(t *testing.T) {
				status, got := f.call(t, "GET", q.path+"?"+q.param+"=a"+x.query, "viewer", "")
				if status != http.StatusBadRequest || !strings.Contains(got, "query parameter "+q.param) {
					t.Errorf("= %d %s, want 400 naming query parameter %s", status, excerpt(got), q.param)
				}
			})
		}
	}
	t.Run("a query value over the text bound", func(t *testing.T) {
		status, got := f.call(t, "GET", "/api/v1/audit?actor="+strings.Repeat("a", 4097), "viewer", "")
		if status != http.StatusBadRequest || !strings.Contains(got, "query parameter actor is over 4096 bytes") {
			t.Errorf("= %d %s, want 400", status, excerpt(got))
		}
	})
	t.Run("a path parameter", func(t *testing.T) {
		status, got := f.call(t, "GET", "/api/v1/versions/1%FF", "viewer", "")
		if status != http.StatusBadRequest || !strings.Contains(got, "n is not valid UTF-8") {
			t.Errorf("= %d %s, want 400", status, excerpt(got))
		}
	})
	t.Run("U+FFFD itself is text", func(t *testing.T) {
		f.decodeJSON(t, "PUT", "/api/v1/domains/api", "editor", publishBody("api", 6, 1, "v2 \uFFFD"), http.StatusOK, nil)
	})
	t.Run("invalid UTF-8 in the User-Agent still signs in", func(t *testing.T) {
		resp := f.do(t, "POST", "/api/v1/auth/login", "", `{"username":"alice","password":"correct horse"}`,
			http.Header{"User-Agent": {"x\xffy"}})
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("sign-in = %d, want 200", resp.StatusCode)
		}
	})
}
