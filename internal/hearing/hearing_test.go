//lint:file-ignore SA1019 Transport.Dial is deprecated; this checks it still works

package hearing_test

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/sluicehq/sluice/internal/hearing"
)

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestClientHears checks that reads from the server are heard, and that a
// client whose transport cannot be wrapped is returned as it is.
func TestClientHears(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello") }))
	defer srv.Close()
	var heard atomic.Int64
	c, ok := hearing.Client(nil, func() { heard.Add(1) })
	if !ok {
		t.Fatal("the default client cannot be wrapped")
	}
	resp, err := c.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if heard.Load() == 0 {
		t.Error("a response was read and nothing heard")
	}
	if http.DefaultClient.Transport != nil {
		t.Error("http.DefaultClient was changed")
	}

	// A transport's own dialer is kept, in the deprecated field too.
	var dialed atomic.Int64
	legacy := &http.Transport{Dial: func(network, addr string) (net.Conn, error) {
		dialed.Add(1)
		return net.Dial(network, addr)
	}}
	heard.Store(0)
	c, _ = hearing.Client(&http.Client{Transport: legacy}, func() { heard.Add(1) })
	resp, err = c.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if dialed.Load() != 1 || heard.Load() == 0 {
		t.Errorf("with Transport.Dial: %d dials, %d reads heard; want 1 and some", dialed.Load(), heard.Load())
	}

	custom := &http.Client{Transport: roundTripper(func(*http.Request) (*http.Response, error) { return nil, io.EOF })}
	if got, ok := hearing.Client(custom, func() {}); ok || got != custom {
		t.Errorf("a custom RoundTripper: got %p, %v, want the client itself and false", got, ok)
	}
}
