package serve_test

import (
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/serve"
)

// start serves h within lim on a loopback port.
func start(t *testing.T, h http.Handler, lim serve.Limits) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := serve.Server(h, lim, nil)
	go srv.Serve(serve.Listener(ln, lim))
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String()
}

// TestHandlersOutliveReadTimeout: the read timeout bounds the arrival of a
// body, not the handler: a handler that runs past it, after reading its
// body or without one, keeps its context. (With net/http's ReadTimeout
// the server cancels the context once the deadline passes.)
func TestHandlersOutliveReadTimeout(t *testing.T) {
	t.Parallel()
	url := start(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.ReadAll(r.Body); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		select {
		case <-r.Context().Done():
			io.WriteString(w, "canceled")
		case <-time.After(800 * time.Millisecond): // four read timeouts
			io.WriteString(w, "ok")
		}
	}), serve.Limits{ReadHeader: time.Second, Read: 200 * time.Millisecond})
	for _, body := range []string{"", `{"a":1}`} {
		resp, err := http.Post(url, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(got) != "ok" {
			t.Errorf("a handler running past the read timeout (body %q) = %q, want ok", body, got)
		}
	}
}

// TestSlowBodyTimesOut: a body that stops arriving fails the handler's read
// with a timeout once Read has passed.
func TestSlowBodyTimesOut(t *testing.T) {
	t.Parallel()
	errs := make(chan error, 1)
	url := start(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, err := io.ReadAll(r.Body)
		errs <- err
	}), serve.Limits{ReadHeader: time.Second, Read: 200 * time.Millisecond})
	pr, pw := io.Pipe()
	defer pw.Close()
	go io.WriteString(pw, `{"a":`)
	req, _ := http.NewRequest("POST", url, pr)
	req.ContentLength = 1000
	go http.DefaultClient.Do(req)
	select {
	case err := <-errs:
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Errorf("reading a stalled body: %v, want a timeout", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("reading a stalled body did not time out in 10 s")
	}
}
