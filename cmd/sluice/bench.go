package main

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
	benchMaxDuration    = 10 * time.Minute
	benchMaxConcurrency = 4096
	benchMaxConnections = 64
)

// benchConfig is what `sluice bench` measures.
type benchConfig struct {
	target      string // host:port (gRPC) or http://host:port (HTTP /json)
	transport   string // grpc or http
	domain      string
	key         string
	keys        int
	concurrency int
	connections int
	duration    time.Duration
	warmup      time.Duration
	hits        uint
	allowRemote bool
}

// benchResult is the outcome of one run.
type benchResult struct {
	elapsed             time.Duration
	ok, overLimit, errs int64
	firstErr            error
	latencies           []time.Duration // sorted
	cpu                 time.Duration   // the generator's own CPU time in the window; < 0: unknown
}

func (r benchResult) checks() int64 { return r.ok + r.overLimit }

func (r benchResult) rate() float64 { return float64(r.checks()) / r.elapsed.Seconds() }

// cpuPerCheck is the CPU time the load generator spent per check in the
// window: on a machine shared with the server, what it took from it.
func (r benchResult) cpuPerCheck() time.Duration {
	if r.checks() == 0 {
		return 0
	}
	return r.cpu / time.Duration(r.checks())
}

func (r benchResult) percentile(p float64) time.Duration {
	if len(r.latencies) == 0 {
		return 0
	}
	i := int(float64(len(r.latencies)-1) * p)
	return r.latencies[i]
}

func runBench(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var (
		cfg                                  benchConfig
		concurrency, keys, connections, hits string
		duration, warmup                     string
	)
	fs := newFlagSet("bench", getenv, stderr)
	fs.string(&cfg.target, "target", "SLUICE_BENCH_TARGET", "127.0.0.1:8082", "enforcer to load: host:port for gRPC, http://host:port for HTTP /json")
	fs.string(&cfg.transport, "transport", "SLUICE_BENCH_TRANSPORT", "grpc", "grpc (Envoy RLS v3) or http (POST /json)")
	fs.string(&cfg.domain, "domain", "SLUICE_BENCH_DOMAIN", "bench", "rules domain of the checks")
	fs.string(&cfg.key, "key", "SLUICE_BENCH_KEY", "key", "descriptor entry key; values are k0, k1, ...")
	fs.string(&keys, "keys", "SLUICE_BENCH_KEYS", "1", "number of distinct descriptor values, spread uniformly")
	fs.string(&concurrency, "concurrency", "SLUICE_BENCH_CONCURRENCY", "64", "concurrent callers, each with one check in flight")
	fs.string(&connections, "connections", "SLUICE_BENCH_CONNECTIONS", "4", "gRPC connections the callers share")
	fs.string(&duration, "duration", "SLUICE_BENCH_DURATION", "10s", "measured time (at most 10m)")
	fs.string(&warmup, "warmup", "SLUICE_BENCH_WARMUP", "1s", "unmeasured time before it")
	fs.string(&hits, "hits", "SLUICE_BENCH_HITS", "1", "hits_addend of each check")
	fs.bool(&cfg.allowRemote, "allow-remote", "SLUICE_BENCH_ALLOW_REMOTE", false, "allow a target that is not a loopback address")
	if err := fs.parse(args); err != nil {
		return err
	}
	var err error
	ints := []struct {
		name string
		s    string
		p    *int
		min  int
		max  int
	}{
		{"keys", keys, &cfg.keys, 1, 10_000_000},
		{"concurrency", concurrency, &cfg.concurrency, 1, benchMaxConcurrency},
		{"connections", connections, &cfg.connections, 1, benchMaxConnections},
	}
	for _, f := range ints {
		n, err := strconv.Atoi(f.s)
		if err != nil || n < f.min || n > f.max {
			return fmt.Errorf("bench: --%s %q: want an integer in [%d, %d]", f.name, f.s, f.min, f.max)
		}
		*f.p = n
	}
	h, err := strconv.ParseUint(hits, 10, 32)
	if err != nil {
		return fmt.Errorf("bench: --hits %q: %w", hits, err)
	}
	cfg.hits = uint(h)
	if cfg.duration, err = time.ParseDuration(duration); err != nil || cfg.duration <= 0 || cfg.duration > benchMaxDuration {
		return fmt.Errorf("bench: --duration %q: want a positive duration up to %v", duration, benchMaxDuration)
	}
	if cfg.warmup, err = time.ParseDuration(warmup); err != nil || cfg.warmup < 0 || cfg.warmup > time.Minute {
		return fmt.Errorf("bench: --warmup %q: want a duration up to 1m", warmup)
	}
	if err := checkTarget(&cfg); err != nil {
		return err
	}

	fmt.Fprintf(stdout, "sluice bench: %s %s, domain %s, %d key(s), %d callers, %v (+%v warmup)\n",
		cfg.transport, cfg.target, cfg.domain, cfg.keys, cfg.concurrency, cfg.duration, cfg.warmup)
	res, err := bench(ctx, cfg)
	if err != nil {
		return err
	}
	printBench(stdout, res)
	if res.checks() == 0 {
		return fmt.Errorf("bench: no check succeeded: %v", res.firstErr)
	}
	return nil
}

