package api_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// writeRoutes are the router's routes that may carry a body, with their
// parameters filled in with ids that name nothing (so a handler that
// ignores the body answers 404 and changes nothing).
func writeRoutes(t *testing.T, f *fixture) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, r := range f.api.Routes() {
		method, path, _ := strings.Cut(r, " ")
		if method == http.MethodGet || method == http.MethodHead || method == http.MethodOptions {
			continue
		}
		parts := strings.Split(path, "/")
		for i, p := range parts {
			switch {
			case p == ":domain":
				parts[i] = "nosuchdomain"
			case strings.HasPrefix(p, ":") || strings.HasPrefix(p, "*"):
				parts[i] = "999999"
			}
		}
		out[r] = method + " " + strings.Join(parts, "/")
	}
	if len(out) < 10 {
		t.Fatalf("only %d write routes found: %v", len(out), out)
	}
	return out
}

// rawRequest sends head (request line and headers, without the blank
// line) and then body, closes the connection's write side and reads the
// answer: what a client that hangs up mid-body gets.
func rawRequest(t *testing.T, addr, head, body string) (*http.Response, string) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, head+"\r\n\r\n"+body); err != nil {
		t.Fatal(err)
	}
	conn.(*net.TCPConn).CloseWrite()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("read the answer to %q: %v", head, err)
	}
	defer resp.Body.Close()
	got, _ := io.ReadAll(resp.Body)
	return resp, string(got)
}

// TestTruncatedBodyIs400: a body that ends before its Content-Length is the
// client's error, a 400 naming it, on every route that reads one; before,
// the read error became a 500 (and tripped the console's error alert).
func TestTruncatedBodyIs400(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	addr := strings.TrimPrefix(f.srv.URL, "http://")
	send := func(route, cred string) (int, string) {
		method, path, _ := strings.Cut(route, " ")
		head := method + " " + path + " HTTP/1.1\r\nHost: sluice\r\nContent-Type: application/json\r\nContent-Length: 100\r\nConnection: close"
		if cred != "" {
			head += "\r\nAuthorization: Bearer " + f.tokens[cred]
		}
		resp, body := rawRequest(t, addr, head, `{"message":"cut`)
		return resp.StatusCode, body
	}
	for route, target := range writeRoutes(t, f) {
		if status, body := send(target, "admin"); status >= 500 {
			t.Errorf("%s with a truncated body = %d %s, want a 4xx", route, status, excerpt(body))
		}
	}
	for _, c := range []struct{ route, cred string }{
		{"POST /api/v1/auth/login", ""},
		{"PUT /api/v1/domains/api", "editor"},
		{"POST /api/v1/tokens", "admin"},
		{"PUT /api/v1/settings", "admin"},
	} {
		status, body := send(c.route, c.cred)
		if status != http.StatusBadRequest || !strings.Contains(body, "ended before its declared length") {
			t.Errorf("%s with a truncated body = %d %s, want 400 naming it", c.route, status, excerpt(body))
		}
	}
}

// TestBodiesMustBeJSON: a body that is not declared JSON gets 415 on every
// route, so a cross-site form (text/plain, urlencoded or multipart, which
// a browser sends without a preflight) cannot sign a victim in or write
// anything; a JSON body with a charset and a bodyless write still work.
func TestBodiesMustBeJSON(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	login := `{"username":"alice","password":"correct horse"}`
	for _, ct := range []string{"text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
		"multipart/form-data; boundary=x", "application/jsonp", ""} {
		resp := f.do(t, "POST", "/api/v1/auth/login", "", login, http.Header{"Content-Type": {ct}})
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnsupportedMediaType || !strings.Contains(string(got), `"unsupported_media_type"`) ||
			len(resp.Cookies()) != 0 {
			t.Errorf("login as %q = %d %s (cookies %v), want 415 and no session", ct, resp.StatusCode, excerpt(string(got)), resp.Cookies())
		}
	}
	resp := f.do(t, "POST", "/api/v1/auth/login", "", login, http.Header{"Content-Type": {"application/json; charset=utf-8"}})
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("login as application/json; charset=utf-8 = %d, want 200", resp.StatusCode)
	}
	for route, target := range writeRoutes(t, f) {
		method, path, _ := strings.Cut(target, " ")
		resp := f.do(t, method, path, "admin", `{"message":"m"}`, http.Header{"Content-Type": {"text/plain"}})
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnsupportedMediaType {
			t.Errorf("%s with a text/plain body = %d, want 415", route, resp.StatusCode)
		}
	}
	if status, body := f.call(t, "POST", "/api/v1/tokens/999999/disable", "admin", ""); status != http.StatusNotFound {
		t.Errorf("a write without a body = %d %s, want 404 (not 415)", status, excerpt(body))
	}
}
