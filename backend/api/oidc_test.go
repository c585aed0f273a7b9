package api_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/sluicehq/sluice/backend/api"
	"github.com/sluicehq/sluice/backend/hub"
	"github.com/sluicehq/sluice/backend/sso"
	"github.com/sluicehq/sluice/backend/stats"
	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/internal/oidcop"
	"github.com/sluicehq/sluice/internal/testenv"
)

const (
	testClientID     = "sluice-console"
	testClientSecret = "console-secret"
	testRoleMap      = "sre=admin; team-api=editor:api,search; staff=viewer"
	callbackPath     = "/api/v1/auth/oidc/callback"
)

var providerUsers = []oidcop.User{
	{Subject: "sub-bob", Username: "bob", Password: "bob-pw", Email: "bob@example.com", Groups: []string{"team-api", "staff"}},
	{Subject: "sub-carol", Username: "carol", Password: "carol-pw", Groups: []string{"sre"}},
	{Subject: "sub-dan", Username: "dan", Password: "dan-pw", Groups: []string{"contractors"}},
	// Shares a username with the local user alice of every fixture.
	{Subject: "sub-alice", Username: "alice", Password: "alice-pw", Groups: []string{"staff"}},
}

// ssoFixture is a console with single sign-on against a real provider
// process (zitadel's OP over HTTP on 127.0.0.1), passwords limited to the
// break-glass user admin.
type ssoFixture struct {
	*fixture
	op     *oidcop.Server
	opAddr string
}

// newSSOFixture starts the console; with providerDown the issuer's address
// has nothing listening until startProvider.
func newSSOFixture(t *testing.T, providerDown bool) *ssoFixture {
	t.Helper()
	ctx := context.Background()
	dbURL := testenv.PostgresURL(t)
	st, err := store.Open(ctx, dbURL, store.PasswordCost(bcrypt.MinCost))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	srv := httptest.NewUnstartedServer(nil)
	t.Cleanup(srv.Close)
	consoleURL := "http://" + srv.Listener.Addr().String()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sf := &ssoFixture{opAddr: ln.Addr().String()}
	ln.Close() // the provider takes the address over (now, or later when down)
	m, err := sso.ParseRoleMap(testRoleMap)
	if err != nil {
		t.Fatal(err)
	}
	idp, err := sso.New(sso.Config{Issuer: "http://" + sf.opAddr, ClientID: testClientID, ClientSecret: testClientSecret,
		RedirectURL: consoleURL + callbackPath, RoleMap: m})
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(testWriter{t}, nil))
	clk := &clock{t: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	a := api.New(api.Config{Store: st, Hub: hub.New(st, log), Stats: stats.New(stats.Config{Store: st, Log: log}), Log: log,
		LoginThrottle: api.NewTestThrottle(clk.now), SSO: idp,
		PasswordLogin: api.PasswordLoginBreakGlass, BreakGlassUsers: []string{"admin"}})
	srv.Config.Handler = a
	srv.Start()
	sf.fixture = &fixture{api: a, url: dbURL, srv: srv, store: st, clock: clk, tokens: map[string]string{}, ids: map[string]int64{}}
	sf.token(t, "admin", "admin", nil)
	for _, u := range []struct{ name, role string }{{"admin", "admin"}, {"alice", "editor"}} {
		if _, err := st.CreateUser(ctx, u.name, "correct horse", u.role, sys); err != nil {
			t.Fatal(err)
		}
	}
	if !providerDown {
		sf.startProvider(t)
	}
	return sf
}

func (sf *ssoFixture) startProvider(t *testing.T) {
	t.Helper()
	op, err := oidcop.Start(sf.opAddr, []oidcop.Client{{ID: testClientID, Secret: testClientSecret,
		RedirectURIs: []string{sf.srv.URL + callbackPath}}}, providerUsers)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { op.Close() })
	sf.op = op
}

// ssoBrowser is a cookie-keeping client that follows redirects by hand.
type ssoBrowser struct {
	t      *testing.T
	sf     *ssoFixture
	jar    *cookiejar.Jar
	client *http.Client
}

