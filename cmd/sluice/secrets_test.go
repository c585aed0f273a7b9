package main

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/enforcer"
	"github.com/sluicehq/sluice/enforcer/node"
	"github.com/sluicehq/sluice/internal/consoletest"
	"github.com/sluicehq/sluice/internal/testenv"
)

// lockedBuffer is a log sink for several goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestSecretsNeverLogged runs a console and an enforcer logging at debug
// level, goes through sign-in (a wrong password, then the right one), a
// bad Bearer token, a publish, a node connecting with its token and a
// check, and requires that no secret appears in any log line.
func TestSecretsNeverLogged(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	logs := &lockedBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))

	const adminPassword, wrongPassword, badToken = "admin-pw-7c1e9a", "typo-pw-52bd0f", "slc_bad-token-e41f"
	u, err := url.Parse(testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	const dbPassword = "db-pw-90ac33" // trust authentication ignores it; it must not be logged all the same
	u.User = url.UserPassword(u.User.Username(), dbPassword)

	base := consoletest.Start(t, ctx, &wg, backend.Config{DatabaseURL: u.String(), AdminPassword: adminPassword}, log)

	resp, err := http.Post(base+"/api/v1/auth/login", "application/json", strings.NewReader(`{"username":"admin","password":"`+wrongPassword+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("wrong password: %d", resp.StatusCode)
	}
	req, _ := http.NewRequest("GET", base+"/api/v1/me", nil)
	req.Header.Set("Authorization", "Bearer "+badToken)
	if resp, err = http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()

	admin := login(t, base, "admin", adminPassword)
	var tok struct {
		Token string `json:"token"`
	}
	admin.MustDo(t, "POST", "/api/v1/tokens", map[string]string{"name": "secret-node", "role": "node"}, 201, &tok)
	admin.MustDo(t, "PUT", "/api/v1/domains/live", map[string]any{"yaml": liveDomain, "message": "m", "base_version": 0}, 200, nil)
	var session string
	for _, c := range admin.HTTP.Jar.Cookies(&url.URL{Scheme: "http", Host: strings.TrimPrefix(base, "http://")}) {
		session += c.Value
	}
	if session == "" {
		t.Fatal("no session cookie")
	}

	nodeReady := make(chan string, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		cfg := enforcer.Config{Config: node.Config{ConsoleURL: base, NodeToken: tok.Token, NodeID: "secret-node", RedisURL: testenv.RedisURL(t), StateDir: t.TempDir(), KeyPrefix: testenv.KeyPrefix(t)},
			HTTPAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0"}
		if err := enforcer.Run(ctx, cfg, log, func(a enforcer.Addrs) { nodeReady <- a.HTTP.String() }); err != nil && ctx.Err() == nil {
			t.Errorf("enforcer: %v", err)
		}
	}()
	var node string
	select {
	case node = <-nodeReady:
	case <-time.After(10 * time.Second):
		t.Fatal("enforcer did not start")
	}
	waitUntil(t, 10*time.Second, "the enforcer to load the rules", func() bool { return check(t, node, "user", "u") == http.StatusOK })
	// A stats report counting that check reaches the console, which logs at debug level.
	waitUntil(t, 10*time.Second, "a stats report from the node", func() bool {
		var list struct {
			Nodes []struct {
				ID    string `json:"id"`
				Rates *struct {
					Decisions float64 `json:"decisions_per_second"`
				} `json:"rates"`
			} `json:"nodes"`
		}
		admin.MustDo(t, "GET", "/api/v1/nodes", nil, 200, &list)
		for _, n := range list.Nodes {
			if n.ID == "secret-node" && n.Rates != nil && n.Rates.Decisions > 0 {
				return true
			}
		}
		return false
	})

	out := logs.String()
	if !strings.Contains(out, "node connected") {
		t.Fatalf("the logs do not show the node connecting; the test saw nothing:\n%s", out)
	}
	for name, secret := range map[string]string{
		"admin password": adminPassword, "mistyped password": wrongPassword, "bad bearer token": badToken,
		"node token": tok.Token, "session cookie": session, "CSRF token": admin.CSRF, "database password": dbPassword,
	} {
		if strings.Contains(out, secret) {
			t.Errorf("the %s is in the logs", name)
		}
	}
}
