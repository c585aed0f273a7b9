package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/sluicehq/sluice/backend/api"
	"github.com/sluicehq/sluice/backend/hub"
	"github.com/sluicehq/sluice/backend/stats"
	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/enforcer/limiter"
	"github.com/sluicehq/sluice/internal/apicheck"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
)

func domainYAML(name string, n int) string {
	return fmt.Sprintf("domain: %s\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: minute, requests_per_unit: %d}\n", name, n)
}

var validYAML = domainYAML("api", 100)

// clock is a time source the test moves by hand.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

type fixture struct {
	api    *api.API
	url    string // the test database
	srv    *httptest.Server
	store  *store.Store
	clock  *clock
	tokens map[string]string // credential name → bearer secret
	ids    map[string]int64  // named fixtures → ids
	// counters is the test Redis the support desk reads, under keyPrefix.
	counters  *limiter.Redis
	keyPrefix string
}

// sys is the actor of fixture set-up.
var sys = store.Actor{Name: "test"}

// credentials are every kind of caller; "" is anonymous. Each role comes
// unscoped (every domain) and scoped (see scopedCreds), and admin also as
// a read-only token.
// The scoped ones come before editor and admin, whose writes (a rollback
// to version 1) could leave nothing for theirs to change.
var credentials = []string{"", "garbage", "viewer", "support", "sviewer", "ssupport", "seditor", "sadmin", "readonly",
	"editor", "admin", "node", "expired", "disabled"}

// scopedCreds are the credentials whose role holds for scopedDomain only,
// by the role they hold.
var scopedCreds = map[string]string{"sviewer": "viewer", "ssupport": "support", "seditor": "editor", "sadmin": "admin"}

// scopedDomain is the one domain the scoped credentials may write; no
// scenario writes to it, so each of their writes is out of scope.
const scopedDomain = "mine"

// newFixture serves the API on a fresh database, with the test Redis as
// the counter store (under a key prefix of the test's own); opts change the
// configuration.
func newFixture(t *testing.T, opts ...func(*api.Config)) *fixture {
	t.Helper()
	return newFixtureCost(t, bcrypt.MinCost, opts...) // sign-ins at test speed
}

