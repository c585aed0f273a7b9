package ctl

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"strings"
	"sync"
	"testing"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/internal/consoleapi"
	"github.com/sluicehq/sluice/internal/consoletest"
	"github.com/sluicehq/sluice/internal/testenv"
)

// console starts a real console on a fresh database and returns a client
// with an editor token.
func console(t *testing.T) *Client {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	base := consoletest.Start(t, ctx, &wg, backend.Config{DatabaseURL: testenv.PostgresURL(t), AdminPassword: "client-password"}, nil)
	jar, _ := cookiejar.New(nil)
	hc := &http.Client{Jar: jar}
	post := func(path, csrf, body string, out any) {
		req, _ := http.NewRequest("POST", base+path, strings.NewReader(body))
		req.Header.Set("X-CSRF-Token", csrf)
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil || resp.StatusCode/100 != 2 {
			t.Fatalf("POST %s: %d %v", path, resp.StatusCode, err)
		}
	}
	var login struct {
		CSRF string `json:"csrf_token"`
	}
	post("/api/v1/auth/login", "", `{"username":"admin","password":"client-password"}`, &login)
	var tok struct {
		Token string `json:"token"`
	}
	post("/api/v1/tokens", login.CSRF, `{"name":"t","role":"editor"}`, &tok)
	c, err := NewClient(base+"/", tok.Token)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestConsoleProblemsNameLocalFiles: the console's 422 details (DOMAIN.yaml,
// line, column) are printed against the local file of each domain, and a
// 409 says what to do.
func TestConsoleProblemsNameLocalFiles(t *testing.T) {
	t.Parallel()
	c := console(t)
	ctx := context.Background()
	broken := "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"
	_, err := c.PutRuleset(ctx, consoleapi.RulesetRequest{Domains: map[string]string{"api": broken, "web": "domain: other\n"}, Message: "m"})
	var stderr bytes.Buffer
	e := &env{stdout: io.Discard, stderr: &stderr}
	if got := e.fail(err, map[string]string{"api": "repo/rules/api.yaml", "web": "repo/rules/web.yaml"}); got != (ExitError{exitError}) {
		t.Fatalf("fail = %v", got)
	}
	out := stderr.String()
	for _, want := range []string{"nothing was published", "repo/rules/api.yaml:4:", "descriptors[0].rate_limit.unit", "repo/rules/web.yaml:1:", "does not match"} {
		if !strings.Contains(out, want) {
			t.Errorf("stderr lacks %q:\n%s", want, out)
		}
	}
	if snap, err := c.Ruleset(ctx); err != nil || snap.Version != 0 {
		t.Fatalf("after a refused ruleset: version %d, %v", snap.Version, err)
	}

	good := "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"
	for range 2 {
		if _, err := c.PutRuleset(ctx, consoleapi.RulesetRequest{Domains: map[string]string{"api": good}, Message: "m"}); err != nil {
			stderr.Reset()
			e.fail(err, nil)
			if !strings.Contains(stderr.String(), `domain "api" changed in version 1, after base version 0`) {
				t.Fatalf("conflict: %s", stderr.String())
			}
			return
		}
		good = strings.Replace(good, "1}", "2}", 1)
	}
	t.Fatal("the second publish on base 0 was not refused")
}
