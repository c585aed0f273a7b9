package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/enforcer"
	"github.com/sluicehq/sluice/enforcer/node"
	"github.com/sluicehq/sluice/internal/testenv"
)

var soak = flag.Duration("soak", 3*time.Second, "how long TestEnforcerSoakLeaks loads the enforcer at 80% of its measured capacity (the issue's soak: -soak=60s)")

// procUsage is what this process holds: goroutines, heap in use after a GC,
// and resident memory after returning freed memory to the OS.
type procUsage struct {
	goroutines int
	heap, rss  uint64
}

func measureProc() procUsage {
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	u := procUsage{goroutines: runtime.NumGoroutine(), heap: ms.HeapAlloc}
	if data, err := os.ReadFile("/proc/self/status"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
				u.rss = kb << 10
			}
		}
	}
	return u
}

func (u procUsage) String() string {
	return fmt.Sprintf("%d goroutines, heap %.1f MiB, RSS %.1f MiB", u.goroutines, float64(u.heap)/(1<<20), float64(u.rss)/(1<<20))
}

// TestEnforcerSoakLeaks runs an enforcer (file mode, real Redis) in this
// process, measures its gRPC capacity with 16 closed-loop callers for a
// second, then loads it at 80% of that, open loop, for -soak, and requires
// goroutines, heap after GC and RSS back within 10% of where they were
// after the capacity run, and no failed check.
func TestEnforcerSoakLeaks(t *testing.T) {
	// Not parallel: it counts the process's goroutines and heap.
	if testing.Short() {
		t.Skip("seconds of soak")
	}
	redisURL, prefix := testenv.RedisURL(t), testenv.KeyPrefix(t)
	dir := t.TempDir()
	yaml := "domain: soak\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 200}\n"
	if err := os.WriteFile(filepath.Join(dir, "soak.yaml"), []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	addrs := make(chan enforcer.Addrs, 1)
	go func() {
		cfg := enforcer.Config{Config: node.Config{RulesDir: dir, RedisURL: redisURL, KeyPrefix: prefix, NodeID: "soak"},
			HTTPAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0"}
		done <- enforcer.Run(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), func(a enforcer.Addrs) { addrs <- a })
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("enforcer: %v", err)
		}
	})
	var a enforcer.Addrs
	select {
	case a = <-addrs:
	case err := <-done:
		t.Fatalf("enforcer did not start: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("enforcer did not start within 30s")
	}
	conn, err := grpc.NewClient(a.GRPC.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	rls := rlsv3.NewRateLimitServiceClient(conn)

	var ok, limited, failed atomic.Int64
	check := func(i int) {
		resp, err := rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "soak",
			Descriptors: []*commonrl.RateLimitDescriptor{{Entries: []*commonrl.RateLimitDescriptor_Entry{{Key: "user", Value: strconv.Itoa(i % 50)}}}}})
		switch {
		case err != nil:
			if failed.Add(1) <= 3 {
				t.Errorf("check: %v", err)
			}
		case resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT:
			limited.Add(1)
		default:
			ok.Add(1)
		}
	}

	// Capacity: 16 callers as fast as the node answers, for a second.
	var wg sync.WaitGroup
	var n atomic.Int64
	stop := time.Now().Add(time.Second)
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; time.Now().Before(stop); i += 16 {
				check(i)
				n.Add(1)
			}
		}()
	}
	wg.Wait()
	capacity := float64(n.Load())
	time.Sleep(200 * time.Millisecond)
	before := measureProc()
	t.Logf("capacity %.0f checks/s (16 callers, load generator in the same process); before: %s", capacity, before)

	// The soak: a pacer hands out 80% of capacity per second in 1 ms
	// steps to 32 callers; checks it could not hand out are counted.
	rate := 0.8 * capacity
	ok.Store(0)
	limited.Store(0)
	tokens := make(chan int, 1024)
	var dropped atomic.Int64
	var sent int64
	start := time.Now()
	end := start.Add(*soak)
	for w := 0; w < 32; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range tokens {
				check(i)
			}
		}()
	}
	var peak procUsage
	tick := time.NewTicker(time.Millisecond)
	lastPeak := time.Now()
	for now := range tick.C {
		if now.After(end) {
			break
		}
		due := int64(rate * now.Sub(start).Seconds())
		for ; sent < due; sent++ {
			select {
			case tokens <- int(sent):
			default:
				dropped.Add(1)
			}
		}
		if now.Sub(lastPeak) > 200*time.Millisecond {
			lastPeak = now
			if g := runtime.NumGoroutine(); g > peak.goroutines {
				peak.goroutines = g
			}
		}
	}
	tick.Stop()
	close(tokens)
	wg.Wait()
	if failed.Load() > 0 {
		t.Errorf("%d checks failed", failed.Load())
	}

	deadline := time.Now().Add(30 * time.Second)
	var after procUsage
	for {
		after = measureProc()
		good := after.goroutines <= before.goroutines*11/10 && after.heap <= before.heap*11/10 && after.rss <= before.rss*11/10
		if good || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	checks := sent - dropped.Load()
	t.Logf("after %v at %.0f/s (%d checks: %d allowed, %d limited; %d not sent, the callers being busy; peak %d goroutines): %s",
		*soak, rate, checks, ok.Load(), limited.Load(), dropped.Load(), peak.goroutines, after)
	if after.goroutines > before.goroutines*11/10 {
		t.Errorf("goroutines %d, were %d: more than 10%% up", after.goroutines, before.goroutines)
	}
	if after.heap > before.heap*11/10 {
		t.Errorf("heap %d bytes after GC, was %d: more than 10%% up", after.heap, before.heap)
	}
	if after.rss > before.rss*11/10 {
		t.Errorf("RSS %d bytes, was %d: more than 10%% up", after.rss, before.rss)
	}
}
