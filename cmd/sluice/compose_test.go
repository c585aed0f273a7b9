package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/consoletest"
	"github.com/sluicehq/sluice/internal/testenv"
)

// beSluiceEnv makes the test binary run as sluice itself (see TestMain),
// so tests can start sluice processes without building the binary.
const beSluiceEnv = "SLUICE_TEST_BE_SLUICE"

func TestMain(m *testing.M) {
	if os.Getenv(beSluiceEnv) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// sluiceProcess is a running `sluice ...` process.
type sluiceProcess struct {
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed when it has exited
	mu   sync.Mutex
	out  bytes.Buffer // stdout and stderr
}

// stop ends the process with SIGINT, as docker stop does with SIGTERM,
// and reports whether it exited within 15 s (it is killed if not).
func (p *sluiceProcess) stop() bool {
	p.cmd.Process.Signal(os.Interrupt)
	select {
	case <-p.done:
		return true
	case <-time.After(15 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
		return false
	}
}

func (p *sluiceProcess) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.Write(b)
}

func (p *sluiceProcess) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// startSluice runs the test binary as `sluice args...` with env as its
// whole Sluice environment, and stops it (SIGTERM) at cleanup.
func startSluice(t *testing.T, name string, args []string, env map[string]string) *sluiceProcess {
	t.Helper()
	p := &sluiceProcess{name: name, cmd: exec.Command(os.Args[0], args...), done: make(chan struct{})}
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(k, "SLUICE_") && k != "DATABASE_URL" && k != "REDIS_URL" {
			p.cmd.Env = append(p.cmd.Env, kv)
		}
	}
	p.cmd.Env = append(p.cmd.Env, beSluiceEnv+"=1")
	for k, v := range env {
		p.cmd.Env = append(p.cmd.Env, k+"="+v)
	}
	p.cmd.Stdout, p.cmd.Stderr = p, p
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		if !p.stop() {
			t.Errorf("%s did not stop within 15 s", name)
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", name, p.output())
		}
	})
	return p
}

// composeInterpolate expands ${VAR:-default} as docker compose does, with
// no .env file and none of the variables set: the defaults.
func composeInterpolate(s string) string {
	return regexp.MustCompile(`\$\{[A-Z0-9_]+:-([^}]*)\}`).ReplaceAllString(s, "$1")
}

// composeAsProcesses turns a compose service into the process that runs
// the same command: the arguments and environment as the file has them,
// but for what names the compose network and volumes. Host names and
// ports (the database and Redis URLs, the listen addresses, the console's
// URL) become this machine's, and each named volume a directory of dir.
func composeAsProcesses(s composeService, dir string, hosts map[string]string, listen func(flag string) string) (args []string, env map[string]string) {
	mounts := map[string]string{} // container path → directory here
	for _, v := range s.Volumes {
		parts := strings.Split(v, ":")
		mounts[parts[1]] = filepath.Join(dir, parts[0])
	}
	local := func(v string) string {
		v = composeInterpolate(v)
		for from, to := range mounts {
			if v == from || strings.HasPrefix(v, from+"/") {
				return to + strings.TrimPrefix(v, from)
			}
		}
		return v
	}
	args = []string{s.Command[0]}
	for i := 1; i < len(s.Command); i++ {
		a := s.Command[i]
		args = append(args, a)
		if !strings.HasPrefix(a, "--") || i+1 >= len(s.Command) || strings.HasPrefix(s.Command[i+1], "--") {
			continue
		}
		i++
		v := local(s.Command[i])
		switch flag := strings.TrimPrefix(a, "--"); flag {
		case "database-url", "redis-url", "console-url":
			v = hosts[flag]
		case "listen", "grpc-listen":
			v = listen(flag)
		}
		args = append(args, v)
	}
	env = map[string]string{}
	for k, v := range s.Environment {
		env[k] = local(v)
	}
	return args, env
}

