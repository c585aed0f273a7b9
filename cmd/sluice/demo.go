package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"
)

// demoConfig is the schedule of the checks "sluice dev" sends to its own
// enforcer. Zero fields take the values of defaultDemoConfig.
type demoConfig struct {
	// Rate is the steady checks per second, round-robin over Keys, Addrs
	// and Routes.
	Rate int
	// BurstRate is the checks per second on HotKey during a burst, on top
	// of the steady ones.
	BurstRate int
	// FirstBurst is when, after the enforcer is ready, the first burst
	// starts; another starts every Period, and each lasts BurstLen.
	FirstBurst, Period, BurstLen time.Duration
	// Tick is how often the checks due are sent.
	Tick time.Duration
	// Timeout bounds each check; failures are logged at most once per
	// ErrorLogEvery.
	Timeout, ErrorLogEvery time.Duration

	Domain        string
	Keys          []string // api_key values of the steady checks
	HotKey        string   // api_key value of the bursts
	Addrs, Routes []string // remote_address and route values of every check

	// Transport carries the checks; nil means http.DefaultTransport.
	Transport http.RoundTripper
}

// defaultDemoConfig stays within the demo domain's limits (10 checks a
// second per demo key and per address) except for the hot key's bursts,
// which exceed them fourfold, and puts 6 steady checks a second on /search,
// over its 5 a second shadow-mode limit. 50 checks a second at most: dev
// runs on laptops.
var defaultDemoConfig = demoConfig{
	Rate:          10,
	BurstRate:     40,
	FirstBurst:    15 * time.Second,
	Period:        45 * time.Second,
	BurstLen:      10 * time.Second,
	Tick:          100 * time.Millisecond,
	Timeout:       2 * time.Second,
	ErrorLogEvery: time.Minute,
	Domain:        "demo",
	Keys:          []string{"demo-key-1", "demo-key-2", "demo-key-3", "demo-key-4", "demo-key-5", "demo-key-6"},
	HotKey:        "demo-hot-key",
	Addrs: []string{"198.51.100.1", "198.51.100.2", "198.51.100.3", "198.51.100.4",
		"198.51.100.5", "198.51.100.6", "198.51.100.7", "198.51.100.8"},
	Routes: []string{"/search", "/orders", "/search", "/", "/search"},
}

// withDefaults fills c's zero fields from defaultDemoConfig.
func (c demoConfig) withDefaults() demoConfig {
	d := defaultDemoConfig
	set := func(p *time.Duration, v time.Duration) {
		if *p == 0 {
			*p = v
		}
	}
	set(&c.FirstBurst, d.FirstBurst)
	set(&c.Period, d.Period)
	set(&c.BurstLen, d.BurstLen)
	set(&c.Tick, d.Tick)
	set(&c.Timeout, d.Timeout)
	set(&c.ErrorLogEvery, d.ErrorLogEvery)
	if c.Rate == 0 {
		c.Rate = d.Rate
	}
	if c.BurstRate == 0 {
		c.BurstRate = d.BurstRate
	}
	if c.Domain == "" {
		c.Domain = d.Domain
	}
	if len(c.Keys) == 0 {
		c.Keys = d.Keys
	}
	if c.HotKey == "" {
		c.HotKey = d.HotKey
	}
	if len(c.Addrs) == 0 {
		c.Addrs = d.Addrs
	}
	if len(c.Routes) == 0 {
		c.Routes = d.Routes
	}
	return c
}

// demoTraffic sends checks to an enforcer's POST /json the way an app
// would: steady traffic over several keys, plus periodic bursts on one hot
// key, so that a fresh "sluice dev" has 429s and shadow-mode verdicts to
// show. Checks go one at a time from one goroutine, so a slow enforcer
// slows the traffic down instead of piling requests up.
type demoTraffic struct {
	cfg  demoConfig
	base string // the enforcer's base URL
	http *http.Client
	log  *slog.Logger

	steady, hot int // checks sent, for the round-robin
	failed      int // failures since the last log line
	loggedAt    time.Time
}

func newDemoTraffic(base string, cfg demoConfig, log *slog.Logger) *demoTraffic {
	cfg = cfg.withDefaults()
	return &demoTraffic{
		cfg:  cfg,
		base: base,
		http: &http.Client{Transport: cfg.Transport, Timeout: cfg.Timeout},
		log:  log,
	}
}

