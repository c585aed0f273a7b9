package limiter

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Defaults of BatchOptions.
const (
	DefaultBatchWindow      = 100 * time.Microsecond
	DefaultMaxBatch         = 256
	DefaultMaxInFlight      = 2
	DefaultOverLimitEntries = 10_000
	// OverLimitRecheck is the longest a Batcher answers a limit from its
	// over-limit cache before asking Redis again, whatever the RetryAfter:
	// a counter reset (the console's support desk deletes the keys) takes
	// effect at every node within it, at the cost of at most one script
	// call a second for each key a node keeps rejecting.
	OverLimitRecheck = time.Second
)

// BatchOptions configures NewBatcher; zero values mean the defaults.
type BatchOptions struct {
	// Window is how long a Take may wait for others to share its round trip
	// while another one is in flight (default DefaultBatchWindow). A Take
	// that arrives when nothing is in flight is sent at once, so an idle
	// node adds no latency.
	Window time.Duration
	// MaxBatch is the most Takes one round trip carries (default
	// DefaultMaxBatch); a full batch is sent without waiting for Window.
	MaxBatch int
	// MaxInFlight is the most round trips in flight at once (default
	// DefaultMaxInFlight); Takes arriving meanwhile wait for the next one.
	// Redis runs one script at a time, so two (one running, one being sent
	// or read) keep it busy; more only makes batches smaller.
	MaxInFlight int
	// NoCoalescing sends every Take as its own script call (still pipelined
	// with the others of its batch) instead of coalescing the Takes of one
	// hash slot into one script call. For measurements.
	NoCoalescing bool
	// OverLimitEntries bounds the over-limit cache (default
	// DefaultOverLimitEntries limits); a negative value disables the cache.
	OverLimitEntries int
	// Timeout bounds a Take's whole wait: queueing behind the round trips
	// in flight and its own round trip (default DefaultTimeout). Set it to
	// the client's timeout (WithTimeout), so that a check never waits
	// longer than that even when Redis is frozen: without it, a Take queued
	// behind a stuck round trip waited for that one's timeout, then for its
	// own (twice the timeout). A Take whose time is up (or whose context's
	// deadline has passed) before its batch is sent is not sent. A Take
	// spanning Redis Cluster slots gets one Timeout for its reservations on
	// every slot together, and, when one refused, one more for giving back
	// what the others took.
	Timeout time.Duration
}

// ErrBatchTimeout is the error of a Take that waited its Batcher's Timeout.
var ErrBatchTimeout = errors.New("limiter: no answer from Redis within the timeout")

// Batcher is the node's way to Redis: a Store with Redis's Take semantics
// that sends concurrent Takes together. It is safe for concurrent use and
// needs no closing (it keeps no goroutine while idle).
//
// Batching: a Take that arrives while nothing is in flight goes at once;
// Takes that arrive while round trips are in flight wait up to Window (or
// until MaxBatch are waiting, or a round trip ends and none is left) and go
// together in one pipeline.
//
// Coalescing: within a batch, the Takes whose keys share a hash slot (on a
// standalone Redis: all of them) go as one script call, which decides them
// one after another, each all-or-nothing, with the state each earlier one
// left — exactly what separate calls in that order would decide, at the
// cost of one call. A hot key therefore costs one script call per batch,
// whatever its algorithm, with no loss of accuracy.
//
// Over-limit cache: when Redis rejects a request, its limit will reject the
// same or more hits at least until the RetryAfter it reported, counted from
// when the Take was sent (no algorithm gives hits back sooner). Until then a
// Take including such a request is rejected without asking Redis (see
// Decision.Cached); it consumes nothing anyway, all-or-nothing. Entries are
// specific to the limit's parameters, expire at their time or after
// OverLimitRecheck, whichever comes first (a reset can give hits back), and
// are bounded by OverLimitEntries. A rejection that depended on another request of the
// same Take (the same key twice) is not cached.
type Batcher struct {
	r           *Redis
	window      time.Duration
	maxBatch    int
	maxInFlight int
	coalesce    bool
	timeout     time.Duration
	cache       *overLimitCache // nil when disabled

	mu       sync.Mutex
	pending  []*takeCall
	inflight int
	timer    *time.Timer
	armed    bool // timer is running
	due      bool // the window of the pending calls has passed
}

