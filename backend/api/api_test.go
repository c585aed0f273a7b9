package api_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend/api"
	"github.com/sluicehq/sluice/backend/hub"
	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/internal/testenv"
)

const validYAML = `domain: api
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 100}
`

type fixture struct {
	srv    *httptest.Server
	store  *store.Store
	tokens map[string]string // credential name → bearer secret
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	srv := httptest.NewServer(api.New(api.Config{Store: st, Hub: hub.New(st, log), Log: log}))
	t.Cleanup(srv.Close)
	f := &fixture{srv: srv, store: st, tokens: map[string]string{}}
	sys := store.Actor{Name: "test"}
	for _, role := range []string{"viewer", "editor", "admin", "node"} {
		_, secret, err := st.CreateToken(ctx, role, role, nil, sys)
		if err != nil {
			t.Fatal(err)
		}
		f.tokens[role] = secret
	}
	past := time.Now().Add(-time.Hour)
	_, secret, err := st.CreateToken(ctx, "old", "admin", &past, sys)
	if err != nil {
		t.Fatal(err)
	}
	f.tokens["expired"] = secret
	f.tokens["garbage"] = "slc_not-a-real-token"
	if _, err := st.CreateUser(ctx, "alice", "correct horse", "editor", sys); err != nil {
		t.Fatal(err)
	}
	return f
}

