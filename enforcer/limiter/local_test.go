package limiter

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/rules"
)

func TestLocalNodeCount(t *testing.T) {
	t.Parallel()
	tests := []struct {
		nodes     int
		limit     int64
		burst     int64
		wantLimit int64
	}{
		{1, 10, 0, 10},
		{0, 10, 0, 10}, // below 1 means 1
		{3, 10, 0, 4},  // rounded up: 3 nodes × 4 ≥ 10
		{3, 9, 0, 3},
		{4, 100, 20, 5}, // the bucket's burst is what it holds
		{50, 10, 0, 1},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%d nodes, limit %d burst %d", tt.nodes, tt.limit, tt.burst), func(t *testing.T) {
			l := NewLocal(LocalOptions{})
			l.now = func() int64 { return t0 }
			l.SetNodeCount(tt.nodes)
			req := Request{Key: "k", Limit: tt.limit, Burst: tt.burst, Period: time.Hour, Hits: 1}
			admitted := int64(0)
			for range 200 {
				ds, err := l.Take(context.Background(), []Request{req})
				if err != nil {
					t.Fatal(err)
				}
				if ds[0].Limit != tt.wantLimit {
					t.Fatalf("Limit = %d, want %d", ds[0].Limit, tt.wantLimit)
				}
				if ds[0].Allowed {
					admitted++
				}
			}
			if admitted != tt.wantLimit {
				t.Errorf("admitted %d, want %d", admitted, tt.wantLimit)
			}
		})
	}
}

func TestLocalBoundedMemory(t *testing.T) {
	t.Parallel()
	l := NewLocal(LocalOptions{MaxKeys: 100})
	now := int64(t0)
	l.now = func() int64 { return now }
	for i := range 1000 {
		req := Request{Key: fmt.Sprint(i), Algorithm: rules.SlidingWindowLog, Limit: 5, Period: time.Minute, Hits: 1}
		if _, err := l.Take(context.Background(), []Request{req}); err != nil {
			t.Fatal(err)
		}
		if n := l.Len(); n > 100 {
			t.Fatalf("after %d keys: %d held, want at most 100", i+1, n)
		}
	}
	// Idle keys vanish once their state is empty, as Redis keys expire.
	now += time.Minute.Microseconds()
	for i := range 200 {
		req := Request{Key: fmt.Sprint("new", i), Limit: 5, Period: time.Second, Hits: 1}
		if _, err := l.Take(context.Background(), []Request{req}); err != nil {
			t.Fatal(err)
		}
	}
	if n := l.Len(); n > 100 {
		t.Errorf("%d held, want at most 100", n)
	}
	// A peek stores nothing.
	l2 := NewLocal(LocalOptions{})
	for _, alg := range []rules.Algorithm{rules.TokenBucket, rules.LeakyBucket, rules.FixedWindow, rules.SlidingWindowLog, rules.SlidingWindowCounter} {
		if _, err := l2.Take(context.Background(), []Request{{Key: "p", Algorithm: alg, Limit: 1, Period: time.Second}}); err != nil {
			t.Fatal(err)
		}
	}
	if n := l2.Len(); n != 0 {
		t.Errorf("peeks stored %d states", n)
	}
}

func TestLocalConcurrentExact(t *testing.T) {
	t.Parallel()
	l := NewLocal(LocalOptions{})
	for _, alg := range []rules.Algorithm{rules.TokenBucket, rules.FixedWindow, rules.SlidingWindowLog} {
		req := Request{Key: string(alg), Algorithm: alg, Limit: 500, Period: noBoundary, Hits: 1}
		if got := takeAll(t, []Store{l}, 64, 16, req); got != 500 {
			t.Errorf("%s: allowed %d, want exactly 500", alg, got)
		}
	}
	// All-or-nothing under concurrency: a Take of a per-caller limit and a
	// shared one; the per-caller counts must add up to the shared one.
	var wg sync.WaitGroup
	var admitted atomic.Int64
	shared := Request{Key: "shared", Algorithm: rules.FixedWindow, Limit: 100, Period: noBoundary, Hits: 1}
	for g := range 32 {
		wg.Go(func() {
			own := Request{Key: fmt.Sprint("own", g), Algorithm: rules.FixedWindow, Limit: 5, Period: noBoundary, Hits: 1}
			for range 10 {
				ds, err := l.Take(context.Background(), []Request{own, shared})
				if err != nil {
					t.Error(err)
					return
				}
				if ds[0].Allowed && ds[1].Allowed {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	shared.Hits = 0
	ds, _ := l.Take(context.Background(), []Request{shared})
	if got := admitted.Load(); got != 100 || ds[0].Remaining != 0 {
		t.Errorf("admitted %d, shared remaining %d; want 100 and 0", got, ds[0].Remaining)
	}
}

func TestLocalInvalid(t *testing.T) {
	t.Parallel()
	l := NewLocal(LocalOptions{})
	_, err := l.Take(context.Background(), []Request{{Key: "k", Limit: 0, Period: time.Second}})
	if !errors.Is(err, ErrInvalidRequest) {
		t.Errorf("Take with limit 0: %v, want ErrInvalidRequest", err)
	}
	if ds, err := l.Take(context.Background(), nil); err != nil || len(ds) != 0 {
		t.Errorf("Take(nil) = %v, %v", ds, err)
	}
}