// NewBatcher returns a Batcher sending r's Takes.
func NewBatcher(r *Redis, opts BatchOptions) *Batcher {
	b := &Batcher{
		r:           r,
		window:      opts.Window,
		maxBatch:    opts.MaxBatch,
		maxInFlight: opts.MaxInFlight,
		coalesce:    !opts.NoCoalescing,
		timeout:     opts.Timeout,
	}
	if b.timeout <= 0 {
		b.timeout = DefaultTimeout
	}
	if b.window <= 0 {
		b.window = DefaultBatchWindow
	}
	if b.maxBatch <= 0 {
		b.maxBatch = DefaultMaxBatch
	}
	if b.maxInFlight <= 0 {
		b.maxInFlight = DefaultMaxInFlight
	}
	switch {
	case opts.OverLimitEntries == 0:
		b.cache = newOverLimitCache(DefaultOverLimitEntries)
	case opts.OverLimitEntries > 0:
		b.cache = newOverLimitCache(opts.OverLimitEntries)
	}
	b.timer = time.AfterFunc(time.Hour, b.windowPassed)
	b.timer.Stop()
	return b
}

// Take decides reqs like Redis.Take (all-or-nothing, one Decision per
// request, in order), batched with the node's other Takes, or from the
// over-limit cache. An error means no decision was made (Redis unreachable
// or slow, ctx done, invalid request); the caller's failure mode decides.
// When ctx ends first, Take returns at once, but the Take may still be
// decided, and count, in Redis.
func (b *Batcher) Take(ctx context.Context, reqs []Request) ([]Decision, error) {
	if len(reqs) == 0 {
		return []Decision{}, nil
	}
	specs, err := specsOf(reqs)
	if err != nil {
		return nil, err
	}
	if b.cache == nil {
		return b.r.take(ctx, specs, b.run)
	}
	sent := time.Now()
	if ds, ok := b.cache.answer(specs, sent); ok {
		return ds, nil
	}
	ds, err := b.r.take(ctx, specs, b.run)
	if err == nil {
		b.cache.learn(specs, ds, sent)
	}
	return ds, err
}

// run queues calls and waits for them, at most b.timeout from now in all,
// or until the earliest deadline a call already carries (the later
// reservations of a Take spanning slots carry the first one's), or ctx's:
// a call whose caller has stopped waiting by the time its batch goes is
// not sent (see unexpired).
func (b *Batcher) run(ctx context.Context, calls []*takeCall) error {
	deadline := time.Now().Add(b.timeout)
	for _, c := range calls {
		c.done = make(chan struct{})
		if !c.deadline.IsZero() && c.deadline.Before(deadline) {
			deadline = c.deadline
		}
	}
	// When ctx's deadline comes first, ctx.Done reports it: no timer of
	// ours, which could fire before ctx.Err is set.
	var expired <-chan time.Time
	if d, ok := ctx.Deadline(); ok && !d.After(deadline) {
		deadline = d
	} else {
		timer := time.NewTimer(time.Until(deadline))
		defer timer.Stop()
		expired = timer.C
	}
	for _, c := range calls {
		c.deadline = deadline
	}
	b.mu.Lock()
	b.pending = append(b.pending, calls...)
	b.dispatch()
	b.mu.Unlock()
	for _, c := range calls {
		select {
		case <-c.done:
			if expired == nil && errors.Is(c.err, ErrBatchTimeout) {
				// Not sent, ctx's deadline having passed: ctx reports it
				// in a moment, and its error is the one to return (the
				// engine does not blame the store for it).
				<-ctx.Done()
				return fmt.Errorf("wait for limiter batch: %w", ctx.Err())
			}
		case <-expired:
			return fmt.Errorf("wait for limiter batch: %w", ErrBatchTimeout)
		case <-ctx.Done():
			return fmt.Errorf("wait for limiter batch: %w", ctx.Err())
		}
	}
	return nil
}

// dispatch sends pending calls as the batching policy allows. b.mu is held.
func (b *Batcher) dispatch() {
	for batch := b.next(); batch != nil; batch = b.next() {
		go b.flush(batch)
	}
}

// next takes the next batch to send off pending, or returns nil when none
// may go yet (arming the window timer when calls wait for it). b.mu is held.
func (b *Batcher) next() []*takeCall {
	if len(b.pending) == 0 || b.inflight >= b.maxInFlight {
		return nil
	}
	if b.inflight > 0 && len(b.pending) < b.maxBatch && !b.due {
		if !b.armed {
			b.armed = true
			b.timer.Reset(b.window)
		}
		return nil
	}
	n := min(len(b.pending), b.maxBatch)
	batch := make([]*takeCall, n)
	copy(batch, b.pending)
	rest := copy(b.pending, b.pending[n:])
	clear(b.pending[rest:])
	b.pending = b.pending[:rest]
	b.inflight++
	b.due = false
	return batch
}

func (b *Batcher) windowPassed() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.armed = false
	b.due = len(b.pending) > 0
	b.dispatch()
}

