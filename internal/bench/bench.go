// Package bench is the load generator of `sluice bench`: it loads an
// enforcer with checks over gRPC (Envoy RLS v3) or HTTP (POST /json) and
// reports checks/s, latency percentiles and its own CPU time per check.
// cmd/sluice parses the flags into a Config; the field names and error
// messages follow the flags.
package bench

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"
)

// Bounds of sluice bench: a capacity-planning tool, not a flood.
const (
	MaxDuration    = 10 * time.Minute
	MaxConcurrency = 4096
	MaxConnections = 64
)

// Config is what `sluice bench` measures; each field is the flag of the
// same name.
type Config struct {
	Target      string // host:port (gRPC) or http://host:port (HTTP /json)
	Transport   string // grpc or http
	Domain      string
	Key         string
	Keys        int
	Concurrency int
	Connections int
	Duration    time.Duration
	Warmup      time.Duration
	Hits        uint
	AllowRemote bool
}

// result is the outcome of one run.
type result struct {
	elapsed             time.Duration
	ok, overLimit, errs int64
	firstErr            error
	latencies           []time.Duration // sorted
	cpu                 time.Duration   // the generator's own CPU time in the window; < 0: unknown
}

func (r result) checks() int64 { return r.ok + r.overLimit }

func (r result) rate() float64 { return float64(r.checks()) / r.elapsed.Seconds() }

// cpuPerCheck is the CPU time the load generator spent per check in the
// window: on a machine shared with the server, what it took from it.
func (r result) cpuPerCheck() time.Duration {
	if r.checks() == 0 {
		return 0
	}
	return r.cpu / time.Duration(r.checks())
}

func (r result) percentile(p float64) time.Duration {
	if len(r.latencies) == 0 {
		return 0
	}
	i := int(float64(len(r.latencies)-1) * p)
	return r.latencies[i]
}

// Run checks cfg's target, loads it for cfg.Warmup and then cfg.Duration,
// and prints the figures of the measured window to stdout. A run in which
// no check succeeded is an error.
func Run(ctx context.Context, cfg Config, stdout io.Writer) error {
	if err := checkTarget(&cfg); err != nil {
		return err
	}

	fmt.Fprintf(stdout, "sluice bench: %s %s, domain %s, %d key(s), %d callers, %v (+%v warmup)\n",
		cfg.Transport, cfg.Target, cfg.Domain, cfg.Keys, cfg.Concurrency, cfg.Duration, cfg.Warmup)
	res, err := run(ctx, cfg)
	if err != nil {
		return err
	}
	printResult(stdout, res)
	if res.checks() == 0 {
		return fmt.Errorf("bench: no check succeeded: %v", res.firstErr)
	}
	return nil
}

// checkTarget validates the target and, unless allowed, keeps it on this
// machine.
func checkTarget(cfg *Config) error {
	var host string
	switch cfg.Transport {
	case "grpc":
		h, _, err := net.SplitHostPort(cfg.Target)
		if err != nil {
			return fmt.Errorf("bench: --target %q: want host:port for gRPC", cfg.Target)
		}
		host = h
	case "http":
		u, err := url.Parse(cfg.Target)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("bench: --target %q: want http://host:port for HTTP", cfg.Target)
		}
		host = u.Hostname()
	default:
		return fmt.Errorf("bench: --transport %q: want grpc or http", cfg.Transport)
	}
	if cfg.AllowRemote {
		return nil
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("bench: target host %q is not a loopback address; pass --allow-remote to load another machine", host)
}

// Transports and their per-check cost. `sluice bench` shares the machine
// with the server it measures (and often with Redis), so every microsecond
// of CPU it spends per check is taken from the server and distorts the
// figures. Both transports therefore speak their protocol directly over a
// net.Conn with requests encoded once at start: gRPC as HTTP/2 frames
// (grpc.go), HTTP/1.1 as pre-built request bytes (http.go).

// Pauses that keep a failing target from being spun on, and timeouts.
const (
	errorPause  = time.Millisecond       // a caller, after a failed check
	redialPause = 100 * time.Millisecond // a connection, after it failed
	dialTimeout = 5 * time.Second
	callTimeout = 10 * time.Second // a check, or a silent gRPC connection
)

// window is the measured window of a run and the tally of its checks.
// Callers stop starting checks at end; a check still in flight then is
// not counted, nor is one started during the warm-up, so the window holds
// only whole checks.
type window struct {
	ctx              context.Context
	measureFrom, end time.Time
	ok, over, errs   atomic.Int64
	firstErr         atomic.Pointer[error]
	mu               sync.Mutex
	latencies        []time.Duration
}