// Run waits for the enforcer to be ready, then sends checks until ctx ends.
func (d *demoTraffic) Run(ctx context.Context) {
	c := d.cfg
	d.log.InfoContext(ctx, fmt.Sprintf("demo traffic on: steady %d checks/s over %d keys with a burst on %s (%d checks/s for %s) every %s, the first %s after start",
		c.Rate, len(c.Keys), c.HotKey, c.BurstRate, c.BurstLen, c.Period, c.FirstBurst),
		"url", d.base+"/json", "domain", c.Domain)
	if !d.waitReady(ctx) {
		return
	}
	start := time.Now()
	t := time.NewTicker(c.Tick)
	defer t.Stop()
	// Credits are in checks·ns, so rates that do not divide a tick lose
	// nothing. Ticks dropped while checks are slow are not made up for.
	var steady, hot int64
	for {
		var now time.Time
		select {
		case <-ctx.Done():
			return
		case now = <-t.C:
		}
		steady += int64(c.Rate) * int64(c.Tick)
		for ; steady >= int64(time.Second); steady -= int64(time.Second) {
			d.send(ctx, d.next(false))
		}
		if !d.inBurst(now.Sub(start)) {
			hot = 0
			continue
		}
		hot += int64(c.BurstRate) * int64(c.Tick)
		for ; hot >= int64(time.Second); hot -= int64(time.Second) {
			d.send(ctx, d.next(true))
		}
	}
}

// inBurst reports whether elapsed, since the start, falls in a burst.
func (d *demoTraffic) inBurst(elapsed time.Duration) bool {
	e := elapsed - d.cfg.FirstBurst
	return e >= 0 && e%d.cfg.Period < d.cfg.BurstLen
}

// waitReady polls the enforcer's /readyz until it has a ruleset and a
// store: before that, every check would fail.
func (d *demoTraffic) waitReady(ctx context.Context) bool {
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		req, err := http.NewRequestWithContext(ctx, "GET", d.base+"/readyz", nil)
		if err != nil {
			return false
		}
		if resp, err := d.http.Do(req); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return true
			}
		}
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
}

// demoCheck is the RateLimitRequest in protojson, the body of POST /json.
type demoCheck struct {
	Domain      string           `json:"domain"`
	Descriptors []demoDescriptor `json:"descriptors"`
}

type demoDescriptor struct {
	Entries []demoEntry `json:"entries"`
}

type demoEntry struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// next is the body of the next steady check, or of the next hot one. Each
// of its four descriptors meets one of the demo domain's limits.
func (d *demoTraffic) next(hot bool) []byte {
	c := d.cfg
	key, n := c.Keys[d.steady%len(c.Keys)], d.steady
	if hot {
		key, n = c.HotKey, d.hot
		d.hot++
	} else {
		d.steady++
	}
	b, _ := json.Marshal(demoCheck{Domain: c.Domain, Descriptors: []demoDescriptor{
		{Entries: []demoEntry{{"api_key", key}}},
		{Entries: []demoEntry{{"remote_address", c.Addrs[n%len(c.Addrs)]}}},
		{Entries: []demoEntry{{"route", c.Routes[n%len(c.Routes)]}}},
		{Entries: []demoEntry{{"customer", key}}},
	}}) // strings only: cannot fail
	return b
}

// send posts one check. A 200 or a 429 is an answer; anything else is a
// failure, counted and logged at most once per ErrorLogEvery.
func (d *demoTraffic) send(ctx context.Context, body []byte) {
	err := d.post(ctx, body)
	if err == nil || ctx.Err() != nil {
		return
	}
	d.failed++
	if now := time.Now(); d.loggedAt.IsZero() || now.Sub(d.loggedAt) >= d.cfg.ErrorLogEvery {
		d.log.WarnContext(ctx, "demo traffic: checks failing", "failed", d.failed, "error", err)
		d.failed, d.loggedAt = 0, now
	}
}

func (d *demoTraffic) post(ctx context.Context, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, "POST", d.base+"/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := d.http.Do(req)
	if err != nil {
		return err
	}
	// Drained so that the connection is reused.
	io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusTooManyRequests {
		return fmt.Errorf("POST /json: status %d", resp.StatusCode)
	}
	return nil
}
