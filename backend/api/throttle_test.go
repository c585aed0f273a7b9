package api_test

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend/api"
	"github.com/sluicehq/sluice/backend/hub"
	"github.com/sluicehq/sluice/backend/stats"
	"github.com/sluicehq/sluice/internal/apicheck"
)

// behindProxy serves f's database through a console that trusts the local
// proxy's X-Forwarded-For, so a test can sign in from any address. Its
// sign-in throttle runs on f's clock.
func behindProxy(t *testing.T, f *fixture) *httptest.Server {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	a := api.New(api.Config{Store: f.store, Hub: hub.New(f.store, log), Stats: stats.New(stats.Config{Store: f.store, Log: log}),
		Log: log, TrustedProxies: []string{"127.0.0.1", "::1"}, LoginThrottle: api.NewTestThrottle(f.clock.now)})
	srv := httptest.NewServer(apicheck.Handler(t, a))
	t.Cleanup(srv.Close)
	return srv
}

// loginFrom signs in as username from address ip and returns the status.
func loginFrom(t *testing.T, srv *httptest.Server, ip, username, password string) int {
	t.Helper()
	body := `{"username":` + jsonString(username) + `,"password":` + jsonString(password) + `}`
	req, err := http.NewRequest("POST", srv.URL+"/api/v1/auth/login", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Forwarded-For", ip)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode == http.StatusTooManyRequests && resp.Header.Get("Retry-After") == "" {
		t.Errorf("429 without Retry-After")
	}
	return resp.StatusCode
}

// TestWrongPasswordsElsewhereDoNotLockOut: wrong
// passwords for a user from one address keep that address out, not the
// user: the right password from another address gets in.
func TestWrongPasswordsElsewhereDoNotLockOut(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	srv := behindProxy(t, f)
	counts := map[int]int{}
	for range 50 {
		counts[loginFrom(t, srv, "203.0.113.7", "alice", "wrong")]++
	}
	if counts[401] != 10 || counts[429] != 40 {
		t.Errorf("50 wrong passwords from one address: %v, want 10×401 then 40×429", counts)
	}
	if got := loginFrom(t, srv, "203.0.113.7", "alice", "correct horse"); got != 429 {
		t.Errorf("the right password from the attacking address = %d, want 429", got)
	}
	if got := loginFrom(t, srv, "198.51.100.1", "alice", "correct horse"); got != 200 {
		t.Errorf("the right password from another address = %d, want 200", got)
	}
	// Per address, over every username: 20 a minute.
	for i := range 20 {
		if got := loginFrom(t, srv, "192.0.2.9", "user"+strconv.Itoa(i), "wrong"); got != 401 {
			t.Fatalf("attempt %d from a fresh address = %d, want 401", i+1, got)
		}
	}
	if got := loginFrom(t, srv, "192.0.2.9", "yet-another", "wrong"); got != 429 {
		t.Errorf("21st attempt from one address = %d, want 429", got)
	}
}

// TestLoginBrake: a guess spread over many addresses
// empties the username's brake (100 failures); then addresses that failed
// for the user are refused even with the right password and a refilled
// per-address allowance, while an address without failures still signs in.
func TestLoginBrake(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	srv := behindProxy(t, f)
	failed := 0
	for i := range 12 {
		for range 10 {
			if loginFrom(t, srv, "10.0.0."+strconv.Itoa(i), "alice", "wrong") == 401 {
				failed++
			}
		}
	}
	if failed < 100 || failed > 110 {
		t.Errorf("%d failures over 12 addresses, want the brake's 100 and at most one per address after it", failed)
	}
	f.clock.advance(time.Minute / 20) // each address's own allowance refills a little, the brake only 5 failures
	if got := loginFrom(t, srv, "10.0.0.1", "alice", "correct horse"); got != 429 {
		t.Errorf("the right password from an address that failed, brake empty = %d, want 429", got)
	}
	if got := loginFrom(t, srv, "198.51.100.1", "alice", "correct horse"); got != 200 {
		t.Errorf("the right password from an address without failures, brake empty = %d, want 200", got)
	}
	if got := loginFrom(t, srv, "10.0.0.1", "bob", "wrong"); got != 401 {
		t.Errorf("another username from that address = %d, want 401 (the brake is per username)", got)
	}
	f.clock.advance(failMemoryForTest)
	if got := loginFrom(t, srv, "10.0.0.1", "alice", "correct horse"); got != 200 {
		t.Errorf("after the failure memory and the brake refilled = %d, want 200", got)
	}
}

const failMemoryForTest = 15 * time.Minute

// TestFailedSignInAudit: a failed sign-in is audited
// only for a username that exists (a password typed into the username
// field never reaches the trail every viewer reads), and at most 20 an hour
// per user; the rest are counted in sluice_console_login_failures_total.
func TestFailedSignInAudit(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	srv := behindProxy(t, f)
	const typedSecret = "hunter2-Typed-Into-Username"
	if got := loginFrom(t, srv, "203.0.113.1", typedSecret, "wrong"); got != 401 {
		t.Fatalf("unknown user = %d, want 401", got)
	}
	for i := range 25 { // 10 per address, under the brake
		if got := loginFrom(t, srv, "203.0.113."+strconv.Itoa(10+i/10), "alice", "wrong"); got != 401 {
			t.Fatalf("alice attempt %d = %d, want 401", i+1, got)
		}
	}
	status, body := f.call(t, "GET", "/api/v1/audit?action=auth.login_failed&limit=1000", "viewer", "")
	if status != 200 {
		t.Fatalf("audit = %d %s", status, excerpt(body))
	}
	if strings.Contains(body, typedSecret) {
		t.Errorf("the audit trail holds the typed username %q", typedSecret)
	}
	if got := strings.Count(body, `"target":"user:alice"`); got != 20 {
		t.Errorf("%d failed sign-ins of alice audited, want 20 (the hourly budget)", got)
	}
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`sluice_console_login_failures_total{outcome="audited"} 20`,
		`sluice_console_login_failures_total{outcome="over_budget"} 5`,
		`sluice_console_login_failures_total{outcome="unknown_user"} 1`,
	} {
		if !strings.Contains(string(metrics), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	f.clock.advance(time.Hour)
	if got := loginFrom(t, srv, "203.0.113.99", "alice", "wrong"); got != 401 {
		t.Fatalf("after an hour = %d, want 401", got)
	}
	_, body = f.call(t, "GET", "/api/v1/audit?action=auth.login_failed&limit=1000", "viewer", "")
	if got := strings.Count(body, `"target":"user:alice"`); got != 21 {
		t.Errorf("after an hour, %d failed sign-ins of alice audited, want 21", got)
	}
}
