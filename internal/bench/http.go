package bench

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// runHTTP loads POST /json over HTTP/1.1: each caller owns one keep-alive
// connection and keeps one check in flight on it. The request bytes of
// every key are built once, so a check costs one write, one buffered read
// of the response (of which readResponse parses only the framing) and
// little else. 200 is OK, 429 OVER_LIMIT, anything
// else an error; a connection the server closed, or one that failed, is
// redialled.
func runHTTP(cfg Config, w *window) error {
	u, err := url.Parse(cfg.Target)
	if err != nil {
		return fmt.Errorf("bench: --target %q: %w", cfg.Target, err)
	}
	addr := u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), map[string]string{"http": "80", "https": "443"}[u.Scheme])
	}
	path := strings.TrimSuffix(u.EscapedPath(), "/") + "/json"
	reqs := make([][]byte, cfg.Keys)
	for i, v := range descriptorValues(cfg.Keys) {
		body := fmt.Appendf(nil, `{"domain":%q,"descriptors":[{"entries":[{"key":%q,"value":%q}]}],"hitsAddend":%d}`,
			cfg.Domain, cfg.Key, v, cfg.Hits)
		reqs[i] = fmt.Appendf(nil, "POST %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: sluice-bench\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
			path, u.Host, len(body), body)
	}
	dialer := &net.Dialer{Timeout: dialTimeout}
	dial := dialer.DialContext
	if u.Scheme == "https" {
		dial = (&tls.Dialer{NetDialer: dialer, Config: &tls.Config{ServerName: u.Hostname()}}).DialContext
	}

	seed := uint64(time.Now().UnixNano())
	var wg sync.WaitGroup
	for c := range cfg.Concurrency {
		wg.Go(func() {
			hc := httpCaller{w: w, reqs: reqs, dial: func() (net.Conn, error) { return dial(w.ctx, "tcp", addr) }}
			hc.run(rand.New(rand.NewPCG(uint64(c), seed)))
		})
	}
	wg.Wait()
	return nil
}

// httpCaller is one caller of runHTTP and its connection.
type httpCaller struct {
	w    *window
	reqs [][]byte
	dial func() (net.Conn, error)

	conn net.Conn
	br   *bufio.Reader
	stop func() bool // unregisters the close of conn when the run is interrupted
}

func (hc *httpCaller) run(rng *rand.Rand) {
	lat := make([]time.Duration, 0, 4096)
	defer func() {
		hc.hangUp()
		hc.w.merge(lat)
	}()
	for {
		t0 := time.Now()
		if hc.w.done(t0) {
			return
		}
		if hc.conn == nil {
			if err := hc.connect(); err != nil {
				hc.w.add(&lat, t0, time.Now(), false, err)
				sleepUntil(hc.w.ctx, time.Now().Add(redialPause))
				continue
			}
			t0 = time.Now()
		}
		allowed, err := hc.check(t0, hc.reqs[pickKey(rng, len(hc.reqs))])
		hc.w.add(&lat, t0, time.Now(), allowed, err)
		if err != nil {
			sleepUntil(hc.w.ctx, time.Now().Add(errorPause))
		}
	}
}

func (hc *httpCaller) connect() error {
	conn, err := hc.dial()
	if err != nil {
		return err
	}
	hc.conn = conn
	// A read blocked when the run is interrupted must end at once.
	hc.stop = context.AfterFunc(hc.w.ctx, func() { conn.Close() })
	if hc.br == nil {
		hc.br = bufio.NewReaderSize(conn, 4096)
	} else {
		hc.br.Reset(conn)
	}
	return nil
}

func (hc *httpCaller) hangUp() {
	if hc.conn != nil {
		hc.stop()
		hc.conn.Close()
		hc.conn = nil
	}
}

// check sends one request and reads its response. It hangs up when the
// connection failed or the server closes it.
func (hc *httpCaller) check(t0 time.Time, req []byte) (allowed bool, err error) {
	// The deadline also ends a check still in flight at the end of the
	// window: it would not be counted anyway.
	hc.conn.SetDeadline(earlier(t0.Add(callTimeout), hc.w.end))
	_, err = hc.conn.Write(req)
	var code int
	var closing bool
	if err == nil {
		code, closing, err = readResponse(hc.br)
	}
	if err != nil || closing {
		hc.hangUp()
	}
	switch {
	case err != nil:
		return false, err
	case code == http.StatusOK:
		return true, nil
	case code == http.StatusTooManyRequests:
		return false, nil
	}
	return false, fmt.Errorf("HTTP %d %s", code, http.StatusText(code))
}

// readResponse reads one HTTP/1.x response, discarding its body, and
// returns its status code and whether the server closes the connection
// after it. It looks only at what that takes (the status line and the
// framing headers): net/http's ReadResponse builds a header map of every
// response, which cost about a third of this transport's CPU per check.
func readResponse(br *bufio.Reader) (code int, closing bool, err error) {
	line, err := br.ReadSlice('\n')
	if err != nil {
		return 0, false, err
	}
	// HTTP/1.1 200 OK
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) || line[8] != ' ' {
		return 0, false, fmt.Errorf("malformed HTTP status line %q", line)
	}
	if code, err = strconv.Atoi(string(line[9:12])); err != nil {
		return 0, false, fmt.Errorf("malformed HTTP status line %q", line)
	}
	closing = line[7] == '0' // HTTP/1.0 closes unless asked to keep alive
	length, chunked := int64(-1), false
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return 0, false, err
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			break
		}
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			return 0, false, fmt.Errorf("malformed HTTP header line %q", line)
		}
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			if length, err = strconv.ParseInt(string(value), 10, 64); err != nil || length < 0 {
				return 0, false, fmt.Errorf("bad Content-Length %q", value)
			}
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			chunked = bytes.EqualFold(value, []byte("chunked"))
		case bytes.EqualFold(name, []byte("Connection")):
			closing = bytes.EqualFold(value, []byte("close")) || closing && !bytes.EqualFold(value, []byte("keep-alive"))
		}
	}
	switch {
	case code < 200 || code == http.StatusNoContent || code == http.StatusNotModified:
		// No body. (bench sends no Expect, so a 1xx is not expected either.)
	case chunked:
		if _, err := io.Copy(io.Discard, httputil.NewChunkedReader(br)); err != nil {
			return 0, false, err
		}
		for { // trailers, up to an empty line
			line, err := br.ReadSlice('\n')
			if err != nil {
				return 0, false, err
			}
			if len(bytes.TrimRight(line, "\r\n")) == 0 {
				break
			}
		}
	case length >= 0:
		if _, err := br.Discard(int(length)); err != nil {
			return 0, false, err
		}
	default: // the body lasts until the server closes
		if _, err := io.Copy(io.Discard, br); err != nil {
			return 0, false, err
		}
		closing = true
	}
	return code, closing, nil
}