// flush sends one batch, then the next ones while there are any to send:
// under load one goroutine keeps going, with the stack it has grown,
// instead of a new goroutine per batch. The calls' own contexts are not
// used: the batch is shared, and the client's per-call timeouts bound it.
func (b *Batcher) flush(batch []*takeCall) {
	for batch != nil {
		if live := unexpired(batch, time.Now()); len(live) > 0 {
			b.r.exec(context.Background(), live, b.coalesce)
		}
		for _, c := range batch {
			close(c.done)
		}
		b.mu.Lock()
		b.inflight--
		batch = b.next()
		b.dispatch()
		b.mu.Unlock()
	}
}

// unexpired returns the calls of batch whose callers still wait at now,
// failing the others with ErrBatchTimeout: no round trip for an answer
// nobody reads (a recovering Redis is not sent the backlog of an outage).
func unexpired(batch []*takeCall, now time.Time) []*takeCall {
	n := 0
	for _, c := range batch {
		if now.Before(c.deadline) {
			n++
		}
	}
	if n == len(batch) {
		return batch
	}
	live := make([]*takeCall, 0, n)
	for _, c := range batch {
		if now.Before(c.deadline) {
			live = append(live, c)
		} else {
			c.err = ErrBatchTimeout
		}
	}
	return live
}

// overLimitCache remembers limits known to reject until some time.
type overLimitCache struct {
	max int

	mu sync.Mutex
	m  map[string]overLimit // by state key
}

type overLimit struct {
	s         spec      // the limit's parameters; s.hits: the fewest hits known rejected
	until     time.Time // rejecting at least until then (monotonic clock)
	recheck   time.Time // asking Redis again from then on (≤ until)
	resetAt   time.Time
	remaining int64
}

func newOverLimitCache(n int) *overLimitCache {
	return &overLimitCache{max: n, m: make(map[string]overLimit)}
}

// sameLimit reports whether a and b describe the same limit.
func sameLimit(a, b *spec) bool {
	return a.code == b.code && a.limit == b.limit && a.period == b.period && a.capacity == b.capacity &&
		a.calendar == b.calendar && a.maxDelay == b.maxDelay
}

// answer returns the decisions for specs if one of them is known to be
// rejected at now.
func (c *overLimitCache) answer(specs []spec, now time.Time) ([]Decision, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.m) == 0 {
		return nil, false
	}
	var ds []Decision
	for i := range specs {
		s := &specs[i]
		if s.hits == 0 {
			continue
		}
		e, ok := c.m[s.key]
		if !ok {
			continue
		}
		if !now.Before(e.recheck) {
			delete(c.m, s.key)
			continue
		}
		if !sameLimit(&e.s, s) || s.hits < e.s.hits {
			continue
		}
		if ds == nil {
			ds = make([]Decision, len(specs))
			for j := range specs {
				ds[j] = Decision{Allowed: true, Limit: specs[j].capacity, Cached: true}
			}
		}
		ds[i] = Decision{
			Allowed:    false,
			Limit:      s.capacity,
			Remaining:  e.remaining,
			ResetAfter: max(e.resetAt.Sub(now), 0),
			RetryAfter: max(e.until.Sub(now), time.Microsecond),
			Cached:     true,
		}
	}
	return ds, ds != nil
}

// learn records the rejections among ds, decided for a Take sent at sent.
func (c *overLimitCache) learn(specs []spec, ds []Decision, sent time.Time) {
	for i := range specs {
		if ds[i].Allowed || ds[i].Cached || specs[i].hits == 0 || repeated(specs, i) {
			continue
		}
		c.mu.Lock()
		if _, ok := c.m[specs[i].key]; !ok && len(c.m) >= c.max {
			c.evict(sent)
		}
		c.m[specs[i].key] = overLimit{
			s:         specs[i],
			until:     sent.Add(ds[i].RetryAfter),
			recheck:   sent.Add(min(ds[i].RetryAfter, OverLimitRecheck)),
			resetAt:   sent.Add(ds[i].ResetAfter),
			remaining: ds[i].Remaining,
		}
		c.mu.Unlock()
	}
}

// repeated reports whether specs[i]'s key appears elsewhere in specs.
func repeated(specs []spec, i int) bool {
	for j := range specs {
		if j != i && specs[j].key == specs[i].key {
			return true
		}
	}
	return false
}

// evict drops the expired entries of a random sample, or else the one that
// expires soonest. c.mu is held.
func (c *overLimitCache) evict(now time.Time) {
	const sample = 16
	var victim string
	var soonest time.Time
	n, dropped := 0, false
	for key, e := range c.m { // map order is random
		if !now.Before(e.recheck) {
			delete(c.m, key)
			dropped = true
		} else if victim == "" || e.recheck.Before(soonest) {
			victim, soonest = key, e.recheck
		}
		if n++; n == sample {
			break
		}
	}
	if !dropped && victim != "" {
		delete(c.m, victim)
	}
}
