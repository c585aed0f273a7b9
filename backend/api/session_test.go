package api_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"strconv"
	"strings"
	"testing"
	"time"
)

// browser is a cookie-keeping client signed in (or not) as one user.
type browser struct {
	t      *testing.T
	f      *fixture
	client *http.Client
	csrf   string
}

func (f *fixture) browser(t *testing.T) *browser {
	jar, _ := cookiejar.New(nil)
	return &browser{t: t, f: f, client: &http.Client{Jar: jar}}
}

func (b *browser) do(method, path, body string) (int, string) {
	b.t.Helper()
	req, _ := http.NewRequest(method, b.f.srv.URL+path, strings.NewReader(body))
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if b.csrf != "" {
		req.Header.Set("X-CSRF-Token", b.csrf)
	}
	resp, err := b.client.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	got, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(got)
}

func (b *browser) login(username, password string) (int, string) {
	b.t.Helper()
	status, body := b.do("POST", "/api/v1/auth/login", `{"username":`+jsonString(username)+`,"password":`+jsonString(password)+`}`)
	if status == 200 {
		var out struct {
			CSRFToken string `json:"csrf_token"`
		}
		json.Unmarshal([]byte(body), &out)
		b.csrf = out.CSRFToken
	}
	return status, body
}

func TestSessions(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	b := f.browser(t)
	// Wrong password and unknown user get the same answer.
	for _, creds := range [][2]string{{"alice", "wrong"}, {"nobody", "wrong"}} {
		if status, body := b.login(creds[0], creds[1]); status != 401 || !strings.Contains(body, "invalid username or password") {
			t.Fatalf("login %v: %d %s", creds, status, body)
		}
	}
	resp := f.do(t, "POST", "/api/v1/auth/login", "", `{"username":"alice","password":"correct horse"}`, nil)
	resp.Body.Close()
	cookie := resp.Header.Get("Set-Cookie")
	for _, attr := range []string{"sluice_session=", "HttpOnly", "SameSite=Strict", "Path=/"} {
		if !strings.Contains(cookie, attr) {
			t.Errorf("session cookie %q lacks %s", cookie, attr)
		}
	}
	if status, body := b.login("alice", "correct horse"); status != 200 || b.csrf == "" {
		t.Fatalf("login: %d %s", status, body)
	}
	if status, body := b.do("GET", "/api/v1/me", ""); status != 200 || !strings.Contains(body, `"username":"alice"`) {
		t.Fatalf("me: %d %s", status, body)
	}
	csrf := b.csrf
	publish := publishBody("api", 100, 0, "m")
	for _, bad := range []string{"", "wrong"} {
		b.csrf = bad
		if status, body := b.do("PUT", "/api/v1/domains/api", publish); status != 403 || !strings.Contains(body, "csrf") {
			t.Fatalf("write with CSRF %q: %d %s", bad, status, body)
		}
	}
	b.csrf = csrf
	if status, body := b.do("PUT", "/api/v1/domains/api", publish); status != 200 {
		t.Fatalf("write with CSRF: %d %s", status, body)
	}
	if _, body := b.do("GET", "/api/v1/versions", ""); !strings.Contains(body, `"author":"user:alice"`) {
		t.Fatalf("versions: %s", body)
	}

	// Changing one's own password keeps this session and ends the others.
	other := f.browser(t)
	other.login("alice", "correct horse")
	if status, body := b.do("PUT", "/api/v1/me/password", `{"current_password":"nope","new_password":"battery staple"}`); status != 403 {
		t.Fatalf("password change with a wrong current password: %d %s", status, body)
	}
	if status, body := b.do("PUT", "/api/v1/me/password", `{"current_password":"correct horse","new_password":"short"}`); status != 400 {
		t.Fatalf("password change to a short password: %d %s", status, body)
	}
	if status, body := b.do("PUT", "/api/v1/me/password", `{"current_password":"correct horse","new_password":"battery staple"}`); status != 204 {
		t.Fatalf("password change: %d %s", status, body)
	}
	if status, _ := b.do("GET", "/api/v1/me", ""); status != 200 {
		t.Fatalf("the session that changed the password: %d", status)
	}
	if status, _ := other.do("GET", "/api/v1/me", ""); status != 401 {
		t.Fatalf("another session after a password change: %d, want 401", status)
	}

	if status, _ := b.do("POST", "/api/v1/auth/logout", ""); status != 204 {
		t.Fatalf("logout: %d", status)
	}
	if status, _ := b.do("GET", "/api/v1/me", ""); status != 401 {
		t.Fatalf("me after logout: %d", status)
	}
	_, body := f.call(t, "GET", "/api/v1/audit?limit=1000", "viewer", "")
	for _, action := range []string{"auth.login_failed", "auth.login", "domain.publish", "user.password_change", "auth.logout"} {
		if !strings.Contains(body, `"action":"`+action+`"`) {
			t.Errorf("audit lacks %s", action)
		}
	}
	// The name tried may be a password typed into the wrong
	// field; an unknown user's failure is only counted in a metric.
	if strings.Contains(body, "nobody") {
		t.Error("the failed login of an unknown user is audited with the name tried")
	}
}

