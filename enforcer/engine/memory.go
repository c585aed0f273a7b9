package engine

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/sluicehq/sluice/enforcer/limiter"
)

// DefaultMemoryKeys bounds the number of keys a MemoryStore keeps.
const DefaultMemoryKeys = 1 << 20

// MemoryStore is an in-process token-bucket (GCRA) limiter with the store's
// Take semantics (all-or-nothing over a batch, Hits 0 peeks). The engine
// uses it for failure_mode: local limits while Redis is unreachable. Every
// algorithm is counted as a token bucket of the request's Limit per Period
// with Burst capacity, which is exact for token_bucket and within one burst
// of the others. Time is the node's clock.
//
// Memory is bounded: full buckets are forgotten (they hold no state worth
// keeping), and beyond maxKeys arbitrary keys are dropped, which can only
// admit more, never less.
type MemoryStore struct {
	now     func() time.Time
	maxKeys int

	mu    sync.Mutex
	tat   map[string]int64 // theoretical arrival time (ns since epoch) by key
	swept int64            // when the map was last swept
}

// NewMemoryStore returns an empty MemoryStore on the system clock.
func NewMemoryStore() *MemoryStore {
	return &MemoryStore{now: time.Now, maxKeys: DefaultMemoryKeys, tat: make(map[string]int64)}
}

// Len returns the number of keys held.
func (m *MemoryStore) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.tat)
}

// Take decides reqs all-or-nothing, like limiter.Redis.Take.
func (m *MemoryStore) Take(_ context.Context, reqs []limiter.Request) ([]limiter.Decision, error) {
	for i, r := range reqs {
		if r.Key == "" || r.Limit <= 0 || r.Period <= 0 || r.Burst < 0 || r.Hits < 0 {
			return nil, fmt.Errorf("request %d: %w", i, limiter.ErrInvalidRequest)
		}
	}
	ds := make([]limiter.Decision, len(reqs))
	newTAT := make([]int64, len(reqs))

	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now().UnixNano()
	m.sweep(now)
	all := true
	for i, r := range reqs {
		burst := r.Burst
		if burst == 0 {
			burst = r.Limit
		}
		interval := max(int64(r.Period)/r.Limit, 1) // ns per token
		tolerance := interval * burst               // a full bucket's worth
		tat := max(m.tat[r.Key], now)
		next := tat + interval*r.Hits
		d := limiter.Decision{Limit: burst}
		if next-now <= tolerance {
			d.Allowed = true
			d.Remaining = (tolerance - (next - now)) / interval
			d.ResetAfter = time.Duration(next - now)
		} else {
			all = false
			d.Remaining = (tolerance - (tat - now)) / interval
			d.ResetAfter = time.Duration(tat - now)
			if r.Hits > burst {
				d.RetryAfter = time.Duration(tolerance)
			} else {
				d.RetryAfter = time.Duration(max(next-now-tolerance, 1))
			}
		}
		newTAT[i] = next
		ds[i] = d
	}
	if !all {
		return ds, nil
	}
	for i, r := range reqs {
		if r.Hits > 0 {
			m.tat[r.Key] = newTAT[i]
		}
	}
	return ds, nil
}

// sweep forgets full buckets (TAT in the past) at most once a second, and
// when the map is at its bound drops arbitrary keys. Caller holds
// mu.
func (m *MemoryStore) sweep(now int64) {
	if len(m.tat) < m.maxKeys && now-m.swept < int64(time.Second) {
		return
	}
	m.swept = now
	for k, t := range m.tat {
		if t <= now {
			delete(m.tat, k)
		}
	}
	// Drop down to 7/8 of the bound so the next sweep is not one key away.
	for k := range m.tat {
		if len(m.tat) <= m.maxKeys-m.maxKeys/8 {
			break
		}
		delete(m.tat, k)
	}
}
