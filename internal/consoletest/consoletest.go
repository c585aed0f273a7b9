// Package consoletest starts real consoles (backend.Run on a free port) and
// signs in to them, for the tests of other packages: one place for what
// every system test needs before it can talk to a console.
package consoletest

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/cookiejar"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/internal/apicheck"
)

// Start runs a console with cfg until ctx is done, counted in wg, and
// returns its base URL ("http://127.0.0.1:PORT") once it listens. Listen
// defaults to 127.0.0.1:0 and log, when nil, discards (as does the
// console's stdout: tests set AdminPassword). A console that fails
// to start, or stops with an error before ctx is done, fails t.
func Start(t testing.TB, ctx context.Context, wg *sync.WaitGroup, cfg backend.Config, log *slog.Logger) string {
	t.Helper()
	cfg.Listen = cmp.Or(cfg.Listen, "127.0.0.1:0")
	cfg.PasswordCost = cmp.Or(cfg.PasswordCost, bcrypt.MinCost) // sign-ins at test speed
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ready := make(chan net.Addr, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := backend.Run(ctx, cfg, log, io.Discard, func(a net.Addr) { ready <- a }); err != nil {
			t.Errorf("console: %v", err)
			ready <- nil
		}
	}()
	addr := <-ready
	if addr == nil {
		t.FailNow()
	}
	return "http://" + addr.String()
}

// Client is a signed-in session on a running console: its cookie jar holds
// the session and CSRF the token writes carry.
type Client struct {
	Base string
	HTTP *http.Client
	CSRF string
}

// Login signs user in on the console at base, failing t if it cannot.
func Login(t testing.TB, base, user, password string) *Client {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	c := &Client{Base: base, HTTP: &http.Client{Jar: jar, Timeout: 10 * time.Second}}
	var out struct {
		CSRFToken string `json:"csrf_token"`
	}
	c.MustDo(t, "POST", "/api/v1/auth/login", map[string]string{"username": user, "password": password}, 200, &out)
	c.CSRF = out.CSRFToken
	return c
}

// MustDo sends body (when not nil) as JSON, fails t unless the answer has
// status want and fits the console's OpenAPI document (apicheck), decodes it into out (when not nil) and returns it raw.
func (c *Client) MustDo(t testing.TB, method, path string, body any, want int, out any) []byte {
	t.Helper()
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, c.Base+path, r)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	req.Header.Set("Content-Type", "application/json")
	if c.CSRF != "" {
		req.Header.Set("X-CSRF-Token", c.CSRF)
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	apicheck.CheckResponse(t, resp, b)
	if resp.StatusCode != want {
		t.Fatalf("%s %s = %d %s, want %d", method, path, resp.StatusCode, b, want)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
	}
	return b
}
