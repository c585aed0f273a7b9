package testenv

import (
	"bytes"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// RedisServer is a redis-server of the test's own on a free loopback port,
// without persistence, for tests that disturb the whole server: kill it,
// freeze it, restart it, flush its scripts, make it a cluster node. Tests
// that only need counters use RedisURL and a KeyPrefix on the shared one.
type RedisServer struct {
	t    testing.TB
	port int
	conf string // config file, first argument (a sentinel's, which it rewrites)
	args []string

	log  syncBuffer // the server's stdout and stderr
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// NeedCommands skips the test when one of the named programs is not on
// PATH (fails it under CI=true).
func NeedCommands(t testing.TB, names ...string) {
	t.Helper()
	for _, name := range names {
		if _, err := exec.LookPath(name); err != nil {
			missing(t, "%s not installed: %v", name, err)
		}
	}
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// StartRedis starts redis-server, with extra arguments after the defaults,
// on a free port, waits until it answers PING, and kills it when the test
// ends.
func StartRedis(t testing.TB, extra ...string) *RedisServer {
	t.Helper()
	NeedCommands(t, "redis-server")
	// repl-diskless-sync-delay 0: a master syncs a new replica at once
	// rather than after Redis's default 5 s.
	r := &RedisServer{t: t, args: append([]string{
		"--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", t.TempDir(), "--protected-mode", "no", "--loglevel", "warning",
		"--repl-diskless-sync-delay", "0",
	}, extra...)}
	for attempt := 0; ; attempt++ {
		r.port = FreePort(t)
		err := r.launch()
		if err == nil {
			break
		}
		if attempt == 5 { // the port was taken in between, five times over
			t.Fatalf("start redis-server: %v\n%s", err, r.Log())
		}
	}
	t.Cleanup(r.Stop)
	return r
}

// Addr is the server's host:port.
func (r *RedisServer) Addr() string { return "127.0.0.1:" + strconv.Itoa(r.port) }

// URL is the server's redis:// URL, database 0.
func (r *RedisServer) URL() string { return "redis://" + r.Addr() + "/0" }

// Log is what the server has written to stdout and stderr since it last
// started.
func (r *RedisServer) Log() string { return r.log.String() }

// Restart starts the server again on the same port, after Stop, with an
// empty data set and script cache; it fails the test if the server does not
// come up.
func (r *RedisServer) Restart() {
	r.t.Helper()
	if err := r.launch(); err != nil {
		r.t.Fatalf("restart redis-server: %v\n%s", err, r.Log())
	}
}

// Stop kills the server (SIGKILL: a crash, not a shutdown, and a frozen
// server dies too) and waits until it has exited.
func (r *RedisServer) Stop() {
	if r.cmd == nil || r.cmd.Process == nil {
		return
	}
	r.cmd.Process.Signal(syscall.SIGCONT)
	r.cmd.Process.Kill()
	<-r.done // the Wait goroutine reaps it
	r.cmd = nil
}

// Signal sends s to the server: SIGSTOP freezes it (connections stay open,
// nothing answers), SIGCONT thaws it.
func (r *RedisServer) Signal(s syscall.Signal) {
	r.t.Helper()
	if r.cmd == nil || r.cmd.Process == nil {
		r.t.Fatalf("signal redis-server: not running")
	}
	if err := r.cmd.Process.Signal(s); err != nil {
		r.t.Fatalf("signal redis-server: %v", err)
	}
}

// Running reports whether the server process is running (not Stopped).
func (r *RedisServer) Running() bool { return r.cmd != nil }

// CLI runs redis-cli against the server with args and returns its output
// (an error's text, when it fails: the caller checks for what it expects).
func (r *RedisServer) CLI(args ...string) string {
	out, err := exec.Command("redis-cli", append([]string{"-h", "127.0.0.1", "-p", strconv.Itoa(r.port)}, args...)...).CombinedOutput()
	if err != nil {
		return err.Error() + ": " + string(out)
	}
	return string(out)
}

// launch runs the server on r.port and waits until it answers PING.
func (r *RedisServer) launch() error {
	r.log.reset()
	var args []string
	if r.conf != "" {
		args = append(args, r.conf)
	}
	args = append(append(args, "--port", strconv.Itoa(r.port)), r.args...)
	r.cmd = exec.Command("redis-server", args...)
	r.cmd.Stdout, r.cmd.Stderr = &r.log, &r.log
	if err := r.cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	r.done = exited
	go func(cmd *exec.Cmd) {
		cmd.Wait()
		close(exited)
	}(r.cmd)
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case <-exited:
			r.cmd = nil
			return fmt.Errorf("redis-server on port %d exited", r.port)
		default:
		}
		if ping(r.Addr()) {
			return nil
		}
		if time.Now().After(deadline) {
			r.Stop()
			return fmt.Errorf("redis-server on port %d does not answer", r.port)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// ping reports whether a Redis at addr answers PING (inline command, so
// this package needs no Redis client).
func ping(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
	if err != nil {
		return false
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return false
	}
	buf := make([]byte, 7)
	n, _ := c.Read(buf)
	return string(buf[:n]) == "+PONG\r\n"
}

// syncBuffer is a bytes.Buffer that the process's output copier and the test
// may use at once.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *syncBuffer) reset() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.Reset()
}