// TestDisabledStopsAtOnce: disabling a user ends their sessions on the next
// request; disabling or rotating a token stops the old secret on the next
// request; an expired token never works.
func TestDisabledStopsAtOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	b := f.browser(t)
	if status, _ := b.login("alice", "correct horse"); status != 200 {
		t.Fatal("login")
	}
	var users struct {
		Users []struct {
			ID       int64  `json:"id"`
			Username string `json:"username"`
		} `json:"users"`
	}
	f.decodeJSON(t, "GET", "/api/v1/users", "admin", "", 200, &users)
	var alice int64
	for _, u := range users.Users {
		if u.Username == "alice" {
			alice = u.ID
		}
	}
	f.decodeJSON(t, "POST", "/api/v1/users/"+strconv.FormatInt(alice, 10)+"/disable", "admin", "", 200, nil)
	if status, _ := b.do("GET", "/api/v1/me", ""); status != 401 {
		t.Fatalf("disabled user's session: %d, want 401", status)
	}
	if status, body := b.login("alice", "correct horse"); status != 401 || !strings.Contains(body, "invalid username or password") {
		t.Fatalf("disabled user signs in: %d %s", status, body)
	}

	f.token(t, "ci", "editor", nil)
	id := strconv.FormatInt(f.ids["token:ci"], 10)
	var rotated struct {
		Token string `json:"token"`
		Last4 string `json:"last4"`
	}
	f.decodeJSON(t, "POST", "/api/v1/tokens/"+id+"/rotate", "admin", "", 200, &rotated)
	if status, _ := f.call(t, "GET", "/api/v1/ruleset", "ci", ""); status != 401 {
		t.Fatalf("old secret after rotation: %d, want 401", status)
	}
	if !strings.HasSuffix(rotated.Token, rotated.Last4) {
		t.Fatalf("rotate answer %+v", rotated)
	}
	f.tokens["ci"] = rotated.Token
	if status, _ := f.call(t, "GET", "/api/v1/ruleset", "ci", ""); status != 200 {
		t.Fatalf("new secret after rotation: %d", status)
	}
	var listed struct {
		Tokens []map[string]any `json:"tokens"`
	}
	f.decodeJSON(t, "GET", "/api/v1/tokens", "admin", "", 200, &listed)
	for _, tok := range listed.Tokens {
		if _, ok := tok["token"]; ok {
			t.Fatalf("token list shows a secret: %v", tok)
		}
	}
	f.decodeJSON(t, "POST", "/api/v1/tokens/"+id+"/disable", "admin", "", 200, nil)
	if status, _ := f.call(t, "GET", "/api/v1/ruleset", "ci", ""); status != 401 {
		t.Fatalf("disabled token: %d, want 401", status)
	}
	if status, body := f.call(t, "POST", "/api/v1/tokens/"+id+"/rotate", "admin", ""); status != 409 {
		t.Fatalf("rotate a disabled token: %d %s, want 409", status, body)
	}

	// A token that expires while in use stops at its expiry.
	var short struct {
		ID    int64  `json:"id"`
		Token string `json:"token"`
	}
	f.decodeJSON(t, "POST", "/api/v1/tokens", "admin", `{"name":"short","role":"viewer","expires_in":"1h"}`, 201, &short)
	f.tokens["short"] = short.Token
	if status, _ := f.call(t, "GET", "/api/v1/ruleset", "short", ""); status != 200 {
		t.Fatalf("fresh token: %d", status)
	}
	expireToken(t, f, short.ID)
	if status, _ := f.call(t, "GET", "/api/v1/ruleset", "short", ""); status != 401 {
		t.Fatalf("expired token: %d, want 401", status)
	}
}