// TestComposeBootstrap runs docker-compose.yml's Sluice services as
// processes: the same subcommands, flags and environment, with this
// machine's Postgres, Redis, ports and directories in place of the
// compose network's. Both enforcers start first and wait for the token
// file; the console, started on an empty database with no .env, creates
// user admin (printing its password once) and the bootstrap fleet node
// token into the shared directory; both enforcers then connect with it
// and apply a published version, and the registry names the token. A
// restart of the console keeps the token. Docker is not needed.
func TestComposeBootstrap(t *testing.T) {
	t.Parallel()
	compose := loadCompose(t)
	dir := t.TempDir()
	consoleAddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	hosts := map[string]string{"database-url": testenv.PostgresURL(t), "redis-url": testenv.RedisURL(t), "console-url": "http://" + consoleAddr}

	var enforcerIDs []string
	for _, name := range []string{"enforcer-1", "enforcer-2"} {
		s, ok := compose.Services[name]
		if !ok {
			t.Fatalf("docker-compose.yml has no service %s", name)
		}
		args, env := composeAsProcesses(s, dir, hosts, func(string) string { return fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)) })
		id, _ := s.setting("node-id", "SLUICE_NODE_ID")
		enforcerIDs = append(enforcerIDs, id)
		startSluice(t, name, args, env)
	}

	cs := compose.Services["console"]
	args, env := composeAsProcesses(cs, dir, hosts, func(string) string { return consoleAddr })
	console := startSluice(t, "console", args, env)
	base := "http://" + consoleAddr
	password := regexp.MustCompile(`Created user admin with password (\S+)`)
	var admin *consoletest.Client
	waitFor(t, "the console to print the admin password and serve", func() bool {
		m := password.FindStringSubmatch(console.output())
		if m == nil {
			return false
		}
		if c, err := net.DialTimeout("tcp", consoleAddr, time.Second); err == nil {
			c.Close()
			admin = consoletest.Login(t, base, "admin", m[1])
			return true
		}
		return false
	})
	firstOutput := console.output()
	tokenFile, _ := cs.setting("bootstrap-node-token-file", "SLUICE_BOOTSTRAP_NODE_TOKEN_FILE")
	secret, err := os.ReadFile(filepath.Join(dir, "bootstrap", filepath.Base(tokenFile)))
	if err != nil {
		t.Fatalf("the bootstrap token file: %v", err)
	}
	if strings.Contains(console.output(), strings.TrimSpace(string(secret))) {
		t.Error("the console printed the node token's secret")
	}

	var pub struct {
		Version int64 `json:"version"`
	}
	admin.MustDo(t, "PUT", "/api/v1/domains/api", map[string]any{"yaml": "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 10}\n",
		"message": "first", "base_version": 0}, 200, &pub)
	type nodeRow struct {
		ID             string  `json:"id"`
		Status         string  `json:"status"`
		AppliedVersion int64   `json:"applied_version"`
		TokenName      *string `json:"token_name"`
	}
	acked := func(v int64) bool {
		var list struct {
			Nodes []nodeRow `json:"nodes"`
		}
		admin.MustDo(t, "GET", "/api/v1/nodes", nil, 200, &list)
		n := 0
		for _, row := range list.Nodes {
			for _, id := range enforcerIDs {
				if row.ID == id && row.Status == "connected" && row.AppliedVersion == v && row.TokenName != nil && *row.TokenName == "bootstrap" {
					n++
				}
			}
		}
		return n == len(enforcerIDs)
	}
	waitForLong(t, fmt.Sprintf("both enforcers to ack version %d on the bootstrap token", pub.Version), func() bool { return acked(pub.Version) })

	var tokens struct {
		Tokens []struct {
			Name  string `json:"name"`
			Fleet bool   `json:"fleet"`
		} `json:"tokens"`
	}
	admin.MustDo(t, "GET", "/api/v1/tokens", nil, 200, &tokens)
	fleet := 0
	for _, tok := range tokens.Tokens {
		if tok.Fleet {
			fleet++
		}
	}
	if fleet != 1 {
		t.Errorf("%d fleet tokens, want the one bootstrap token: %+v", fleet, tokens.Tokens)
	}

	// docker compose restart console: the same token, both nodes back.
	if !console.stop() {
		t.Fatal("the console did not stop within 15 s")
	}
	console = startSluice(t, "console (restarted)", args, env)
	waitForLong(t, "the restarted console", func() bool {
		c, err := net.DialTimeout("tcp", consoleAddr, time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	if again, err := os.ReadFile(filepath.Join(dir, "bootstrap", filepath.Base(tokenFile))); err != nil || !bytes.Equal(again, secret) {
		t.Errorf("token file after a restart: %q, %v; want it unchanged", again, err)
	}
	admin = consoletest.Login(t, base, "admin", password.FindStringSubmatch(firstOutput)[1])
	admin.MustDo(t, "PUT", "/api/v1/domains/api", map[string]any{"yaml": "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 20}\n",
		"message": "second", "base_version": pub.Version}, 200, &pub)
	waitForLong(t, fmt.Sprintf("both enforcers to ack version %d after the restart", pub.Version), func() bool { return acked(pub.Version) })
	if strings.Contains(console.output(), "Created") {
		t.Errorf("the restarted console created something again:\n%s", console.output())
	}
}

// waitForLong is waitFor for processes on a loaded machine: 60 seconds.
func waitForLong(t *testing.T, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
