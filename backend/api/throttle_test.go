package api

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/enforcer/limiter"
)

func TestBuckets(t *testing.T) {
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	b := newBuckets(func() time.Time { return now })
	ctx := context.Background()
	take := func(reqs ...limiter.Request) []limiter.Decision {
		t.Helper()
		ds, err := b.Take(ctx, reqs)
		if err != nil {
			t.Fatal(err)
		}
		return ds
	}
	small := limiter.Request{Key: "small", Limit: 2, Period: time.Minute, Hits: 1} // one token per 30 s
	big := limiter.Request{Key: "big", Limit: 10, Period: time.Minute, Hits: 1}

	for i := range 2 {
		if d := take(small, big); !d[0].Allowed || !d[1].Allowed {
			t.Fatalf("take %d: %+v", i, d)
		}
	}
	d := take(small, big)
	if d[0].Allowed || !d[1].Allowed || d[0].RetryAfter != 30*time.Second {
		t.Fatalf("third take: %+v; want small refused with retry after 30s", d)
	}
	// All or nothing: the refused batch took nothing from big.
	if d[1].Remaining != 8 {
		t.Fatalf("big has %d left after a refused batch, want 8", d[1].Remaining)
	}
	now = now.Add(29 * time.Second)
	if d := take(small); d[0].Allowed {
		t.Fatalf("after 29 s: %+v", d)
	}
	now = now.Add(time.Second)
	if d := take(small); !d[0].Allowed || d[0].Remaining != 0 {
		t.Fatalf("after 30 s: %+v", d)
	}
	now = now.Add(time.Hour)
	if d := take(small); !d[0].Allowed || d[0].Remaining != 1 {
		t.Fatalf("after an hour the bucket is full again, capped at its burst: %+v", d)
	}
	if d := take(limiter.Request{Key: "burst", Limit: 1, Period: time.Second, Burst: 5, Hits: 5}); !d[0].Allowed {
		t.Fatalf("burst above the limit: %+v", d)
	}
	if d := take(limiter.Request{Key: "huge", Limit: 1, Period: time.Second, Hits: 2}); d[0].Allowed || d[0].RetryAfter != time.Second {
		t.Fatalf("more hits than capacity: %+v", d)
	}
	for _, bad := range []limiter.Request{
		{Key: "x", Limit: 0, Period: time.Second, Hits: 1},
		{Key: "x", Limit: 1, Period: 0, Hits: 1},
		{Key: "x", Limit: 1, Period: time.Second, Hits: -1},
	} {
		if _, err := b.Take(ctx, []limiter.Request{bad}); !errors.Is(err, limiter.ErrInvalidRequest) {
			t.Errorf("Take(%+v) = %v, want ErrInvalidRequest", bad, err)
		}
	}
	if _, err := b.Take(ctx, []limiter.Request{{Key: "x", Limit: 1, Period: time.Second, Algorithm: "fixed_window"}}); !errors.Is(err, limiter.ErrUnsupportedAlgorithm) {
		t.Errorf("fixed_window: %v", err)
	}
}

// TestBucketsBounded fills the throttle with distinct keys: it keeps at most
// maxBuckets, forgetting full buckets first and refusing when none is.
func TestBucketsBounded(t *testing.T) {
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	b := newBuckets(func() time.Time { return now })
	ctx := context.Background()
	req := func(i int) []limiter.Request {
		return []limiter.Request{{Key: strconv.Itoa(i), Limit: 1, Period: time.Hour, Hits: 1}}
	}
	for i := range maxBuckets {
		if d, _ := b.Take(ctx, req(i)); !d[0].Allowed {
			t.Fatalf("key %d refused", i)
		}
	}
	if d, _ := b.Take(ctx, req(maxBuckets)); d[0].Allowed {
		t.Fatal("a key past the bound was remembered while every bucket holds state")
	}
	now = now.Add(time.Hour) // every bucket is full again, so forgettable
	if d, _ := b.Take(ctx, req(maxBuckets)); !d[0].Allowed {
		t.Fatal("a new key was refused although full buckets could be dropped")
	}
	if len(b.m) != 1 {
		t.Fatalf("%d buckets kept, want 1", len(b.m))
	}
}
