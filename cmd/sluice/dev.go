package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/enforcer"
	"github.com/sluicehq/sluice/enforcer/limiter"
)

// demoDomain is published by "sluice dev" when the demo domain is absent.
// Its demo-* keys, addresses and /search limit are what the demo traffic
// (demo.go) sends checks against.
const demoDomain = `domain: demo
descriptors:
  # Each API key may make 5 requests a minute, in bursts of up to 5.
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 5, name: per-key}
  # The keys of the demo traffic (demo-key-1, ..., demo-hot-key) may each
  # make 10 requests a second.
  - key: api_key
    value: demo-*
    rate_limit: {unit: second, requests_per_unit: 10, name: per-demo-key}
  # Each client address may make 10 requests a second.
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10, name: per-address}
  # A limit on /search tried out before it is enforced: shadow mode counts
  # what it would reject and rejects nothing.
  - key: route
    value: /search
    rate_limit: {unit: second, requests_per_unit: 5, name: search-shadow}
    shadow_mode: true
  # A monthly quota per customer (the UTC calendar month), whose usage the
  # Quotas page shows for billing.
  - key: customer
    rate_limit: {unit: month, requests_per_unit: 1000000, name: monthly-quota}
    algorithm: fixed_window
    calendar: true
`

// devConfig is the configuration of "sluice dev".
type devConfig struct {
	console     backend.Config
	node        enforcer.Config
	logLevel    string
	demoTraffic bool
}

func parseDevFlags(args []string, getenv func(string) string, stderr io.Writer) (devConfig, error) {
	var c devConfig
	fs := newFlagSet("dev", getenv, stderr)
	fs.string(&c.console.Listen, "console-listen", "SLUICE_CONSOLE_LISTEN", ":8080", "console address")
	fs.string(&c.console.DatabaseURL, "database-url", "DATABASE_URL", defaultDatabaseURL, "Postgres URL")
	fs.string(&c.console.AdminPassword, "admin-password", "SLUICE_ADMIN_PASSWORD", "", "admin password (default: generated once and kept in the state dir)")
	fs.string(&c.node.RedisURL, "redis-url", "REDIS_URL", "redis://127.0.0.1:6379/0", "Redis URL")
	fs.string(&c.node.HTTPAddr, "listen", "SLUICE_LISTEN", ":8081", "enforcer HTTP address")
	fs.string(&c.node.GRPCAddr, "grpc-listen", "SLUICE_GRPC_LISTEN", ":8082", "enforcer gRPC address")
	fs.string(&c.node.StateDir, "state-dir", "SLUICE_STATE_DIR", ".data/dev", "directory for dev state (admin password, node token, snapshot)")
	fs.string(&c.logLevel, "log-level", "SLUICE_LOG_LEVEL", "info", "debug, info, warn or error")
	fs.bool(&c.demoTraffic, "demo-traffic", "SLUICE_DEMO_TRAFFIC", true, "send demo checks to the enforcer: steady traffic and a periodic burst on one key")
	return c, fs.parse(args)
}