// checkTarget validates the target and, unless allowed, keeps it on this
// machine.
func checkTarget(cfg *benchConfig) error {
	var host string
	switch cfg.transport {
	case "grpc":
		h, _, err := net.SplitHostPort(cfg.target)
		if err != nil {
			return fmt.Errorf("bench: --target %q: want host:port for gRPC", cfg.target)
		}
		host = h
	case "http":
		u, err := url.Parse(cfg.target)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("bench: --target %q: want http://host:port for HTTP", cfg.target)
		}
		host = u.Hostname()
	default:
		return fmt.Errorf("bench: --transport %q: want grpc or http", cfg.transport)
	}
	if cfg.allowRemote {
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
// (bench_grpc.go), HTTP/1.1 as pre-built request bytes (bench_http.go).

// Pauses that keep a failing target from being spun on, and timeouts.
const (
	benchErrorPause  = time.Millisecond       // a caller, after a failed check
	benchRedialPause = 100 * time.Millisecond // a connection, after it failed
	benchDialTimeout = 5 * time.Second
	benchCallTimeout = 10 * time.Second // a check, or a silent gRPC connection
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

// bench runs the load and collects the results of the measured window.
func bench(ctx context.Context, cfg benchConfig) (benchResult, error) {
	start := time.Now()
	w := &window{ctx: ctx, measureFrom: start.Add(cfg.warmup)}
	w.end = w.measureFrom.Add(cfg.duration)
	cpuCtx, stop := context.WithCancel(ctx) // ends the sampler if the run fails
	defer stop()
	cpu := make(chan time.Duration, 1)
	go func() { // the process's CPU time from the window's start to its end
		sleepUntil(cpuCtx, w.measureFrom)
		t0 := processCPU()
		sleepUntil(cpuCtx, w.end)
		t1 := processCPU()
		if t0 < 0 || t1 < 0 {
			cpu <- -1
			return
		}
		cpu <- t1 - t0
	}()
	var err error
	switch cfg.transport {
	case "grpc":
		err = benchGRPC(cfg, w)
	case "http":
		err = benchHTTP(cfg, w)
	default:
		err = fmt.Errorf("bench: unknown transport %q", cfg.transport)
	}
	if err != nil {
		return benchResult{}, err
	}
	elapsed := min(time.Since(w.measureFrom), cfg.duration)
	slices.Sort(w.latencies)
	res := benchResult{elapsed: elapsed, ok: w.ok.Load(), overLimit: w.over.Load(), errs: w.errs.Load(),
		latencies: w.latencies, cpu: <-cpu}
	if e := w.firstErr.Load(); e != nil {
		res.firstErr = *e
	}
	return res, nil
}

// benchValues are the descriptor values of the keys: k0, k1, ...
func benchValues(n int) []string {
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

func printBench(w io.Writer, r benchResult) {
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
	}{{"p50", 0.50}, {"p90", 0.90}, {"p99", 0.99}, {"max", 1}} {
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
