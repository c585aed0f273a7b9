package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
)

// benchHTTP loads POST /json over HTTP/1.1: each caller owns one keep-alive
// connection and keeps one check in flight on it. The request bytes of
// every key are built once, so a check costs one write, one buffered read
// of the response and little else. 200 is OK, 429 OVER_LIMIT, anything
// else an error; a connection the server closed, or one that failed, is
// redialled.
func benchHTTP(cfg benchConfig, w *window) error {
	u, err := url.Parse(cfg.target)
	if err != nil {
		return fmt.Errorf("bench: --target %q: %w", cfg.target, err)
	}
	addr := u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), map[string]string{"http": "80", "https": "443"}[u.Scheme])
	}
	path := strings.TrimSuffix(u.EscapedPath(), "/") + "/json"
	reqs := make([][]byte, cfg.keys)
	for i, v := range benchValues(cfg.keys) {
		body := fmt.Appendf(nil, `{"domain":%q,"descriptors":[{"entries":[{"key":%q,"value":%q}]}],"hitsAddend":%d}`,
			cfg.domain, cfg.key, v, cfg.hits)
		reqs[i] = fmt.Appendf(nil, "POST %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: sluice-bench\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
			path, u.Host, len(body), body)
	}
	dialer := &net.Dialer{Timeout: benchDialTimeout}
	dial := dialer.DialContext
	if u.Scheme == "https" {
		dial = (&tls.Dialer{NetDialer: dialer, Config: &tls.Config{ServerName: u.Hostname()}}).DialContext
	}

	seed := uint64(time.Now().UnixNano())
	var wg sync.WaitGroup
	for c := range cfg.concurrency {
		wg.Go(func() {
			hc := httpCaller{w: w, reqs: reqs, dial: func() (net.Conn, error) { return dial(w.ctx, "tcp", addr) }}
			hc.run(rand.New(rand.NewPCG(uint64(c), seed)))
		})
	}
	wg.Wait()
	return nil
}

// httpCaller is one caller of benchHTTP and its connection.
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
				sleepUntil(hc.w.ctx, time.Now().Add(benchRedialPause))
				continue
			}
			t0 = time.Now()
		}
		allowed, err := hc.check(t0, hc.reqs[pickKey(rng, len(hc.reqs))])
		hc.w.add(&lat, t0, time.Now(), allowed, err)
		if err != nil {
			sleepUntil(hc.w.ctx, time.Now().Add(benchErrorPause))
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
	resp, err := hc.roundTrip(t0, req)
	if err != nil {
		hc.hangUp()
		return false, err
	}
	if resp.Close {
		hc.hangUp()
	}
	switch resp.StatusCode {
	case http.StatusOK:
		return true, nil
	case http.StatusTooManyRequests:
		return false, nil
	}
	return false, errors.New("HTTP " + resp.Status)
}

func (hc *httpCaller) roundTrip(t0 time.Time, req []byte) (*http.Response, error) {
	// The deadline also ends a check still in flight at the end of the
	// window: it would not be counted anyway.
	hc.conn.SetDeadline(earlier(t0.Add(benchCallTimeout), hc.w.end))
	if _, err := hc.conn.Write(req); err != nil {
		return nil, err
	}
	resp, err := http.ReadResponse(hc.br, nil)
	if err != nil {
		return nil, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp, err
}
