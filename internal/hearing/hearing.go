// Package hearing tells when a websocket client last heard from its
// server: a websocket library answers pings itself, so a client that wants
// to count them as signs of life watches its connection's reads instead.
package hearing

import (
	"context"
	"net"
	"net/http"
)

// Client returns base (http.DefaultClient when nil) with a copy of
// its transport whose connections call heard on every read that returns
// bytes, and true; base itself and false when its Transport is not an
// *http.Transport.
func Client(base *http.Client, heard func()) (*http.Client, bool) {
	if base == nil {
		base = http.DefaultClient
	}
	var t *http.Transport
	switch rt := base.Transport.(type) {
	case nil:
		t = http.DefaultTransport.(*http.Transport).Clone()
	case *http.Transport:
		t = rt.Clone()
	default:
		return base, false
	}
	wrap := func(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
		return func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dial(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &conn{Conn: c, heard: heard}, nil
		}
	}
	dial, dialTLS := t.DialContext, t.DialTLSContext
	// The deprecated fields still work, and DialContext would hide them.
	//lint:ignore SA1019 a base transport may still set it
	if d := t.Dial; dial == nil && d != nil {
		dial = func(_ context.Context, network, addr string) (net.Conn, error) { return d(network, addr) }
	}
	//lint:ignore SA1019 a base transport may still set it
	if d := t.DialTLS; dialTLS == nil && d != nil {
		dialTLS = func(_ context.Context, network, addr string) (net.Conn, error) { return d(network, addr) }
	}
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	t.DialContext = wrap(dial)
	if dialTLS != nil {
		t.DialTLSContext = wrap(dialTLS)
	}
	c := *base
	c.Transport = t
	return &c, true
}

// conn calls heard whenever a read returns bytes.
type conn struct {
	net.Conn
	heard func()
}

func (c *conn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.heard()
	}
	return n, err
}