// add records a check started at t0 and finished at done in a caller's
// latencies; allowed reports OK (false: OVER_LIMIT).
func (w *window) add(lat *[]time.Duration, t0, done time.Time, allowed bool, err error) {
	if t0.Before(w.measureFrom) || done.After(w.end) || w.ctx.Err() != nil {
		return // warm-up, past the window or interrupted: not a result
	}
	switch {
	case err != nil:
		w.errs.Add(1)
		w.firstErr.CompareAndSwap(nil, &err)
		return
	case allowed:
		w.ok.Add(1)
	default:
		w.over.Add(1)
	}
	*lat = append(*lat, done.Sub(t0))
}

// merge adds a caller's latencies to the run's.
func (w *window) merge(lat []time.Duration) {
	w.mu.Lock()
	w.latencies = append(w.latencies, lat...)
	w.mu.Unlock()
}

// done reports whether the window has ended (or the run was interrupted).
func (w *window) done(now time.Time) bool { return !now.Before(w.end) || w.ctx.Err() != nil }

// run runs the load and collects the results of the measured window.
func run(ctx context.Context, cfg Config) (result, error) {
	start := time.Now()
	w := &window{ctx: ctx, measureFrom: start.Add(cfg.Warmup)}
	w.end = w.measureFrom.Add(cfg.Duration)
	cpuCtx, stop := context.WithCancel(ctx) // ends the sampler if the run fails
	defer stop()
	cpu := make(chan time.Duration, 1)
	go func() { // the process's CPU time from the window's start to its end
		sleepUntil(cpuCtx, w.measureFrom)
		t0 := ProcessCPU()
		sleepUntil(cpuCtx, w.end)
		t1 := ProcessCPU()
		if t0 < 0 || t1 < 0 {
			cpu <- -1
			return
		}
		cpu <- t1 - t0
	}()
	var err error
	switch cfg.Transport {
	case "grpc":
		err = runGRPC(cfg, w)
	case "http":
		err = runHTTP(cfg, w)
	default:
		err = fmt.Errorf("bench: unknown transport %q", cfg.Transport)
	}
	if err != nil {
		return result{}, err
	}
	elapsed := min(time.Since(w.measureFrom), cfg.Duration)
	slices.Sort(w.latencies)
	res := result{elapsed: elapsed, ok: w.ok.Load(), overLimit: w.over.Load(), errs: w.errs.Load(),
		latencies: w.latencies, cpu: <-cpu}
	if e := w.firstErr.Load(); e != nil {
		res.firstErr = *e
	}
	return res, nil
}

// descriptorValues are the descriptor values of the keys: k0, k1, ...
func descriptorValues(n int) []string {
	values := make([]string, n)
	for i := range values {
		values[i] = "k" + strconv.Itoa(i)
	}
	return values
}

// pickKey draws a key uniformly.
func pickKey(rng *rand.Rand, keys int) int {
	if keys == 1 {
		return 0
	}
	return rng.IntN(keys)
}

// sleepUntil sleeps until t or until ctx ends.
func sleepUntil(ctx context.Context, t time.Time) {
	d := time.Until(t)
	if d <= 0 {
		return
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
	case <-ctx.Done():
	}
}

func printResult(w io.Writer, r result) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "checks/s\t%.0f\n", r.rate())
	fmt.Fprintf(tw, "checks\t%d (ok %d, over_limit %d)\n", r.checks(), r.ok, r.overLimit)
	fmt.Fprintf(tw, "errors\t%d\n", r.errs)
	if r.cpu >= 0 {
		fmt.Fprintf(tw, "cpu/check\t%.1f µs (this load generator's own)\n", float64(r.cpuPerCheck())/float64(time.Microsecond))
	}
	for _, p := range []struct {
		name string
		q    float64
	}{{"p50", 0.50}, {"p90", 0.90}, {"p99", 0.99}, {"p999", 0.999}, {"max", 1}} {
		fmt.Fprintf(tw, "%s\t%s\n", p.name, fmtLatency(r.percentile(p.q)))
	}
	tw.Flush()
	if r.firstErr != nil {
		fmt.Fprintf(w, "first error: %v\n", r.firstErr)
	}
}

func fmtLatency(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 3, 64) + " ms"
}

// earlier returns the earlier of two times.
func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
