package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
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
}

func (r benchResult) checks() int64 { return r.ok + r.overLimit }

func (r benchResult) rate() float64 { return float64(r.checks()) / r.elapsed.Seconds() }

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

// checker makes one check; ok reports OK (false: OVER_LIMIT).
type checker func(ctx context.Context, value int) (ok bool, err error)

// bench runs the load and collects the results of the measured window.
func bench(ctx context.Context, cfg benchConfig) (benchResult, error) {
	check, closeFn, err := newChecker(cfg)
	if err != nil {
		return benchResult{}, err
	}
	defer closeFn()

	// Callers stop starting checks at end; a check still in flight then
	// finishes but is not counted, so the window holds only whole checks.
	start := time.Now()
	measureFrom := start.Add(cfg.warmup)
	end := measureFrom.Add(cfg.duration)

	var (
		ok, over, errs atomic.Int64
		firstErr       atomic.Pointer[error]
		wg             sync.WaitGroup
		mu             sync.Mutex
		all            []time.Duration
	)
	for w := range cfg.concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), uint64(start.UnixNano())))
			lat := make([]time.Duration, 0, 4096)
			for ctx.Err() == nil {
				v := 0
				if cfg.keys > 1 {
					v = rng.IntN(cfg.keys)
				}
				t0 := time.Now()
				if !t0.Before(end) {
					break
				}
				allowed, err := check(ctx, v)
				done := time.Now()
				took := done.Sub(t0)
				if ctx.Err() != nil || done.After(end) {
					break // interrupted, or past the window: not a result
				}
				if t0.Before(measureFrom) {
					continue
				}
				switch {
				case err != nil:
					errs.Add(1)
					firstErr.CompareAndSwap(nil, &err)
					// An erroring target must not be spun on.
					time.Sleep(time.Millisecond)
					continue
				case allowed:
					ok.Add(1)
				default:
					over.Add(1)
				}
				lat = append(lat, took)
			}
			mu.Lock()
			all = append(all, lat...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	elapsed := min(time.Since(measureFrom), cfg.duration)
	slices.Sort(all)
	res := benchResult{elapsed: elapsed, ok: ok.Load(), overLimit: over.Load(), errs: errs.Load(), latencies: all}
	if e := firstErr.Load(); e != nil {
		res.firstErr = *e
	}
	return res, nil
}

func newChecker(cfg benchConfig) (checker, func(), error) {
	values := make([]string, cfg.keys)
	for i := range values {
		values[i] = "k" + strconv.Itoa(i)
	}
	switch cfg.transport {
	case "grpc":
		conns := make([]rlsv3.RateLimitServiceClient, cfg.connections)
		var closers []io.Closer
		for i := range conns {
			cc, err := grpc.NewClient(cfg.target, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				return nil, nil, fmt.Errorf("bench: grpc client: %w", err)
			}
			closers = append(closers, cc)
			conns[i] = rlsv3.NewRateLimitServiceClient(cc)
		}
		reqs := make([]*rlsv3.RateLimitRequest, cfg.keys)
		for i, v := range values {
			reqs[i] = &rlsv3.RateLimitRequest{
				Domain:      cfg.domain,
				Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: cfg.key, Value: v}}}},
				HitsAddend:  uint32(cfg.hits),
			}
		}
		var next atomic.Uint64
		return func(ctx context.Context, v int) (bool, error) {
				c := conns[next.Add(1)%uint64(len(conns))]
				cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				resp, err := c.ShouldRateLimit(cctx, reqs[v])
				cancel()
				if err != nil {
					return false, err
				}
				return resp.OverallCode == rlsv3.RateLimitResponse_OK, nil
			}, func() {
				for _, c := range closers {
					c.Close()
				}
			}, nil
	case "http":
		endpoint := strings.TrimSuffix(cfg.target, "/") + "/json"
		bodies := make([][]byte, cfg.keys)
		for i, v := range values {
			bodies[i] = fmt.Appendf(nil, `{"domain":%q,"descriptors":[{"entries":[{"key":%q,"value":%q}]}],"hitsAddend":%d}`,
				cfg.domain, cfg.key, v, cfg.hits)
		}
		tr := &http.Transport{
			MaxIdleConns:        cfg.concurrency,
			MaxIdleConnsPerHost: cfg.concurrency,
			IdleConnTimeout:     30 * time.Second,
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		}
		client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
		return func(ctx context.Context, v int) (bool, error) {
			req, err := http.NewRequestWithContext(ctx, "POST", endpoint, bytes.NewReader(bodies[v]))
			if err != nil {
				return false, err
			}
			req.Header.Set("Content-Type", "application/json")
			resp, err := client.Do(req)
			if err != nil {
				return false, err
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			switch resp.StatusCode {
			case http.StatusOK:
				return true, nil
			case http.StatusTooManyRequests:
				return false, nil
			}
			return false, errors.New("HTTP " + resp.Status)
		}, tr.CloseIdleConnections, nil
	}
	return nil, nil, fmt.Errorf("bench: unknown transport %q", cfg.transport)
}

func printBench(w io.Writer, r benchResult) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "checks/s\t%.0f\n", r.rate())
	fmt.Fprintf(tw, "checks\t%d (ok %d, over_limit %d)\n", r.checks(), r.ok, r.overLimit)
	fmt.Fprintf(tw, "errors\t%d\n", r.errs)
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