// runDev runs a console and an enforcer in one process, wired through the
// real API and websocket, publishes demo rules and, unless turned off,
// sends demo traffic: the first-try setup.
func runDev(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg, err := parseDevFlags(args, getenv, stderr)
	if err != nil {
		return err
	}
	console, node := cfg.console, cfg.node
	console.RedisURL = node.RedisURL // the support desk reads the node's counters
	log, err := newLogger(cfg.logLevel, stderr)
	if err != nil {
		return err
	}
	limiter.SetLogger(log)
	if err := os.MkdirAll(node.StateDir, 0o700); err != nil {
		return fmt.Errorf("dev: %w", err)
	}
	if console.AdminPassword == "" {
		if console.AdminPassword, err = devSecret(filepath.Join(node.StateDir, "admin-password")); err != nil {
			return err
		}
	}

	var demo *demoConfig // nil: no demo traffic
	if cfg.demoTraffic {
		d := demoConfig{}.withDefaults()
		demo = &d
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	g, ctx := errgroup.WithContext(ctx)
	consoleAddr := make(chan net.Addr, 1)
	enforcerAddr := make(chan net.Addr, 1)
	g.Go(func() error {
		return backend.Run(ctx, console, log.With("component", "console"), stdout, func(a net.Addr) { consoleAddr <- a })
	})
	g.Go(func() error {
		var addr net.Addr
		select {
		case addr = <-consoleAddr:
		case <-ctx.Done():
			return nil
		}
		consoleURL := "http://" + listenAddr(addr)
		cl, err := newDevClient(ctx, consoleURL, console.AdminPassword)
		if err != nil {
			return err
		}
		token, err := cl.nodeToken(ctx, filepath.Join(node.StateDir, "node-token"))
		if err != nil {
			return err
		}
		if err := cl.ensureDemo(ctx); err != nil {
			return err
		}
		node.ConsoleURL, node.NodeToken, node.NodeID = consoleURL, token, "dev-1"
		node.StateDir = filepath.Join(node.StateDir, "enforcer")
		node.Build = buildVersion()
		return enforcer.Run(ctx, node, log.With("component", "enforcer"), func(a enforcer.Addrs) {
			devBanner(stdout, consoleURL, console.AdminPassword, listenAddr(a.HTTP), listenAddr(a.GRPC), demo)
			enforcerAddr <- a.HTTP
		})
	})
	if demo != nil {
		g.Go(func() error {
			select {
			case addr := <-enforcerAddr:
				newDemoTraffic("http://"+listenAddr(addr), *demo, log.With("component", "demo")).Run(ctx)
			case <-ctx.Done():
			}
			return nil
		})
	}
	err = g.Wait()
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	fmt.Fprintln(stdout, "Sluice stopped.")
	return err
}

// devBanner prints where everything runs and how to try it, and the demo
// traffic's schedule unless demo is nil.
func devBanner(w io.Writer, consoleURL, password, httpAddr, grpcAddr string, demo *demoConfig) {
	fmt.Fprintf(w, `
Sluice is running.
  Console UI:   %s   (user admin, password %s)
  Enforcer:     HTTP http://%s   gRPC %s
  Try it:       for i in $(seq 7); do curl -s -o /dev/null -w '%%{http_code}\n' -X POST http://%s/json \
                  -d '{"domain":"demo","descriptors":[{"entries":[{"key":"api_key","value":"k1"}]}]}'; done
`, consoleURL, password, httpAddr, grpcAddr, httpAddr)
	if demo != nil {
		fmt.Fprintf(w, "  Demo traffic: on, %d checks/s and a burst on %s every %s; --demo-traffic=false turns it off\n",
			demo.Rate, demo.HotKey, demo.Period)
	}
	fmt.Fprintln(w, "Press Ctrl-C to stop.")
}

// devSecret reads a secret kept in path, creating it on first use.
func devSecret(path string) (string, error) {
	if b, err := os.ReadFile(path); err == nil && len(bytes.TrimSpace(b)) > 0 {
		return string(bytes.TrimSpace(b)), nil
	}
	b := make([]byte, 12)
	rand.Read(b)
	s := base64.RawURLEncoding.EncodeToString(b)
	if err := os.WriteFile(path, []byte(s+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("dev: keep admin password: %w", err)
	}
	return s, nil
}

// devClient talks to the console's API as the admin, like an operator would.
type devClient struct {
	base string
	http *http.Client
	csrf string
}

func newDevClient(ctx context.Context, base, password string) (*devClient, error) {
	jar, _ := cookiejar.New(nil)
	c := &devClient{base: base, http: &http.Client{Jar: jar, Timeout: 10 * time.Second}}
	var out struct {
		CSRFToken string `json:"csrf_token"`
	}
	status, err := c.do(ctx, "POST", "/api/v1/auth/login", map[string]string{"username": "admin", "password": password}, &out, "")
	if err != nil {
		return nil, err
	}
	if status != http.StatusOK {
		return nil, fmt.Errorf("dev: cannot sign in as admin (status %d): the database has an admin with another password; set SLUICE_ADMIN_PASSWORD or use a fresh database", status)
	}
	c.csrf = out.CSRFToken
	return c, nil
}

func (c *devClient) do(ctx context.Context, method, path string, body, out any, bearer string) (int, error) {
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, err
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, r)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	if c.csrf != "" {
		req.Header.Set("X-CSRF-Token", c.csrf)
	}
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, fmt.Errorf("dev: %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	if out != nil && resp.StatusCode < 300 {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			return resp.StatusCode, fmt.Errorf("dev: %s %s: %w", method, path, err)
		}
	}
	return resp.StatusCode, nil
}

// nodeToken reuses the node token kept in path while the console accepts
// it, and otherwise creates a new one.
func (c *devClient) nodeToken(ctx context.Context, path string) (string, error) {
	if b, err := os.ReadFile(path); err == nil {
		tok := strings.TrimSpace(string(b))
		// A node token may not read /api/v1/me, so 403 means "valid".
		if status, err := (&devClient{base: c.base, http: &http.Client{Timeout: 10 * time.Second}}).do(ctx, "GET", "/api/v1/me", nil, nil, tok); err == nil && status == http.StatusForbidden {
			return tok, nil
		}
	}
	var out struct {
		Token string `json:"token"`
	}
	status, err := c.do(ctx, "POST", "/api/v1/tokens", map[string]string{"name": "dev-enforcer", "role": "node"}, &out, "")
	if err != nil {
		return "", err
	}
	if status != http.StatusCreated {
		return "", fmt.Errorf("dev: create node token: status %d", status)
	}
	if err := os.WriteFile(path, []byte(out.Token+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("dev: keep node token: %w", err)
	}
	return out.Token, nil
}

// ensureDemo publishes the demo domain unless it exists.
func (c *devClient) ensureDemo(ctx context.Context) error {
	status, err := c.do(ctx, "GET", "/api/v1/domains/demo", nil, nil, "")
	if err != nil || status == http.StatusOK {
		return err
	}
	body := map[string]any{"yaml": demoDomain, "message": "demo rules for sluice dev", "base_version": 0}
	status, err = c.do(ctx, "PUT", "/api/v1/domains/demo", body, nil, "")
	if err != nil {
		return err
	}
	if status != http.StatusOK {
		return fmt.Errorf("dev: publish demo domain: status %d", status)
	}
	return nil
}
