package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/internal/bench"
)

// runBench is `sluice bench`: its flags, then internal/bench's load.
func runBench(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var (
		cfg                                  bench.Config
		concurrency, keys, connections, hits string
		duration, warmup                     string
	)
	fs := newFlagSet("bench", getenv, stderr)
	fs.string(&cfg.Target, "target", "SLUICE_BENCH_TARGET", "127.0.0.1:8082", "enforcer to load: host:port for gRPC, http://host:port for HTTP /json")
	fs.string(&cfg.Transport, "transport", "SLUICE_BENCH_TRANSPORT", "grpc", "grpc (Envoy RLS v3) or http (POST /json)")
	fs.string(&cfg.Domain, "domain", "SLUICE_BENCH_DOMAIN", "bench", "rules domain of the checks")
	fs.string(&cfg.Key, "key", "SLUICE_BENCH_KEY", "key", "descriptor entry key; values are k0, k1, ...")
	fs.string(&keys, "keys", "SLUICE_BENCH_KEYS", "1", "number of distinct descriptor values, spread uniformly")
	fs.string(&concurrency, "concurrency", "SLUICE_BENCH_CONCURRENCY", "64", "concurrent callers, each with one check in flight")
	fs.string(&connections, "connections", "SLUICE_BENCH_CONNECTIONS", "4", "gRPC connections the callers share")
	fs.string(&duration, "duration", "SLUICE_BENCH_DURATION", "10s", "measured time (at most 10m)")
	fs.string(&warmup, "warmup", "SLUICE_BENCH_WARMUP", "1s", "unmeasured time before it")
	fs.string(&hits, "hits", "SLUICE_BENCH_HITS", "1", "hits_addend of each check")
	fs.bool(&cfg.AllowRemote, "allow-remote", "SLUICE_BENCH_ALLOW_REMOTE", false, "allow a target that is not a loopback address")
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
		{"keys", keys, &cfg.Keys, 1, 10_000_000},
		{"concurrency", concurrency, &cfg.Concurrency, 1, bench.MaxConcurrency},
		{"connections", connections, &cfg.Connections, 1, bench.MaxConnections},
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
	cfg.Hits = uint(h)
	if cfg.Duration, err = time.ParseDuration(duration); err != nil || cfg.Duration <= 0 || cfg.Duration > bench.MaxDuration {
		return fmt.Errorf("bench: --duration %q: want a positive duration up to %v", duration, bench.MaxDuration)
	}
	if cfg.Warmup, err = time.ParseDuration(warmup); err != nil || cfg.Warmup < 0 || cfg.Warmup > time.Minute {
		return fmt.Errorf("bench: --warmup %q: want a duration up to 1m", warmup)
	}
	return bench.Run(ctx, cfg, stdout)
}