func (sf *ssoFixture) browser(t *testing.T) *ssoBrowser {
	jar, _ := cookiejar.New(nil)
	return &ssoBrowser{t: t, sf: sf, jar: jar, client: &http.Client{Jar: jar, Timeout: 20 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

// page is an answer's status, final URL, Location and body.
type page struct {
	status   int
	url      *url.URL
	location string
	body     string
}

func (b *ssoBrowser) send(method, target string, form url.Values) page {
	b.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, target, body)
	if err != nil {
		b.t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	resp, err := b.client.Do(req)
	if err != nil {
		b.t.Fatalf("%s %s: %v", method, target, err)
	}
	defer resp.Body.Close()
	got, _ := io.ReadAll(resp.Body)
	return page{status: resp.StatusCode, url: req.URL, location: resp.Header.Get("Location"), body: string(got)}
}

// follow sends the request and follows redirects until an answer that is
// not one, or until the next stop would be the console's callback, whose
// URL it returns unvisited.
func (b *ssoBrowser) follow(method, target string, form url.Values) (page, string) {
	b.t.Helper()
	for range 10 {
		p := b.send(method, target, form)
		if p.status < 300 || p.status >= 400 {
			return p, ""
		}
		next, err := p.url.Parse(p.location)
		if err != nil {
			b.t.Fatal(err)
		}
		if next.Path == callbackPath && next.Host == strings.TrimPrefix(b.sf.srv.URL, "http://") {
			return p, next.String()
		}
		method, target, form = "GET", next.String(), nil
	}
	b.t.Fatalf("too many redirects from %s", target)
	return page{}, ""
}

// start begins a sign-in and returns the provider's login page.
func (b *ssoBrowser) start(returnTo string) page {
	b.t.Helper()
	target := b.sf.srv.URL + "/api/v1/auth/oidc/login"
	if returnTo != "" {
		target += "?return_to=" + url.QueryEscape(returnTo)
	}
	p, _ := b.follow("GET", target, nil)
	return p
}

// toCallback signs in at the provider as username and returns the
// callback URL the provider sends the browser to (not yet visited).
func (b *ssoBrowser) toCallback(username, password, returnTo string) string {
	b.t.Helper()
	login := b.start(returnTo)
	if login.status != 200 || !strings.Contains(login.body, "Test identity provider") {
		b.t.Fatalf("provider login page: %d %s", login.status, excerpt(login.body))
	}
	form := url.Values{"id": {login.url.Query().Get("authRequestID")}, "username": {username}, "password": {password}}
	p, callback := b.follow("POST", b.sf.op.Issuer+"/login", form)
	if callback == "" {
		b.t.Fatalf("provider did not redirect to the console: %d %s", p.status, excerpt(p.body))
	}
	return callback
}

// signIn completes a sign-in as username and returns the callback's answer.
func (b *ssoBrowser) signIn(username, password string) page {
	b.t.Helper()
	return b.send("GET", b.toCallback(username, password, ""), nil)
}

func (b *ssoBrowser) me() (int, map[string]any) {
	b.t.Helper()
	p := b.send("GET", b.sf.srv.URL+"/api/v1/me", nil)
	var out map[string]any
	json.Unmarshal([]byte(p.body), &out)
	return p.status, out
}

func (b *ssoBrowser) cookie(name string) string {
	u, _ := url.Parse(b.sf.srv.URL)
	for _, c := range b.jar.Cookies(u) {
		if c.Name == name {
			return c.Value
		}
	}
	return ""
}

// grants reads a user's role and domains from the database.
func (sf *ssoFixture) grants(t *testing.T, username string) (id int64, role string, domains []string, issuer, subject string) {
	t.Helper()
	users, err := sf.store.ListUsers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range users {
		if u.Username == username {
			role, domains, issuer, subject, err := sf.store.UserGrants(context.Background(), u.ID)
			if err != nil {
				t.Fatal(err)
			}
			return u.ID, role, domains, issuer, subject
		}
	}
	t.Fatalf("no user %q", username)
	return 0, "", nil, "", ""
}

func TestOIDCSignIn(t *testing.T) {
	t.Parallel()
	sf := newSSOFixture(t, false)
	b := sf.browser(t)
	callback := b.toCallback("bob", "bob-pw", "/domains/api")
	state := b.cookie("sluice_oidc_state")
	if state == "" {
		t.Fatal("no state cookie during the sign-in")
	}
	p := b.send("GET", callback, nil)
	if p.status != http.StatusSeeOther || p.location != "/domains/api" {
		t.Fatalf("callback = %d Location %q %s; want 303 to /domains/api", p.status, p.location, excerpt(p.body))
	}
	if b.cookie("sluice_session") == "" || b.cookie("sluice_oidc_state") != "" {
		t.Errorf("after the callback: session cookie %q, state cookie %q; want a session and no state", b.cookie("sluice_session"), b.cookie("sluice_oidc_state"))
	}
	status, me := b.me()
	if status != 200 || me["username"] != "bob" || me["role"] != "editor" || me["csrf_token"] == "" {
		t.Fatalf("GET /me = %d %v; want bob, editor, with a CSRF token", status, me)
	}
	_, role, domains, issuer, subject := sf.grants(t, "bob")
	if role != "editor" || !slices.Equal(domains, []string{"api", "search"}) || issuer != sf.op.Issuer || subject != "sub-bob" {
		t.Errorf("bob = %s %v %s %s; want editor [api search] linked to %s sub-bob", role, domains, issuer, subject, sf.op.Issuer)
	}
	// The session works for writes like a password session: the CSRF token
	// from /me is required.
	csrf, _ := me["csrf_token"].(string)
	req, _ := http.NewRequest("POST", sf.srv.URL+"/api/v1/auth/logout", nil)
	if resp, err := b.client.Do(req); err != nil || resp.StatusCode != http.StatusForbidden {
		t.Errorf("logout without CSRF: %v %v; want 403", resp.StatusCode, err)
	}
	req, _ = http.NewRequest("POST", sf.srv.URL+"/api/v1/auth/logout", nil)
	req.Header.Set("X-CSRF-Token", csrf)
	if resp, err := b.client.Do(req); err != nil || resp.StatusCode != http.StatusNoContent {
		t.Errorf("logout with CSRF: %v %v; want 204", resp.StatusCode, err)
	}

	_, audit := sf.call(t, "GET", "/api/v1/audit?action=auth.login", "admin", "")
	if !strings.Contains(audit, `"method":"oidc"`) || !strings.Contains(audit, `"target":"user:bob"`) {
		t.Errorf("audit has no oidc sign-in of bob: %s", excerpt(audit))
	}
	_, audit = sf.call(t, "GET", "/api/v1/audit?action=user.create", "admin", "")
	if !strings.Contains(audit, `"oidc_subject":"sub-bob"`) {
		t.Errorf("audit has no creation of bob: %s", excerpt(audit))
	}

	// The same callback again, cookie and all (a replay by someone who
	// captured both): the flow was used up.
	replay, _ := http.NewRequest("GET", callback, nil)
	replay.AddCookie(&http.Cookie{Name: "sluice_oidc_state", Value: state})
	resp, err := b.client.Do(replay)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "already completed") || resp.Header.Get("Set-Cookie") != "" && strings.Contains(resp.Header.Get("Set-Cookie"), "sluice_session=") {
		t.Errorf("replayed callback = %d %s; want 400 already completed, no session", resp.StatusCode, excerpt(string(body)))
	}
	// A callback without the browser's state cookie (login CSRF: someone
	// else's code and state sent to this browser) is refused.
	other := sf.browser(t)
	callback = b.toCallback("carol", "carol-pw", "")
	if p := other.send("GET", callback, nil); p.status != http.StatusBadRequest || !strings.Contains(p.body, "not started in this browser") {
		t.Errorf("callback in another browser = %d %s; want 400", p.status, excerpt(p.body))
	}
}

func TestOIDCRefusesBadIDTokens(t *testing.T) {
	t.Parallel()
	sf := newSSOFixture(t, false)
	// A genuine sign-in first: its ID token is the one replayed below.
	if p := sf.browser(t).signIn("bob", "bob-pw"); p.status != http.StatusSeeOther {
		t.Fatalf("genuine sign-in = %d %s", p.status, excerpt(p.body))
	}
	for _, tc := range []struct {
		name   string
		faults oidcop.Faults
		want   string
	}{
		{"forged", oidcop.Faults{WrongKey: true}, "signature"},
		{"expired", oidcop.Faults{IDTokenLifetime: -time.Minute}, "expired"},
		{"wrong audience", oidcop.Faults{Audience: "another-app"}, "audience"},
		{"shared audience, another authorized party", oidcop.Faults{Audience: "another-app", SharedAudience: true}, "authorized party"},
		{"replayed", oidcop.Faults{ReplayIDToken: true}, "nonce"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sf.op.SetFaults(tc.faults)
			defer sf.op.SetFaults(oidcop.Faults{})
			b := sf.browser(t)
			p := b.signIn("carol", "carol-pw")
			if p.status != http.StatusUnauthorized || !strings.Contains(p.body, "Sign-in refused") || !strings.Contains(p.body, tc.want) {
				t.Errorf("callback = %d %s; want 401 naming %q", p.status, excerpt(p.body), tc.want)
			}
			if status, _ := b.me(); status != http.StatusUnauthorized {
				t.Errorf("GET /me after a refused sign-in = %d; want 401", status)
			}
		})
	}
	// None of it made carol a user.
	users, _ := sf.store.ListUsers(context.Background())
	for _, u := range users {
		if u.Username == "carol" {
			t.Errorf("a refused ID token created user carol")
		}
	}
}

func TestOIDCGroupChangeAppliesAtNextSignIn(t *testing.T) {
	t.Parallel()
	sf := newSSOFixture(t, false)
	if p := sf.browser(t).signIn("bob", "bob-pw"); p.status != http.StatusSeeOther {
		t.Fatalf("sign-in = %d %s", p.status, excerpt(p.body))
	}
	id1, role, _, _, _ := sf.grants(t, "bob")
	if role != "editor" {
		t.Fatalf("bob = %s; want editor", role)
	}
	if err := sf.op.SetGroups("bob", []string{"sre"}); err != nil {
		t.Fatal(err)
	}
	b := sf.browser(t)
	if p := b.signIn("bob", "bob-pw"); p.status != http.StatusSeeOther {
		t.Fatalf("second sign-in = %d %s", p.status, excerpt(p.body))
	}
	id2, role, domains, _, _ := sf.grants(t, "bob")
	if id2 != id1 || role != "admin" || len(domains) != 0 {
		t.Errorf("bob after moving to sre = user %d %s %v; want user %d admin on every domain", id2, role, domains, id1)
	}
	if _, me := b.me(); me["role"] != "admin" {
		t.Errorf("GET /me = %v; want admin", me)
	}
	_, audit := sf.call(t, "GET", "/api/v1/audit?action=user.role", "admin", "")
	if !strings.Contains(audit, `"role":"admin"`) || !strings.Contains(audit, `"role":"editor"`) {
		t.Errorf("audit has no grant change: %s", excerpt(audit))
	}
	// Out of every mapped group: refused, with the groups named.
	if err := sf.op.SetGroups("bob", []string{"contractors"}); err != nil {
		t.Fatal(err)
	}
	p := sf.browser(t).signIn("bob", "bob-pw")
	if p.status != http.StatusForbidden || !strings.Contains(p.body, "none of your groups (contractors)") {
		t.Errorf("sign-in with no mapped group = %d %s; want 403 naming the groups", p.status, excerpt(p.body))
	}
	// A user an admin disabled stays out.
	if _, err := sf.store.SetUserDisabled(context.Background(), id1, true, sys); err != nil {
		t.Fatal(err)
	}
	sf.op.SetGroups("bob", []string{"staff"})
	if p := sf.browser(t).signIn("bob", "bob-pw"); p.status != http.StatusForbidden || !strings.Contains(p.body, "disabled") {
		t.Errorf("disabled user's sign-in = %d %s; want 403 disabled", p.status, excerpt(p.body))
	}
}

func TestOIDCNewUsers(t *testing.T) {
	t.Parallel()
	sf := newSSOFixture(t, false)
	// dan's only group has no role: no user is made.
	if p := sf.browser(t).signIn("dan", "dan-pw"); p.status != http.StatusForbidden || !strings.Contains(p.body, "No access to Sluice") {
		t.Errorf("dan = %d %s; want 403 no access", p.status, excerpt(p.body))
	}
	// The provider's alice is not the local alice: she gets her own user.
	b := sf.browser(t)
	if p := b.signIn("alice", "alice-pw"); p.status != http.StatusSeeOther {
		t.Fatalf("alice = %d %s", p.status, excerpt(p.body))
	}
	if _, me := b.me(); me["username"] != "alice-2" || me["role"] != "viewer" {
		t.Errorf("provider's alice signed in as %v; want alice-2, viewer", me)
	}
	if _, role, _, issuer, _ := sf.grants(t, "alice"); role != "editor" || issuer != "" {
		t.Errorf("local alice = %s linked to %q; want editor, unlinked", role, issuer)
	}
	users, _ := sf.store.ListUsers(context.Background())
	for _, u := range users {
		if u.Username == "dan" {
			t.Error("a person with no role got a user")
		}
	}
	// A return_to off this console lands on /.
	b = sf.browser(t)
	if p := b.send("GET", b.toCallback("bob", "bob-pw", "//evil.example/x"), nil); p.location != "/" {
		t.Errorf("return_to //evil.example/x landed on %q; want /", p.location)
	}
}

func TestOIDCProviderDown(t *testing.T) {
	t.Parallel()
	sf := newSSOFixture(t, true)
	b := sf.browser(t)
	p := b.start("")
	if p.status != http.StatusBadGateway || !strings.Contains(p.body, "identity provider is unavailable") || !strings.Contains(p.body, "break-glass") {
		t.Fatalf("SSO with the provider down = %d %s; want 502 explaining", p.status, excerpt(p.body))
	}
	if !strings.HasPrefix(p.body, "<!doctype html>") {
		t.Errorf("the error is not a page: %s", excerpt(p.body))
	}
	// Break-glass: admin signs in with a password; nobody else does.
	if status, body := sf.call(t, "GET", "/api/v1/auth/methods", "", ""); status != 200 || body != `{"oidc":true,"password":"break-glass"}` {
		t.Errorf("GET /auth/methods = %d %s", status, body)
	}
	pw := sf.fixture.browser(t)
	if status, body := pw.login("admin", "correct horse"); status != 200 {
		t.Errorf("break-glass admin sign-in = %d %s; want 200", status, body)
	}
	if status, body := pw.login("alice", "correct horse"); status != http.StatusForbidden || !strings.Contains(body, "sign in with SSO") {
		t.Errorf("alice's password sign-in = %d %s; want 403", status, body)
	}
	// The provider comes up: the next sign-in discovers it.
	sf.startProvider(t)
	if p := b.signIn("bob", "bob-pw"); p.status != http.StatusSeeOther {
		t.Fatalf("sign-in once the provider is up = %d %s", p.status, excerpt(p.body))
	}
	// The provider goes down between its login page and the callback: the
	// code cannot be redeemed.
	callback := b.toCallback("bob", "bob-pw", "")
	sf.op.Close()
	p = b.send("GET", callback, nil)
	if p.status != http.StatusBadGateway || !strings.Contains(p.body, "identity provider is unavailable") {
		t.Errorf("callback with the provider down = %d %s; want 502", p.status, excerpt(p.body))
	}
	// Down after the console has known it: the next sign-in is told so
	// rather than sent to a dead address.
	if p := b.start(""); p.status != http.StatusBadGateway || !strings.Contains(p.body, "identity provider is unavailable") {
		t.Errorf("SSO with the provider down again = %d %s; want 502", p.status, excerpt(p.body))
	}
}

func TestReturnPath(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"":                     "/",
		"/":                    "/",
		"/domains/api?x=1":     "/domains/api?x=1",
		"//evil.example":       "/",
		"/\\evil.example":      "/",
		"https://evil.example": "/",
		"domains":              "/",
		"/a\r\nSet-Cookie:x":   "/",
	} {
		if got := api.ReturnPath(in); got != want {
			t.Errorf("returnPath(%q) = %q; want %q", in, got, want)
		}
	}
}

// testWriter sends the console's log to the test's, shown when it fails.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}
