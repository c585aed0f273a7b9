package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// fakeEnforcer records the checks sent to it, with the time since it was
// made, and answers them with status; /readyz answers 200 once ready is
// past. It is a RoundTripper: the real network does not work in a synctest
// bubble.
type fakeEnforcer struct {
	start  time.Time
	ready  time.Duration
	status int

	mu     sync.Mutex
	checks []seenCheck
}

type seenCheck struct {
	at            time.Duration
	key, addr     string
	route, domain string
}

func newFakeEnforcer(status int) *fakeEnforcer {
	return &fakeEnforcer{start: time.Now(), status: status}
}

func (f *fakeEnforcer) RoundTrip(req *http.Request) (*http.Response, error) {
	at := time.Since(f.start)
	status := f.status
	switch {
	case req.Method == "GET" && req.URL.Path == "/readyz":
		status = http.StatusOK
		if at < f.ready {
			status = http.StatusServiceUnavailable
		}
	case req.Method == "POST" && req.URL.Path == "/json" && req.Header.Get("Content-Type") == "application/json":
		var c demoCheck
		if err := json.NewDecoder(req.Body).Decode(&c); err != nil || len(c.Descriptors) != 4 {
			status = http.StatusBadRequest
			break
		}
		s := seenCheck{at: at, domain: c.Domain}
		for _, d := range c.Descriptors {
			for _, e := range d.Entries {
				switch e.Key {
				case "api_key":
					s.key = e.Value
				case "remote_address":
					s.addr = e.Value
				case "route":
					s.route = e.Value
				}
			}
		}
		f.mu.Lock()
		f.checks = append(f.checks, s)
		f.mu.Unlock()
	default:
		status = http.StatusNotFound
	}
	return &http.Response{StatusCode: status, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("{}")), Request: req}, nil
}

func (f *fakeEnforcer) seen() []seenCheck {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]seenCheck(nil), f.checks...)
}

// testSchedule is a short schedule: bursts over [2s, 3s) and [7s, 8s).
var testSchedule = demoConfig{
	Rate: 10, BurstRate: 40,
	FirstBurst: 2 * time.Second, Period: 5 * time.Second, BurstLen: time.Second,
	Tick: 100 * time.Millisecond,
}

// runDemo runs demo traffic with cfg against f for d, then stops it and
// returns what it logged.
func runDemo(t *testing.T, f *fakeEnforcer, cfg demoConfig, d time.Duration) string {
	t.Helper()
	var logs bytes.Buffer
	cfg.Transport = f
	ctx, cancel := context.WithCancel(t.Context())
	demo := newDemoTraffic("http://enforcer.test", cfg, slog.New(slog.NewTextHandler(&logs, nil)))
	done := make(chan struct{})
	go func() {
		defer close(done)
		demo.Run(ctx)
	}()
	time.Sleep(d)
	cancel()
	<-done
	return logs.String()
}

func TestDemoTrafficSchedule(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f := newFakeEnforcer(http.StatusOK)
		logs := runDemo(t, f, testSchedule, 8*time.Second+50*time.Millisecond)
		checks := f.seen()

		perKey := map[string]int{}
		addrs := map[string]bool{}
		routes := map[string]int{}
		var steady int
		hot := map[time.Duration]int{} // per burst start
		for _, c := range checks {
			if c.domain != "demo" {
				t.Fatalf("check for domain %q, want demo", c.domain)
			}
			addrs[c.addr] = true
			routes[c.route]++
			if c.key != "demo-hot-key" {
				steady++
				perKey[c.key]++
				continue
			}
			switch {
			case c.at >= 2*time.Second && c.at < 3*time.Second:
				hot[2*time.Second]++
			case c.at >= 7*time.Second && c.at < 8*time.Second:
				hot[7*time.Second]++
			default:
				t.Errorf("hot key check at %s, outside the bursts [2s, 3s) and [7s, 8s)", c.at)
			}
		}
		// 80 ticks of 100 ms, one steady check each.
		if steady != 80 {
			t.Errorf("steady checks = %d, want 80 (10/s for 8 s)", steady)
		}
		if len(perKey) != 6 {
			t.Errorf("steady checks over %d keys, want 6: %v", len(perKey), perKey)
		}
		for k, n := range perKey {
			if n < 13 || n > 14 {
				t.Errorf("key %s got %d steady checks, want 13 or 14 (80 over 6 keys)", k, n)
			}
		}
		if len(addrs) < 3 {
			t.Errorf("checks from %d addresses, want several", len(addrs))
		}
		// 3 in 5 go to /search, over its shadow-mode limit at 10/s.
		if got, want := routes["/search"], len(checks)*3/5; got != want {
			t.Errorf("checks on /search = %d, want %d of %d", got, want, len(checks))
		}
		for _, at := range []time.Duration{2 * time.Second, 7 * time.Second} {
			if hot[at] != 40 {
				t.Errorf("burst at %s: %d hot key checks, want 40 (40/s for 1 s)", at, hot[at])
			}
		}
		if n := strings.Count(logs, "\n"); n != 1 || !strings.Contains(logs, "demo traffic on") {
			t.Errorf("logs = %q, want the one start line", logs)
		}
	})
}

func TestDemoTrafficBurstRate(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f := newFakeEnforcer(http.StatusTooManyRequests)
		runDemo(t, f, testSchedule, 3*time.Second+50*time.Millisecond)
		// 4 hot key checks on each tick of the burst, none on the others.
		perTick := map[time.Duration]int{}
		for _, c := range f.seen() {
			if c.key == "demo-hot-key" {
				perTick[c.at]++
			}
		}
		for i := range 30 {
			at := time.Duration(i+1) * 100 * time.Millisecond
			want := 0
			if at >= 2*time.Second && at < 3*time.Second {
				want = 4
			}
			if perTick[at] != want {
				t.Errorf("hot key checks at %s = %d, want %d", at, perTick[at], want)
			}
		}
	})
}

func TestDemoTrafficWaitsForReady(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f := newFakeEnforcer(http.StatusOK)
		f.ready = 3 * time.Second
		runDemo(t, f, testSchedule, 5*time.Second)
		checks := f.seen()
		if len(checks) == 0 {
			t.Fatal("no checks after the enforcer became ready")
		}
		if checks[0].at < f.ready {
			t.Errorf("first check at %s, before the enforcer was ready at %s", checks[0].at, f.ready)
		}
	})
}

func TestDemoTrafficLogsFailuresOncePerMinute(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f := newFakeEnforcer(http.StatusInternalServerError)
		logs := runDemo(t, f, testSchedule, 150*time.Second)
		// Every check fails: logged at 0.1 s, 60.1 s and 120.1 s.
		if n := strings.Count(logs, "checks failing"); n != 3 {
			t.Errorf("%d failure lines in 150 s, want 3:\n%s", n, logs)
		}
		if !strings.Contains(logs, "status 500") {
			t.Errorf("failure lines do not name the status:\n%s", logs)
		}
	})
}

func TestDemoTrafficDefaults(t *testing.T) {
	t.Parallel()
	c := demoConfig{}.withDefaults()
	if max := c.Rate + c.BurstRate; max > 50 {
		t.Errorf("up to %d checks/s, want at most 50", max)
	}
	// The first burst is within a minute of the start, and they repeat.
	if c.FirstBurst+c.BurstLen > time.Minute || c.BurstLen >= c.Period {
		t.Errorf("bursts of %s every %s from %s", c.BurstLen, c.Period, c.FirstBurst)
	}
	for _, k := range c.Keys {
		if k == c.HotKey || k == "k1" {
			t.Errorf("steady key %q is the hot key or the README's", k)
		}
	}
}
