package api

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/sluicehq/sluice/enforcer/limiter"
	"github.com/sluicehq/sluice/rules"
)

// Throttle decides a batch of limiter requests all or nothing, in process:
// the console uses it to slow down password guessing. The limiter engine's
// in-process limiter satisfies it, and so does the small token bucket below.
type Throttle interface {
	Take(ctx context.Context, reqs []limiter.Request) ([]limiter.Decision, error)
}

// maxBuckets bounds the memory of the in-process throttle. Past it, buckets
// that have refilled are dropped; if none has, new keys are refused, so a
// flood of distinct usernames cannot exhaust memory.
const maxBuckets = 100_000

// buckets is an in-process token bucket per key, with the limiter engine's
// semantics: Limit tokens per Period, capacity Burst (default Limit), and a
// batch that consumes nothing unless every request in it is allowed.
type buckets struct {
	now func() time.Time

	mu sync.Mutex
	m  map[string]*bucket
}

type bucket struct {
	tokens float64
	at     time.Time // when tokens was last computed
	rate   float64   // tokens per second
	burst  float64
}

func newBuckets(now func() time.Time) *buckets {
	return &buckets{now: now, m: make(map[string]*bucket)}
}

// Take implements Throttle.
func (b *buckets) Take(_ context.Context, reqs []limiter.Request) ([]limiter.Decision, error) {
	for _, r := range reqs {
		if r.Limit <= 0 || r.Period <= 0 || r.Burst < 0 || r.Hits < 0 {
			return nil, fmt.Errorf("throttle %q: %w", r.Key, limiter.ErrInvalidRequest)
		}
		if r.Algorithm != "" && r.Algorithm != rules.TokenBucket {
			return nil, fmt.Errorf("throttle %q: %w", r.Key, limiter.ErrUnsupportedAlgorithm)
		}
	}
	now := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	ds := make([]limiter.Decision, len(reqs))
	state := make([]*bucket, len(reqs))
	all := true
	for i, r := range reqs {
		burst := r.Burst
		if burst == 0 {
			burst = r.Limit
		}
		bk := b.m[r.Key]
		if bk == nil {
			bk = &bucket{tokens: float64(burst), at: now}
		}
		bk.rate, bk.burst = float64(r.Limit)/r.Period.Seconds(), float64(burst)
		bk.refill(now)
		state[i] = bk
		d := limiter.Decision{Allowed: bk.tokens >= float64(r.Hits), Limit: burst}
		if !d.Allowed {
			all = false
			if float64(r.Hits) > bk.burst {
				d.RetryAfter = seconds(bk.burst / bk.rate)
			} else {
				d.RetryAfter = seconds((float64(r.Hits) - bk.tokens) / bk.rate)
			}
		}
		ds[i] = d
	}
	if all && !b.makeRoom(now, reqs) {
		// No room to remember these keys: refuse rather than grow.
		for i := range ds {
			ds[i].Allowed, ds[i].RetryAfter = false, time.Minute
		}
		all = false
	}
	for i, r := range reqs {
		bk := state[i]
		if all {
			bk.tokens -= float64(r.Hits)
			b.m[r.Key] = bk
		}
		ds[i].Remaining = int64(bk.tokens)
		ds[i].ResetAfter = seconds((bk.burst - bk.tokens) / bk.rate)
	}
	return ds, nil
}

func (bk *bucket) refill(now time.Time) {
	if el := now.Sub(bk.at).Seconds(); el > 0 {
		bk.tokens = min(bk.burst, bk.tokens+el*bk.rate)
	}
	bk.at = now
}

// makeRoom reports whether the keys of reqs that are new fit, dropping full
// buckets (they hold no information) when the map is at its bound.
func (b *buckets) makeRoom(now time.Time, reqs []limiter.Request) bool {
	if len(b.m)+b.missing(reqs) <= maxBuckets {
		return true
	}
	for k, bk := range b.m {
		bk.refill(now)
		if bk.tokens >= bk.burst {
			delete(b.m, k)
		}
	}
	return len(b.m)+b.missing(reqs) <= maxBuckets
}

// missing counts the distinct keys of reqs that have no bucket.
func (b *buckets) missing(reqs []limiter.Request) int {
	n := 0
	for i, r := range reqs {
		if _, ok := b.m[r.Key]; ok {
			continue
		}
		dup := false
		for _, q := range reqs[:i] {
			dup = dup || q.Key == r.Key
		}
		if !dup {
			n++
		}
	}
	return n
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
