package limiter

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
)

// TestBatcherFrozenRedisWaitsOneTimeout: with Redis
// frozen (SIGSTOP: connections stay open, nothing answers), a Take waits
// at most the Batcher's Timeout, queueing included. Before, a Take queued
// behind a stuck round trip waited for it, then for its own: ~2× the
// timeout at 16–64 callers.
func TestBatcherFrozenRedisWaitsOneTimeout(t *testing.T) {
	// Not parallel: it asserts latencies under load.
	const timeout = 50 * time.Millisecond
	srv := testenv.StartRedis(t)
	c, err := NewClient(srv.URL(), WithTimeout(timeout), WithDialTimeout(timeout))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	b := NewBatcher(NewRedis(c), BatchOptions{Timeout: timeout, OverLimitEntries: -1})
	if _, err := b.Take(context.Background(), []Request{{Key: "warm", Algorithm: rules.TokenBucket, Limit: 10, Period: time.Second, Hits: 1}}); err != nil {
		t.Fatal(err)
	}
	for _, callers := range []int{16, 64} {
		t.Run(strconv.Itoa(callers)+" callers", func(t *testing.T) {
			srv.Signal(syscall.SIGSTOP)
			defer srv.Signal(syscall.SIGCONT)
			var (
				mu    sync.Mutex
				waits []time.Duration
				wg    sync.WaitGroup
			)
			stop := time.Now().Add(600 * time.Millisecond)
			for i := range callers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					req := []Request{{Key: "k" + strconv.Itoa(i), Algorithm: rules.TokenBucket, Limit: 10, Period: time.Second, Hits: 1}}
					for time.Now().Before(stop) {
						start := time.Now()
						_, err := b.Take(context.Background(), req)
						d := time.Since(start)
						if err == nil {
							t.Error("a Take was decided by a frozen Redis")
							return
						}
						if !errors.Is(err, ErrBatchTimeout) {
							// The round trip's own socket timeout may come first.
							t.Logf("take: %v", err)
						}
						mu.Lock()
						waits = append(waits, d)
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			slices.Sort(waits)
			p99, worst := waits[len(waits)*99/100], waits[len(waits)-1]
			t.Logf("%d callers, Redis frozen: %d Takes, p50 %v, p99 %v, max %v", callers, len(waits),
				waits[len(waits)/2], p99, worst)
			// The bound is the timeout, judged at the median: a loaded
			// 2-core machine's scheduler alone adds tens of milliseconds to
			// the slowest Takes, while Takes that queued behind a stuck round
			// trip and then waited their own timeout put the median near
			// twice the timeout.
			if p50, limit := waits[len(waits)/2], timeout+25*time.Millisecond; p50 > limit {
				t.Errorf("p50 wait %v with Redis frozen, want at most %v (timeout %v)", p50, limit, timeout)
			}
		})
	}
}
