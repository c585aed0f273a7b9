package limiter

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisProc is a private redis-server this test started, on a port of its
// own, with no persistence.
type redisProc struct {
	t    testing.TB
	port int
	args []string
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
	log  bytes.Buffer
}

// needRedisServer returns the path of redis-server, skipping the test when
// it is not installed (failing under CI=true).
func needRedisServer(t testing.TB, names ...string) {
	t.Helper()
	for _, name := range append([]string{"redis-server"}, names...) {
		if _, err := exec.LookPath(name); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s not installed (CI=true): %v", name, err)
			}
			t.Skipf("%s not installed: %v", name, err)
		}
	}
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// startRedis starts redis-server with extra arguments on a free port and
// stops it when the test ends.
func startRedis(t testing.TB, extra ...string) *redisProc {
	t.Helper()
	needRedisServer(t)
	dir := t.TempDir()
	p := &redisProc{t: t, args: append([]string{
		"--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", dir, "--protected-mode", "no", "--loglevel", "warning",
	}, extra...)}
	for attempt := 0; ; attempt++ {
		p.port = freePort(t)
		if err := p.start(); err == nil {
			break
		} else if attempt == 5 {
			t.Fatalf("start redis-server: %v\n%s", err, p.log.String())
		}
	}
	t.Cleanup(p.stop)
	return p
}

func (p *redisProc) addr() string { return "127.0.0.1:" + strconv.Itoa(p.port) }

// start runs the server and waits until it answers PING.
func (p *redisProc) start() error {
	p.log.Reset()
	args := append([]string{"--port", strconv.Itoa(p.port)}, p.args...)
	p.cmd = exec.Command("redis-server", args...)
	p.cmd.Stdout, p.cmd.Stderr = &p.log, &p.log
	if err := p.cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	p.done = exited
	go func(cmd *exec.Cmd) {
		cmd.Wait()
		close(exited)
	}(p.cmd)
	c := redis.NewClient(&redis.Options{Addr: p.addr(), MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case <-exited:
			return fmt.Errorf("redis-server on port %d exited", p.port)
		default:
		}
		if c.Ping(context.Background()).Err() == nil {
			return nil
		}
		if time.Now().After(deadline) {
			p.stop()
			return fmt.Errorf("redis-server on port %d does not answer", p.port)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// stop kills the server (SIGKILL: a crash, not a shutdown) and waits for it.
func (p *redisProc) stop() {
	if p.cmd == nil || p.cmd.Process == nil {
		return
	}
	p.cmd.Process.Kill()
	<-p.done // the Wait goroutine reaps it
	p.cmd = nil
}

// startCluster starts a Redis Cluster of three masters (no replicas) on free
// ports and returns the seed list. It takes about a second.
func startCluster(t testing.TB) string {
	t.Helper()
	needRedisServer(t, "redis-cli")
	var nodes []*redisProc
	var addrs []string
	for range 3 {
		// The cluster bus port is set explicitly (Redis 7), so both are free.
		p := startRedis(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-port", strconv.Itoa(freePort(t)), "--cluster-node-timeout", "2000")
		nodes = append(nodes, p)
		addrs = append(addrs, p.addr())
	}
	out, err := exec.Command("redis-cli", append(append([]string{"--cluster", "create"}, addrs...), "--cluster-yes")...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	// Wait until every node sees the whole cluster as ok.
	deadline := time.Now().Add(15 * time.Second)
	for _, n := range nodes {
		c := redis.NewClient(&redis.Options{Addr: n.addr()})
		for {
			info, err := c.ClusterInfo(context.Background()).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_known_nodes:3") {
				break
			}
			if time.Now().After(deadline) {
				c.Close()
				t.Fatalf("cluster not ok after 15s: %q %v", info, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		c.Close()
	}
	return strings.Join(addrs, ",")
}

// TestMain keeps go-redis's own logging (a line per failed dial, which the
// dead- and restarted-Redis tests cause by the thousand) out of test output.
func TestMain(m *testing.M) {
	SetLogger(slog.New(slog.DiscardHandler))
	os.Exit(m.Run())
}