// call sends a request with a credential ("" = anonymous) and returns the
// status and body.
func (f *fixture) call(t *testing.T, method, path, cred, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, f.srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if cred != "" {
		req.Header.Set("Authorization", "Bearer "+f.tokens[cred])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestRouteAccess(t *testing.T) {
	f := newFixture(t)
	publish := `{"yaml":` + jsonString(validYAML) + `,"message":"m","base_version":0}`
	// Each scenario runs in order against one database.
	scenarios := []struct {
		name, method, path, cred, body string
		status                         int
		contains                       string
	}{
		{"health", "GET", "/healthz", "", "", 200, "ok"},
		{"ready", "GET", "/readyz", "", "", 200, "ready"},
		{"metrics", "GET", "/metrics", "", "", 200, "sluice_console_http_requests_total"},
		{"ruleset anonymous", "GET", "/api/v1/ruleset", "", "", 401, "unauthorized"},
		{"ruleset garbage", "GET", "/api/v1/ruleset", "garbage", "", 401, "unauthorized"},
		{"ruleset expired", "GET", "/api/v1/ruleset", "expired", "", 401, "unauthorized"},
		{"ruleset node", "GET", "/api/v1/ruleset", "node", "", 403, "forbidden"},
		{"ruleset viewer", "GET", "/api/v1/ruleset", "viewer", "", 200, `"version":0`},
		{"publish viewer", "PUT", "/api/v1/domains/api", "viewer", publish, 403, "forbidden"},
		{"publish node", "PUT", "/api/v1/domains/api", "node", publish, 403, "forbidden"},
		{"publish editor", "PUT", "/api/v1/domains/api", "editor", publish, 200, `{"version":1}`},
		{"publish stale", "PUT", "/api/v1/domains/api", "editor", publish, 409, "changed in version 1"},
		{"publish invalid yaml", "PUT", "/api/v1/domains/api", "editor",
			`{"yaml":"domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n","message":"m","base_version":1}`,
			422, `"line":4`},
		{"publish wrong domain", "PUT", "/api/v1/domains/other", "editor", publish, 422, "does not match"},
		{"publish no message", "PUT", "/api/v1/domains/api", "editor", `{"yaml":"x","message":" ","base_version":1}`, 400, "message is required"},
		{"publish unknown field", "PUT", "/api/v1/domains/api", "editor", `{"yml":"x"}`, 400, `unknown field \"yml\"`},
		{"publish bad json", "PUT", "/api/v1/domains/api", "editor", `{`, 400, "invalid JSON"},
		{"publish bad domain name", "PUT", "/api/v1/domains/a%20b", "editor", publish, 400, "domain names"},
		{"domain viewer", "GET", "/api/v1/domains/api", "viewer", "", 200, `"version":1`},
		{"domain missing", "GET", "/api/v1/domains/nope", "viewer", "", 404, "not_found"},
		{"versions", "GET", "/api/v1/versions", "viewer", "", 200, `"author":"token:editor#2"`},
		{"version 1", "GET", "/api/v1/versions/1", "viewer", "", 200, `"name":"api"`},
		{"version 99", "GET", "/api/v1/versions/99", "viewer", "", 404, "not_found"},
		{"version bad", "GET", "/api/v1/versions/x", "viewer", "", 400, "positive integer"},
		{"delete stale", "DELETE", "/api/v1/domains/api", "editor", `{"message":"bye","base_version":0}`, 409, "conflict"},
		{"delete", "DELETE", "/api/v1/domains/api", "editor", `{"message":"bye","base_version":1}`, 200, `{"version":2}`},
		{"delete again", "DELETE", "/api/v1/domains/api", "editor", `{"message":"bye","base_version":2}`, 404, "not_found"},
		{"rollback viewer", "POST", "/api/v1/versions/1/rollback", "viewer", `{"message":"undo"}`, 403, "forbidden"},
		{"rollback", "POST", "/api/v1/versions/1/rollback", "editor", `{"message":"undo"}`, 200, `"version":3`},
		{"rollback future", "POST", "/api/v1/versions/50/rollback", "editor", `{"message":"undo"}`, 404, "not_found"},
		{"after rollback", "GET", "/api/v1/domains/api", "viewer", "", 200, `"version":3`},
		{"tokens editor", "POST", "/api/v1/tokens", "editor", `{"name":"x","role":"viewer"}`, 403, "forbidden"},
		{"tokens admin", "POST", "/api/v1/tokens", "admin", `{"name":"x","role":"node"}`, 201, `"token":"slc_`},
		{"tokens bad role", "POST", "/api/v1/tokens", "admin", `{"name":"x","role":"root"}`, 400, "role must be"},
		{"nodes", "GET", "/api/v1/nodes", "viewer", "", 200, `"nodes":[]`},
		{"stream viewer", "GET", "/api/v1/nodes/stream", "viewer", "", 403, "forbidden"},
		{"stream anonymous", "GET", "/api/v1/nodes/stream", "", "", 401, "unauthorized"},
		{"audit", "GET", "/api/v1/audit?action=domain.publish", "viewer", "", 200, `"action":"domain.publish"`},
		{"audit verify", "GET", "/api/v1/audit/verify", "viewer", "", 200, `"ok":true`},
		{"me node", "GET", "/api/v1/me", "node", "", 403, "forbidden"},
		{"unknown api route", "GET", "/api/v1/nope", "viewer", "", 404, "no such route"},
	}
	for _, s := range scenarios {
		status, body := f.call(t, s.method, s.path, s.cred, s.body)
		if status != s.status || !strings.Contains(body, s.contains) {
			t.Errorf("%s: %s %s as %q = %d %s; want %d containing %q", s.name, s.method, s.path, s.cred, status, body, s.status, s.contains)
		}
	}
}

func TestSessionLoginAndCSRF(t *testing.T) {
	f := newFixture(t)
	jar, _ := cookiejar.New(nil)
	client := &http.Client{Jar: jar}
	do := func(method, path, csrf, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, f.srv.URL+path, strings.NewReader(body))
		if csrf != "" {
			req.Header.Set("X-CSRF-Token", csrf)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if status, body := do("POST", "/api/v1/auth/login", "", `{"username":"alice","password":"wrong"}`); status != 401 || !strings.Contains(body, "invalid username or password") {
		t.Fatalf("wrong password: %d %s", status, body)
	}
	if status, body := do("POST", "/api/v1/auth/login", "", `{"username":"nobody","password":"wrong"}`); status != 401 || !strings.Contains(body, "invalid username or password") {
		t.Fatalf("unknown user: %d %s", status, body)
	}
	status, body := do("POST", "/api/v1/auth/login", "", `{"username":"alice","password":"correct horse"}`)
	if status != 200 {
		t.Fatalf("login: %d %s", status, body)
	}
	var login struct {
		CSRFToken string `json:"csrf_token"`
	}
	json.Unmarshal([]byte(body), &login)
	if login.CSRFToken == "" {
		t.Fatalf("login returned no csrf_token: %s", body)
	}
	if status, body := do("GET", "/api/v1/me", "", ""); status != 200 || !strings.Contains(body, `"username":"alice"`) {
		t.Fatalf("me: %d %s", status, body)
	}
	publish := `{"yaml":` + jsonString(validYAML) + `,"message":"m","base_version":0}`
	if status, body := do("PUT", "/api/v1/domains/api", "", publish); status != 403 || !strings.Contains(body, "csrf") {
		t.Fatalf("write without CSRF: %d %s", status, body)
	}
	if status, body := do("PUT", "/api/v1/domains/api", "wrong", publish); status != 403 {
		t.Fatalf("write with wrong CSRF: %d %s", status, body)
	}
	if status, body := do("PUT", "/api/v1/domains/api", login.CSRFToken, publish); status != 200 {
		t.Fatalf("write with CSRF: %d %s", status, body)
	}
	if status, body := do("GET", "/api/v1/versions", "", ""); !strings.Contains(body, `"author":"user:alice"`) {
		t.Fatalf("versions: %d %s", status, body)
	}
	if status, _ := do("POST", "/api/v1/auth/logout", login.CSRFToken, ""); status != 204 {
		t.Fatalf("logout: %d", status)
	}
	if status, _ := do("GET", "/api/v1/me", "", ""); status != 401 {
		t.Fatalf("me after logout: %d", status)
	}
	status, body = f.call(t, "GET", "/api/v1/audit", "viewer", "")
	for _, action := range []string{"auth.login_failed", "auth.login", "domain.publish", "auth.logout"} {
		if !strings.Contains(body, `"action":"`+action+`"`) {
			t.Errorf("audit lacks %s: %d %s", action, status, body)
		}
	}
}

func TestSecurityHeaders(t *testing.T) {
	f := newFixture(t)
	resp, err := http.Get(f.srv.URL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	for _, h := range []string{"Content-Security-Policy", "X-Content-Type-Options", "Referrer-Policy", "X-Request-Id"} {
		if resp.Header.Get(h) == "" {
			t.Errorf("missing header %s", h)
		}
	}
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "frame-ancestors 'none'") {
		t.Errorf("CSP = %q", csp)
	}
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