func TestLastAdminAndUserErrors(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	var me struct {
		ID int64 `json:"id"`
	}
	f.decodeJSON(t, "POST", "/api/v1/users", "admin", `{"username":"root","password":"password1","role":"admin"}`, 201, &me)
	id := strconv.FormatInt(me.ID, 10)
	if status, body := f.call(t, "POST", "/api/v1/users/"+id+"/disable", "admin", ""); status != 409 || !strings.Contains(body, "last enabled admin") {
		t.Fatalf("disable the last admin: %d %s", status, body)
	}
	if status, body := f.call(t, "PUT", "/api/v1/users/"+id+"/role", "admin", `{"role":"viewer"}`); status != 409 {
		t.Fatalf("demote the last admin: %d %s", status, body)
	}
	for _, c := range []struct{ body, want string }{
		{`{"username":"root","password":"password1","role":"admin"}`, "exists"},
		{`{"username":"a b","password":"password1","role":"viewer"}`, "usernames use"},
		{`{"username":"x","password":"short","role":"viewer"}`, "a password has"},
		{`{"username":"x","password":"password1","role":"node"}`, "role must be"},
		{`{"username":"x","password":"password1","role":"viewer","admin":true}`, `unknown field \"admin\"`},
	} {
		status, body := f.call(t, "POST", "/api/v1/users", "admin", c.body)
		if status/100 != 4 || !strings.Contains(body, c.want) {
			t.Errorf("create user %s: %d %s; want 4xx with %q", c.body, status, body, c.want)
		}
	}
	if status, _ := f.call(t, "POST", "/api/v1/users/999/disable", "admin", ""); status != 404 {
		t.Errorf("disable unknown user: %d", status)
	}
}

// TestLoginThrottle: attempts are limited per username and per address,
// whatever the password, and the answer names neither.
func TestLoginThrottle(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	b := f.browser(t)
	for i := range 10 {
		if status, body := b.login("alice", "wrong"); status != 401 {
			t.Fatalf("attempt %d: %d %s", i+1, status, body)
		}
	}
	resp := f.do(t, "POST", "/api/v1/auth/login", "", `{"username":"alice","password":"correct horse"}`, nil)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" || strings.Contains(string(body), "alice") {
		t.Fatalf("11th attempt: %d Retry-After %q %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	// Another username from the same address still has its own allowance,
	// until the address's runs out (20 a minute).
	for i := range 10 {
		if status, body := b.login("user"+strconv.Itoa(i), "wrong"); status != 401 {
			t.Fatalf("other user %d: %d %s", i, status, body)
		}
	}
	if status, _ := b.login("someone-else", "wrong"); status != 429 {
		t.Fatalf("21st attempt from one address: %d, want 429", status)
	}
	f.clock.advance(time.Minute)
	if status, body := b.login("alice", "correct horse"); status != 200 {
		t.Fatalf("after a minute: %d %s", status, body)
	}
}
