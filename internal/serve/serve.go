// Package serve builds the HTTP servers of Sluice's processes (the
// console, the enforcer's check and gateway servers) with bounds on what
// one client may hold: how long its headers and its whole request may take
// to arrive, how long an idle keep-alive connection stays open, and how
// many connections the server holds at once.
//
// Without a read timeout a client that sends its headers and a
// Content-Length, then nothing, holds a connection (a file descriptor and
// a goroutine) for as long as it likes; enough of them reach the process's
// file-descriptor limit, and then nothing is accepted, sign-ins and
// database connections included. With these bounds such a connection is
// answered (408, or closed) once Read runs out, and at most MaxConns are
// open at once: past it the listener accepts a new connection only when
// one closes (the kernel's backlog holds the rest), so the process keeps
// descriptors for its database, Redis and peers.
//
// Read bounds the arrival of the request, not its handler: net/http clears
// the read deadline once the body has been read (when it starts watching
// the connection for the client going away), so a long handler (a large
// CSV export) keeps its context.
//
// Hijacked connections (websockets) are not bounded by the timeouts:
// net/http clears a connection's deadlines when it is hijacked, so a
// stream runs as long as its own keepalive says. They do count against
// MaxConns until they close.
package serve

import (
	"log/slog"
	"net"
	"net/http"
	"time"

	"golang.org/x/net/netutil"
)

// Limits bound a server's client connections. A zero field is no bound.
type Limits struct {
	// ReadHeader is how long a request's headers may take to arrive.
	ReadHeader time.Duration
	// Read is how long a whole request, body included, may take to arrive.
	Read time.Duration
	// Idle is how long a keep-alive connection waits for its next request.
	Idle time.Duration
	// MaxConns is how many connections the server holds open at once.
	MaxConns int
	// MaxHeaderBytes bounds a request's headers (net/http's 1 MiB when 0).
	MaxHeaderBytes int
}

// Console's defaults: a 2 MiB body (the console's largest) fits in Read
// at 70 KB/s; MaxConns leaves room for the database pool and the
// websockets' peers under the usual 20,000-descriptor limits, and far
// above what browsers, CLIs and nodes open.
const (
	DefaultReadHeader = 10 * time.Second
	DefaultRead       = 30 * time.Second
	DefaultIdle       = 2 * time.Minute
	DefaultMaxConns   = 4096
)

// Server is an http.Server for h within lim, logging net/http's own errors
// (TLS handshakes, accept errors) to log at warn level.
func Server(h http.Handler, lim Limits, log *slog.Logger) *http.Server {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: lim.ReadHeader,
		ReadTimeout:       lim.Read,
		IdleTimeout:       lim.Idle,
		MaxHeaderBytes:    lim.MaxHeaderBytes,
	}
	if log != nil {
		srv.ErrorLog = slog.NewLogLogger(log.Handler(), slog.LevelWarn)
	}
	return srv
}

// Listener is ln holding at most lim.MaxConns connections at once (ln
// itself when MaxConns is 0).
func Listener(ln net.Listener, lim Limits) net.Listener {
	if lim.MaxConns <= 0 {
		return ln
	}
	return netutil.LimitListener(ln, lim.MaxConns)
}
