//lint:file-ignore SA1019 nhooyr.io/websocket is the websocket library Sluice uses (its maintained twin is github.com/coder/websocket)

package backend_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"nhooyr.io/websocket"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/internal/serve"
	"github.com/sluicehq/sluice/internal/testenv"
)

const adminPassword = "test-password"

// startConsole runs a console (backend.Run) on a fresh database and
// returns its address; it stops at cleanup.
func startConsole(t testing.TB, cfg backend.Config) string {
	t.Helper()
	cfg.Listen, cfg.DatabaseURL, cfg.AdminPassword = "127.0.0.1:0", testenv.PostgresURL(t), adminPassword
	ctx, cancel := context.WithCancel(context.Background())
	addrs, done := make(chan net.Addr, 1), make(chan error, 1)
	go func() {
		done <- backend.Run(ctx, cfg, slog.New(slog.DiscardHandler), io.Discard, func(a net.Addr) { addrs <- a })
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("console did not stop within 30 s")
		}
	})
	select {
	case a := <-addrs:
		return a.String()
	case err := <-done:
		t.Fatalf("console: %v", err)
	}
	return ""
}

// signIn signs in as admin and returns the session cookie.
func signIn(t testing.TB, addr string) *http.Cookie {
	t.Helper()
	resp, err := http.Post("http://"+addr+"/api/v1/auth/login", "application/json",
		strings.NewReader(`{"username":"admin","password":"`+adminPassword+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	for _, c := range resp.Cookies() {
		if c.Name == "sluice_session" {
			return c
		}
	}
	t.Fatalf("sign-in = %d, no session cookie", resp.StatusCode)
	return nil
}

// slowBody opens a connection and sends a request's headers announcing a
// 100,000-byte body, and then part of the body, and nothing more.
func slowBody(addr string) (net.Conn, error) {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	_, err = io.WriteString(conn, "POST /api/v1/auth/login HTTP/1.1\r\nHost: sluice\r\nContent-Type: application/json\r\n"+
		"Content-Length: 100000\r\n\r\n{\"username\":")
	if err != nil {
		conn.Close()
		return nil, err
	}
	return conn, nil
}

// TestSlowClientsTimedOut: a request whose body stops arriving is answered
// 408 once the read timeout runs out, and one whose headers stop arriving
// is closed; before, the console had no read timeout and held both for as
// long as the client liked.
func TestSlowClientsTimedOut(t *testing.T) {
	t.Parallel()
	addr := startConsole(t, backend.Config{Limits: serveLimits(500*time.Millisecond, 500*time.Millisecond, 0)})

	conn, err := slowBody(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("a body that stops arriving got no answer: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(string(body), "request_timeout") {
		t.Errorf("a body that stops arriving = %d %s, want 408 request_timeout", resp.StatusCode, body)
	}

	half, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer half.Close()
	io.WriteString(half, "GET /api/v1/me HTTP/1.1\r\nHost: slu")
	half.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = io.ReadAll(half)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Errorf("headers that stop arriving: the connection was still open after 10 s")
	}
}

// TestConnectionCap: past MaxConns the console accepts a new connection
// only when one closes.
func TestConnectionCap(t *testing.T) {
	t.Parallel()
	addr := startConsole(t, backend.Config{Limits: serveLimits(0, 0, 3)})
	var held []net.Conn
	for range 3 {
		c, err := slowBody(addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		held = append(held, c)
	}
	fourth, err := net.Dial("tcp", addr) // the kernel's backlog takes it
	if err != nil {
		t.Fatal(err)
	}
	defer fourth.Close()
	io.WriteString(fourth, "GET /healthz HTTP/1.1\r\nHost: sluice\r\n\r\n")
	r := bufio.NewReader(fourth)
	fourth.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := r.ReadByte(); err == nil {
		t.Fatal("a 4th connection was served while 3 were held, want it to wait")
	}
	held[0].Close()
	fourth.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(r, nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("once a connection closed: %v %v, want the waiting one served", resp, err)
	}
}

// TestStreamsOutliveReadTimeout: a websocket (the live stats stream) keeps
// receiving long after the read timeout, which bounds requests, not
// hijacked connections.
func TestStreamsOutliveReadTimeout(t *testing.T) {
	t.Parallel()
	addr := startConsole(t, backend.Config{Limits: serveLimits(300*time.Millisecond, 300*time.Millisecond, 0)})
	cookie := signIn(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, "ws://"+addr+"/api/v1/stats/stream",
		&websocket.DialOptions{HTTPHeader: http.Header{"Cookie": {cookie.String()}}})
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	start := time.Now()
	ticks := 0
	for time.Since(start) < 2*time.Second {
		if _, _, err := ws.Read(ctx); err != nil {
			t.Fatalf("after %v and %d messages (read timeout 300ms): %v", time.Since(start), ticks, err)
		}
		ticks++
	}
	if ticks < 2 {
		t.Errorf("%d messages in %v, want a tick a second", ticks, time.Since(start))
	}
}

// serveLimits is the console's limits with these read timeouts (header,
// whole request) and connection cap; zero keeps a default.
func serveLimits(header, read time.Duration, conns int) serve.Limits {
	return serve.Limits{ReadHeader: header, Read: read, MaxConns: conns}
}
