package backend_test

import (
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/internal/serve"
)

// latencies collects request times, safe for concurrent use.
type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d)
	l.mu.Unlock()
}

// report logs and reports the 50th, 99th percentile and the maximum.
func (l *latencies) report(b *testing.B, what string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.d) == 0 {
		b.Fatal("no requests measured")
	}
	slices.Sort(l.d)
	q := func(p float64) time.Duration { return l.d[min(len(l.d)-1, int(p*float64(len(l.d))))] }
	b.ReportMetric(float64(q(0.99).Microseconds())/1000, "p99-ms")
	b.ReportMetric(float64(q(0.50).Microseconds())/1000, "p50-ms")
	b.Logf("%s: %d requests, p50 %v, p99 %v, max %v", what, len(l.d), q(0.5), q(0.99), l.d[len(l.d)-1])
}

// me times one GET /api/v1/me on a new connection (an attack holds
// connections, so the legit request goes through accept as a new client's
// does), failing on anything but 200.
func me(b *testing.B, client *http.Client, addr string, cookie *http.Cookie, lat *latencies) {
	req, _ := http.NewRequest("GET", "http://"+addr+"/api/v1/me", nil)
	req.AddCookie(cookie)
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		b.Errorf("GET /me: %v", err)
		return
	}
	resp.Body.Close()
	lat.add(time.Since(start))
	if resp.StatusCode != http.StatusOK {
		b.Errorf("GET /me = %d", resp.StatusCode)
	}
}

// unbounded is no limit at all, for the "before" figures.
var unbounded = serve.Limits{ReadHeader: 24 * time.Hour, Read: 24 * time.Hour, Idle: 24 * time.Hour, MaxConns: 1 << 30}

// BenchmarkMeUnderSlowBodies measures a legit GET /api/v1/me (a new
// connection each) while 2,000 connections hold a sign-in request whose
// body never arrives, on loopback, in process:
//
//	go test -run '^$' -bench MeUnderSlowBodies -benchtime 2000x ./backend/
func BenchmarkMeUnderSlowBodies(b *testing.B) {
	for _, c := range []struct {
		name   string
		limits serve.Limits
	}{
		{"unbounded", unbounded},
		{"defaults", serve.Limits{}},
		{"cap_below_the_attack", serve.Limits{Read: 2 * time.Second, MaxConns: 1000}},
	} {
		b.Run(c.name, func(b *testing.B) {
			addr := startConsole(b, backend.Config{Limits: c.limits})
			cookie := signIn(b, addr)
			client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: time.Minute}
			var quiet latencies
			for range 200 {
				me(b, client, addr, cookie, &quiet)
			}
			quiet.report(b, c.name+", no attack")
			var attack []net.Conn
			for range 2000 {
				conn, err := slowBody(addr)
				if err != nil {
					b.Fatalf("attack connection %d: %v", len(attack), err)
				}
				attack = append(attack, conn)
			}
			defer func() {
				for _, c := range attack {
					c.Close()
				}
			}()
			var lat latencies
			b.ResetTimer()
			for range b.N {
				me(b, client, addr, cookie, &lat)
			}
			b.StopTimer()
			lat.report(b, c.name+", 2000 slow bodies")
		})
	}
}

// BenchmarkMeUnderLoginFlood measures a legit GET /api/v1/me (every 10 ms)
// during a sign-in flood: 500 wrong passwords in 20 s, from 100 addresses
// (through a trusted proxy's X-Forwarded-For, so the per-address throttle
// lets them all through), each a bcrypt check:
//
//	go test -run '^$' -bench MeUnderLoginFlood -benchtime 1x ./backend/
func BenchmarkMeUnderLoginFlood(b *testing.B) {
	for _, c := range []struct {
		name   string
		checks int
	}{
		{"unbounded", 1 << 20},
		{"defaults", 0},
	} {
		b.Run(c.name, func(b *testing.B) {
			addr := startConsole(b, backend.Config{PasswordChecks: c.checks, TrustedProxies: []string{"127.0.0.1"}})
			cookie := signIn(b, addr)
			client := &http.Client{Timeout: time.Minute}
			var (
				lat      latencies
				mu       sync.Mutex
				statuses = map[int]int{}
				wg       sync.WaitGroup
			)
			const attempts, over = 500, 20 * time.Second
			b.ResetTimer()
			start := time.Now()
			legit := make(chan struct{})
			go func() {
				defer close(legit)
				tick := time.NewTicker(10 * time.Millisecond)
				defer tick.Stop()
				for range tick.C {
					if time.Since(start) > over {
						return
					}
					me(b, client, addr, cookie, &lat)
				}
			}()
			pace := time.NewTicker(over / attempts)
			defer pace.Stop()
			for i := range attempts {
				<-pace.C
				wg.Go(func() {
					req, _ := http.NewRequest("POST", "http://"+addr+"/api/v1/auth/login",
						strings.NewReader(fmt.Sprintf(`{"username":"user%d","password":"wrong"}`, i)))
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set("X-Forwarded-For", fmt.Sprintf("10.0.0.%d", i%100+1))
					resp, err := client.Do(req)
					if err != nil {
						b.Errorf("sign-in: %v", err)
						return
					}
					resp.Body.Close()
					mu.Lock()
					statuses[resp.StatusCode]++
					mu.Unlock()
				})
			}
			wg.Wait()
			<-legit
			b.StopTimer()
			lat.report(b, fmt.Sprintf("%s: during the flood (sign-ins answered %v)", c.name, statuses))
		})
	}
}