// newFixtureCost is newFixture with passwords hashed at bcrypt cost cost.
func newFixtureCost(t *testing.T, cost int, opts ...func(*api.Config)) *fixture {
	t.Helper()
	ctx := context.Background()
	url := testenv.PostgresURL(t)
	st, err := store.Open(ctx, url, store.PasswordCost(cost))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	clk := &clock{t: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	client, err := limiter.NewClient(testenv.RedisURL(t), limiter.WithTimeout(2*time.Second), limiter.WithDialTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	cfg := api.Config{Store: st, Hub: hub.New(st, log), Stats: stats.New(stats.Config{Store: st, Log: log}), Log: log,
		LoginThrottle: api.NewTestThrottle(clk.now), Counters: limiter.NewRedis(client), KeyPrefix: testenv.KeyPrefix(t)}
	for _, o := range opts {
		o(&cfg)
	}
	a := api.New(cfg)
	srv := httptest.NewServer(apicheck.Handler(t, a))
	t.Cleanup(srv.Close)
	f := &fixture{api: a, url: url, srv: srv, store: st, clock: clk, tokens: map[string]string{}, ids: map[string]int64{},
		counters: cfg.Counters, keyPrefix: cfg.KeyPrefix}
	for _, role := range []string{"viewer", "support", "editor", "admin", "node"} {
		f.token(t, role, role, nil)
	}
	for cred, role := range scopedCreds {
		f.scopedToken(t, cred, store.TokenSpec{Name: cred, Role: role, Domains: []string{scopedDomain}})
	}
	f.scopedToken(t, "readonly", store.TokenSpec{Name: "readonly", Role: "admin", ReadOnly: true})
	past := time.Now().Add(-time.Hour)
	f.token(t, "expired", "admin", &past)
	f.token(t, "disabled", "admin", nil)
	if _, err := st.DisableToken(ctx, f.ids["token:disabled"], sys); err != nil {
		t.Fatal(err)
	}
	f.tokens["garbage"] = "slc_not-a-real-token"
	if _, err := st.CreateUser(ctx, "alice", "correct horse", "editor", sys); err != nil {
		t.Fatal(err)
	}
	return f
}

// token creates a token named name and keeps its secret as credential name.
func (f *fixture) token(t *testing.T, name, role string, expires *time.Time) {
	t.Helper()
	tok, secret, err := f.store.CreateToken(context.Background(), name, role, expires, sys)
	if err != nil {
		t.Fatal(err)
	}
	f.tokens[name] = secret
	f.ids["token:"+name] = tok.ID
}

// scopedToken creates a token from spec and keeps its secret as credential
// name.
func (f *fixture) scopedToken(t *testing.T, name string, spec store.TokenSpec) {
	t.Helper()
	tok, secret, err := f.store.CreateScopedToken(context.Background(), spec, sys)
	if err != nil {
		t.Fatal(err)
	}
	f.tokens[name] = secret
	f.ids["token:"+name] = tok.ID
}

// call sends a request with a credential ("" = anonymous) and returns the
// status and body.
func (f *fixture) call(t *testing.T, method, path, cred, body string) (int, string) {
	t.Helper()
	resp := f.do(t, method, path, cred, body, nil)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (f *fixture) do(t *testing.T, method, path, cred, body string, header http.Header) *http.Response {
	t.Helper()
	req, err := http.NewRequest(method, f.srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if cred != "" {
		req.Header.Set("Authorization", "Bearer "+f.tokens[cred])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// decodeJSON calls and decodes a JSON answer, failing unless the status is want.
func (f *fixture) decodeJSON(t *testing.T, method, path, cred, body string, want int, out any) {
	t.Helper()
	status, got := f.call(t, method, path, cred, body)
	if status != want {
		t.Fatalf("%s %s as %q = %d %s; want %d", method, path, cred, status, got, want)
	}
	if out != nil {
		if err := json.Unmarshal([]byte(got), out); err != nil {
			t.Fatalf("%s %s: decode %s: %v", method, path, got, err)
		}
	}
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func publishBody(domain string, n int, base int64, message string) string {
	return fmt.Sprintf(`{"yaml":%s,"message":%s,"base_version":%d}`, jsonString(domainYAML(domain, n)), jsonString(message), base)
}

// scenario is one route probed with every credential. Auth is who may call
// it: "open" (outside /api/v1, no authentication at all), "public" (any
// valid or no credential), or the least role. OK is the status an allowed
// caller gets. Scope is what a role of some domains only gets: "" the same
// as the role (reads, previews, tokens no wider than the caller), "domain"
// 403 (the scenario writes to domains outside the grant), "all" 403 (the
// route needs the role for every domain). In Path and Body, {cred} becomes the credential's name and
// {id:NAME} the id of fixture NAME (after {cred} is replaced; 0 if none),
// so that callers who succeed do not collide.
type scenario struct {
	route     string // gin's "METHOD /pattern"
	path      string
	body      string
	auth      string
	ok        int
	scope     string
	overrides map[string]int
}

var rank = map[string]int{"viewer": 1, "support": 2, "editor": 3, "admin": 4}

// want is the status cred should get.
func (s scenario) want(cred string) int {
	if st, ok := s.overrides[cred]; ok {
		return st
	}
	if role, ok := scopedCreds[cred]; ok {
		got := s.want(role)
		if got == s.ok && s.scope != "" && s.auth != "open" && s.auth != "public" {
			return http.StatusForbidden
		}
		return got
	}
	if cred == "readonly" {
		got := s.want("admin")
		method, _, _ := strings.Cut(s.route, " ")
		if got == s.ok && method != "GET" && s.auth != "open" && s.auth != "public" {
			return http.StatusForbidden
		}
		return got
	}
	switch {
	case s.auth == "open":
		return s.ok
	case cred == "garbage" || cred == "expired" || cred == "disabled":
		return http.StatusUnauthorized
	case s.auth == "public":
		return s.ok
	case cred == "":
		return http.StatusUnauthorized
	case s.auth == "node" || cred == "node":
		if s.auth == cred {
			return s.ok
		}
		return http.StatusForbidden
	case rank[cred] >= rank[s.auth]:
		return s.ok
	}
	return http.StatusForbidden
}

var placeholder = regexp.MustCompile(`\{id:([^}]+)\}`)

func (f *fixture) expand(s, cred string) string {
	s = strings.ReplaceAll(s, "{cred}", cred)
	return placeholder.ReplaceAllStringFunc(s, func(m string) string {
		return strconv.FormatInt(f.ids[placeholder.FindStringSubmatch(m)[1]], 10)
	})
}

// scenarios covers every route; TestEveryRouteHasScenario keeps it so.
var scenarios = []scenario{
	{route: "GET /healthz", path: "/healthz", auth: "open", ok: 200},
	{route: "GET /readyz", path: "/readyz", auth: "open", ok: 200},
	{route: "GET /metrics", path: "/metrics", auth: "open", ok: 200},
	{route: "GET /api/v1/openapi.json", path: "/api/v1/openapi.json", auth: "public", ok: 200},
	{route: "GET /api/v1/schema", path: "/api/v1/schema", auth: "public", ok: 200},
	{route: "POST /api/v1/auth/login", path: "/api/v1/auth/login", body: `{"username":"probe","password":"probe-password"}`, auth: "public", ok: 200},
	{route: "POST /api/v1/auth/logout", path: "/api/v1/auth/logout", auth: "viewer", ok: 204},
	{route: "GET /api/v1/me", path: "/api/v1/me", auth: "viewer", ok: 200},
	{route: "GET /api/v1/auth/methods", path: "/api/v1/auth/methods", auth: "public", ok: 200},
	// Single sign-on is not configured here; its flows are in oidc_test.go.
	{route: "GET /api/v1/auth/oidc/login", path: "/api/v1/auth/oidc/login", auth: "public", ok: 404},
	{route: "GET /api/v1/auth/oidc/callback", path: "/api/v1/auth/oidc/callback?state=s&code=c", auth: "public", ok: 404},
	// Tokens have no password; a signed-in user's change is in TestSessions.
	{route: "PUT /api/v1/me/password", path: "/api/v1/me/password", body: `{"current_password":"a","new_password":"password2"}`, auth: "viewer", ok: 403},
	// Tokens have no sessions; a signed-in user's are in TestSessionControl.
	{route: "GET /api/v1/me/sessions", path: "/api/v1/me/sessions", auth: "viewer", ok: 403},
	{route: "DELETE /api/v1/me/sessions", path: "/api/v1/me/sessions", auth: "viewer", ok: 403},
	{route: "GET /api/v1/ruleset", path: "/api/v1/ruleset", auth: "viewer", ok: 200},
	{route: "PUT /api/v1/ruleset", path: "/api/v1/ruleset",
		body: `{"domains":{"rs-{cred}":"domain: rs-{cred}\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n"},"message":"m"}`,
		auth: "editor", ok: 200, scope: "domain"},
	{route: "GET /api/v1/domains", path: "/api/v1/domains", auth: "viewer", ok: 200},
	{route: "GET /api/v1/domains/:domain", path: "/api/v1/domains/api", auth: "viewer", ok: 200},
	{route: "PUT /api/v1/domains/:domain", path: "/api/v1/domains/p-{cred}",
		body: `{"yaml":"domain: p-{cred}\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n","message":"m","base_version":0}`,
		auth: "editor", ok: 200, scope: "domain"},
	{route: "DELETE /api/v1/domains/:domain", path: "/api/v1/domains/del-{cred}", body: `{"message":"m","base_version":{id:del-{cred}}}`, auth: "editor", ok: 200, scope: "domain"},
	{route: "POST /api/v1/domains/:domain/rollback", path: "/api/v1/domains/api/rollback", body: `{"to_version":1,"message":"m"}`, auth: "editor", ok: 200, scope: "domain"},
	{route: "POST /api/v1/preview", path: "/api/v1/preview",
		body: `{"domain":"api","yaml":"domain: api\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: minute, requests_per_unit: 5}\n"}`,
		auth: "editor", ok: 200},
	{route: "GET /api/v1/versions", path: "/api/v1/versions", auth: "viewer", ok: 200},
	{route: "GET /api/v1/versions/:n", path: "/api/v1/versions/1", auth: "viewer", ok: 200},
	{route: "GET /api/v1/versions/:n/diff/:m", path: "/api/v1/versions/1/diff/2", auth: "viewer", ok: 200},
	{route: "POST /api/v1/versions/:n/rollback", path: "/api/v1/versions/1/rollback", body: `{"message":"m"}`, auth: "editor", ok: 200, scope: "domain"},
	// Version 1 was not staged: an allowed caller is told so (the staged
	// path is in TestRolloutAPI).
	{route: "POST /api/v1/versions/:n/promote", path: "/api/v1/versions/1/promote", body: `{"message":"m"}`, auth: "editor", ok: 409, scope: "domain"},
	{route: "GET /api/v1/versions/:n/cohorts", path: "/api/v1/versions/1/cohorts", auth: "viewer", ok: 404},
	{route: "GET /api/v1/changes", path: "/api/v1/changes", auth: "viewer", ok: 200},
	{route: "POST /api/v1/changes", path: "/api/v1/changes",
		body: `{"domain":"cr-{cred}","yaml":"domain: cr-{cred}\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n","message":"m"}`,
		auth: "editor", ok: 201, scope: "domain"},
	{route: "GET /api/v1/changes/:id", path: "/api/v1/changes/{id:approve-editor}", auth: "viewer", ok: 200},
	{route: "POST /api/v1/changes/:id/approve", path: "/api/v1/changes/{id:approve-{cred}}/approve", auth: "editor", ok: 200, scope: "domain"},
	{route: "POST /api/v1/changes/:id/reject", path: "/api/v1/changes/{id:reject-{cred}}/reject", body: `{"message":"no"}`, auth: "editor", ok: 200, scope: "domain"},
	{route: "GET /api/v1/settings", path: "/api/v1/settings", auth: "viewer", ok: 200},
	{route: "PUT /api/v1/settings", path: "/api/v1/settings", body: `{"require_approval":false}`, auth: "admin", ok: 200, scope: "all"},
	{route: "GET /api/v1/audit", path: "/api/v1/audit", auth: "viewer", ok: 200},
	{route: "GET /api/v1/audit/verify", path: "/api/v1/audit/verify", auth: "viewer", ok: 200},
	{route: "GET /api/v1/audit/stream", path: "/api/v1/audit/stream", auth: "admin", ok: 200, scope: "all"},
	{route: "PUT /api/v1/audit/stream", path: "/api/v1/audit/stream", body: `{"url":"https://siem.example/in","secret":"0123456789abcdef","enabled":false}`, auth: "admin", ok: 200, scope: "all"},
	{route: "GET /api/v1/users", path: "/api/v1/users", auth: "admin", ok: 200, scope: "all"},
	{route: "POST /api/v1/users", path: "/api/v1/users", body: `{"username":"u-{cred}","password":"password1","role":"viewer"}`, auth: "admin", ok: 201, scope: "all"},
	{route: "POST /api/v1/users/:id/disable", path: "/api/v1/users/{id:user:bob}/disable", auth: "admin", ok: 200, scope: "all"},
	{route: "POST /api/v1/users/:id/enable", path: "/api/v1/users/{id:user:carol}/enable", auth: "admin", ok: 200, scope: "all"},
	{route: "PUT /api/v1/users/:id/role", path: "/api/v1/users/{id:user:dave}/role", body: `{"role":"editor"}`, auth: "admin", ok: 200, scope: "all"},
	{route: "PUT /api/v1/users/:id/domains", path: "/api/v1/users/{id:user:dave}/domains", body: `{"domains":["api"]}`, auth: "admin", ok: 200, scope: "all"},
	{route: "PUT /api/v1/users/:id/password", path: "/api/v1/users/{id:user:erin}/password", body: `{"password":"password9"}`, auth: "admin", ok: 200, scope: "all"},
	{route: "GET /api/v1/users/:id/sessions", path: "/api/v1/users/{id:user:bob}/sessions", auth: "admin", ok: 200, scope: "all"},
	{route: "DELETE /api/v1/users/:id/sessions", path: "/api/v1/users/{id:user:bob}/sessions", auth: "admin", ok: 200, scope: "all"},
	// No such session: an allowed caller is told so.
	{route: "DELETE /api/v1/users/:id/sessions/:sid", path: "/api/v1/users/{id:user:bob}/sessions/999999", auth: "admin", ok: 404, scope: "all"},
	{route: "GET /api/v1/tokens", path: "/api/v1/tokens", auth: "admin", ok: 200},
	{route: "POST /api/v1/tokens", path: "/api/v1/tokens", body: `{"name":"t-{cred}","role":"viewer"}`, auth: "admin", ok: 201},
	{route: "POST /api/v1/tokens/:id/disable", path: "/api/v1/tokens/{id:token:victim1}/disable", auth: "admin", ok: 200, scope: "all"},
	{route: "POST /api/v1/tokens/:id/rotate", path: "/api/v1/tokens/{id:token:victim2}/rotate", auth: "admin", ok: 200, scope: "all"},
	{route: "PUT /api/v1/tokens/:id/owner", path: "/api/v1/tokens/{id:token:victim2}/owner", body: `{"owner":"admin2"}`, auth: "admin", ok: 200, scope: "all"},
	{route: "GET /api/v1/nodes", path: "/api/v1/nodes", auth: "viewer", ok: 200},
	// A plain GET is not a websocket handshake: the node is let in and told so.
	{route: "GET /api/v1/nodes/stream", path: "/api/v1/nodes/stream", auth: "node", ok: 426},
	{route: "GET /api/v1/stats/totals", path: "/api/v1/stats/totals?domain=api", auth: "viewer", ok: 200},
	{route: "GET /api/v1/stats/live", path: "/api/v1/stats/live?domain=api", auth: "viewer", ok: 200},
	{route: "GET /api/v1/stats/history", path: "/api/v1/stats/history?domain=api&step=300", auth: "viewer", ok: 200},
	{route: "GET /api/v1/stats/values", path: "/api/v1/stats/values?domain=api&value=k1", auth: "viewer", ok: 200},
	{route: "GET /api/v1/stats/values/recent", path: "/api/v1/stats/values/recent?domain=api&prefix=k", auth: "viewer", ok: 200},
	{route: "GET /api/v1/stats/domains", path: "/api/v1/stats/domains", auth: "viewer", ok: 200},
	{route: "GET /api/v1/stats/settings", path: "/api/v1/stats/settings", auth: "viewer", ok: 200},
	{route: "GET /api/v1/quotas", path: "/api/v1/quotas?period=2026-12", auth: "viewer", ok: 200},
	{route: "GET /api/v1/stats/stream", path: "/api/v1/stats/stream", auth: "viewer", ok: 426},
	{route: "POST /api/v1/inspect", path: "/api/v1/inspect",
		body: `{"domain":"api","descriptors":[{"entries":[{"key":"api_key","value":"{cred}"}]}]}`, auth: "viewer", ok: 200},
	{route: "POST /api/v1/inspect/reset", path: "/api/v1/inspect/reset",
		body: `{"domain":"api","descriptors":[{"entries":[{"key":"api_key","value":"{cred}"}]}],"message":"m"}`, auth: "support", ok: 200, scope: "domain"},
	{route: "GET /api/v1/alerts", path: "/api/v1/alerts", auth: "admin", ok: 200, scope: "all"},
	{route: "PUT /api/v1/alerts", path: "/api/v1/alerts", body: `{"webhooks":[],"spike_defaults":{"floor_per_s":5,"factor":5,"for_s":3},"domains":{"api":{"mask_values":true}}}`, auth: "admin", ok: 200, scope: "all"},
	// No webhook is configured: nothing to test.
	{route: "POST /api/v1/alerts/test", path: "/api/v1/alerts/test", auth: "admin", ok: 409, scope: "all"},
	{route: "GET /api/v1/overrides", path: "/api/v1/overrides?domain=api", auth: "viewer", ok: 200},
	{route: "POST /api/v1/overrides", path: "/api/v1/overrides",
		body: `{"domain":"api","entries":[{"key":"api_key","value":"ov-{cred}"}],"rate_limit":{"unit":"hour","requests_per_unit":8},"expires_at":"` +
			time.Now().Add(48*time.Hour).UTC().Format(time.RFC3339) + `","message":"ticket 42"}`,
		auth: "support", ok: 201, scope: "domain"},
	{route: "GET /api/v1/overrides/:id", path: "/api/v1/overrides/{id:override-editor}", auth: "viewer", ok: 200},
	{route: "DELETE /api/v1/overrides/:id", path: "/api/v1/overrides/{id:override-{cred}}", body: `{"message":"done"}`, auth: "support", ok: 200, scope: "domain"},
}

// seedScenarios creates what the scenarios act on.
func (f *fixture) seedScenarios(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	v1, err := f.store.Publish(ctx, store.Change{Domain: "api", YAML: validYAML, Message: "m", Actor: sys})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.Publish(ctx, store.Change{Domain: "api", YAML: domainYAML("api", 50), BaseVersion: v1, Message: "m", Actor: sys}); err != nil {
		t.Fatal(err)
	}
	for _, cred := range []string{"editor", "admin"} {
		name := "del-" + cred
		v, err := f.store.Publish(ctx, store.Change{Domain: name, YAML: domainYAML(name, 1), Message: "m", Actor: sys})
		if err != nil {
			t.Fatal(err)
		}
		f.ids[name] = v
	}
	if _, err := f.store.CreateUser(ctx, "probe", "probe-password", "viewer", sys); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"bob", "carol", "dave", "erin", "admin2"} {
		role := "viewer"
		if name == "admin2" {
			role = "admin"
		}
		u, err := f.store.CreateUser(ctx, name, "password1", role, sys)
		if err != nil {
			t.Fatal(err)
		}
		f.ids["user:"+name] = u.ID
	}
	if _, err := f.store.SetUserDisabled(ctx, f.ids["user:carol"], true, sys); err != nil {
		t.Fatal(err)
	}
	for _, who := range []string{"support", "editor", "admin", "ssupport", "seditor", "sadmin"} {
		id, _, err := f.store.CreateOverride(ctx, store.OverrideSpec{Domain: "api", Entries: []rules.Entry{{Key: "api_key", Value: "seed-" + who}},
			RateLimit: store.OverrideRate{Unit: "hour", RequestsPerUnit: 8}, ExpiresAt: time.Now().Add(time.Hour), Message: "m"}, sys)
		if err != nil {
			t.Fatal(err)
		}
		f.ids["override-"+who] = id
	}
	f.token(t, "victim1", "viewer", nil)
	f.token(t, "victim2", "viewer", nil)
	author := store.Actor{Name: "token:author#99", Owner: "user:someone"}
	for _, who := range []string{"editor", "admin", "seditor", "sadmin"} {
		for _, kind := range []string{"approve", "reject"} {
			name := kind + "-" + who
			cr, err := f.store.Propose(ctx, store.Change{Domain: name, YAML: domainYAML(name, 1), Message: "m", Actor: author})
			if err != nil {
				t.Fatal(err)
			}
			f.ids[name] = cr.ID
		}
	}
}

// TestRouteAccess probes every route with every credential.
func TestRouteAccess(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.seedScenarios(t)
	for _, s := range scenarios {
		method, _, _ := strings.Cut(s.route, " ")
		for _, cred := range credentials {
			path, body := f.expand(s.path, cred), f.expand(s.body, cred)
			f.clock.advance(time.Minute) // refills the sign-in throttle
			status, got := f.call(t, method, path, cred, body)
			if want := s.want(cred); status != want {
				t.Errorf("%s %s as %q = %d %s; want %d", method, path, cred, status, excerpt(got), want)
			}
			if status >= 400 && !strings.Contains(got, `"error":{`) && s.ok != 426 {
				t.Errorf("%s %s as %q: error body %s lacks the error envelope", method, path, cred, excerpt(got))
			}
		}
	}
	if status, body := f.call(t, "GET", "/api/v1/audit/verify", "viewer", ""); !strings.Contains(body, `"ok":true`) {
		t.Errorf("audit chain after the probes: %d %s", status, body)
	}
}

// excerpt shortens a response body for a failure message.
func excerpt(s string) string {
	if len(s) > 300 {
		return s[:300] + "..."
	}
	return s
}

// TestEveryRouteHasScenario fails when a route is added without a scenario
// in TestRouteAccess, or a scenario names a route that does not exist.
func TestEveryRouteHasScenario(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	have := map[string]bool{}
	for _, s := range scenarios {
		if have[s.route] {
			t.Errorf("two scenarios for %s", s.route)
		}
		have[s.route] = true
	}
	routes := map[string]bool{}
	for _, r := range f.api.Routes() {
		routes[r] = true
		if !have[r] {
			t.Errorf("route %s has no scenario in TestRouteAccess", r)
		}
	}
	for r := range have {
		if !routes[r] {
			t.Errorf("scenario for %s, which is not a route", r)
		}
	}
}

// TestOpenAPIMatchesRoutes fails when a route is missing from the OpenAPI
// document or the document lists one that does not exist.
func TestOpenAPIMatchesRoutes(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	var doc struct {
		OpenAPI string                                `json:"openapi"`
		Paths   map[string]map[string]json.RawMessage `json:"paths"`
	}
	f.decodeJSON(t, "GET", "/api/v1/openapi.json", "", "", 200, &doc)
	if !strings.HasPrefix(doc.OpenAPI, "3.") {
		t.Fatalf("openapi = %q, want 3.x", doc.OpenAPI)
	}
	param := regexp.MustCompile(`:(\w+)`)
	documented := map[string]bool{}
	for path, ops := range doc.Paths {
		for method, op := range ops {
			if method == "parameters" {
				continue
			}
			documented[strings.ToUpper(method)+" "+path] = true
			var o struct {
				Responses map[string]json.RawMessage `json:"responses"`
			}
			if err := json.Unmarshal(op, &o); err != nil || len(o.Responses) == 0 {
				t.Errorf("%s %s documents no responses", method, path)
			}
		}
	}
	routes := map[string]bool{}
	for _, r := range f.api.Routes() {
		r = param.ReplaceAllString(r, "{$1}")
		routes[r] = true
		if !documented[r] {
			t.Errorf("route %s is missing from openapi.yaml", r)
		}
	}
	var extra []string
	for r := range documented {
		if !routes[r] {
			extra = append(extra, r)
		}
	}
	sort.Strings(extra)
	for _, r := range extra {
		t.Errorf("openapi.yaml documents %s, which is not a route", r)
	}
}

// TestOpenAPIRefsResolve checks that every $ref in the document points at
// a component that exists.
func TestOpenAPIRefsResolve(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	_, body := f.call(t, "GET", "/api/v1/openapi.json", "", "")
	var doc map[string]any
	if err := json.Unmarshal([]byte(body), &doc); err != nil {
		t.Fatal(err)
	}
	var walk func(v any)
	walk = func(v any) {
		switch t2 := v.(type) {
		case map[string]any:
			for k, c := range t2 {
				if k == "$ref" {
					ref, _ := c.(string)
					var node any = doc
					for _, part := range strings.Split(strings.TrimPrefix(ref, "#/"), "/") {
						m, _ := node.(map[string]any)
						node = m[part]
					}
					if node == nil {
						t.Errorf("$ref %q does not resolve", ref)
					}
				}
				walk(c)
			}
		case []any:
			for _, c := range t2 {
				walk(c)
			}
		}
	}
	walk(doc)
}

// TestRenamedFieldFailsTheSpecCheck takes real answers and renames one
// field in each, as a handler that drifted from openapi.yaml would: the
// check every test's answers go through (apicheck.Handler) refuses them.
func TestRenamedFieldFailsTheSpecCheck(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.seedScenarios(t)
	spec, err := apicheck.Console()
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ path, field, renamed string }{
		{"/api/v1/versions", `"created_at"`, `"created"`},
		{"/api/v1/domains/api", `"current_version"`, `"currentVersion"`},
		{"/api/v1/audit/verify", `"events"`, `"count"`},
		{"/api/v1/versions/1/diff/2", `"unified"`, `"patch"`},
	} {
		resp := f.do(t, "GET", tt.path, "viewer", "", nil)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err := spec.Check(resp.Request, resp.StatusCode, resp.Header, body); err != nil {
			t.Fatalf("GET %s as answered: %v", tt.path, err)
		}
		if !strings.Contains(string(body), tt.field) {
			t.Fatalf("GET %s: no %s in %s", tt.path, tt.field, excerpt(string(body)))
		}
		drifted := strings.Replace(string(body), tt.field, tt.renamed, 1)
		err := spec.Check(resp.Request, resp.StatusCode, resp.Header, []byte(drifted))
		if err == nil || !strings.Contains(err.Error(), strings.Trim(tt.renamed, `"`)) {
			t.Errorf("GET %s with %s renamed %s: %v, want an error naming it", tt.path, tt.field, tt.renamed, err)
		}
	}
}
