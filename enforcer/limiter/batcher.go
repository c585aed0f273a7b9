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
	// own (twice the timeout). The Take that sends its batch itself waits
	// for the round trip it sent, which may end up to a tenth of Timeout
	// after its own deadline (see Batcher). A Take whose time is up before
	// its batch is sent is not sent. A Take spanning Redis Cluster slots
	// gets one Timeout for its reservations on every slot together, and,
	// when one refused, one more for giving back what the others took.
	Timeout time.Duration
}

// ErrBatchTimeout is the error of a Take that waited its Batcher's Timeout.
var ErrBatchTimeout = errors.New("limiter: no answer from Redis within the timeout")

// Batcher is the node's way to Redis: a Store with Redis's Take semantics
// that sends concurrent Takes together. It is safe for concurrent use and
// needs no closing (it keeps no goroutine).
//
// Batching: a Take that arrives while nothing is in flight goes at once;
// Takes that arrive while round trips are in flight wait up to Window (or
// until MaxBatch are waiting, or a round trip ends and none is left) and go
// together in one pipeline.
//
// Group commit: the first Take of a batch leads it. It waits for the batch
// to be due, sends it, reads the reply on its own goroutine and wakes the
// others, one wakeup each; no other goroutine is involved. The round trip
// ends by the batch's latest deadline (nobody waits for it after that), so
// a leader, whose deadline is the batch's earliest, may wait up to a tenth
// of the Timeout longer than the others; a batch whose deadlines spread
// wider, or whose leader's context has ended, is sent by a goroutine of its
// own. A leader whose time is up, or whose context ends, before its batch
// is sent leaves a goroutine to lead it in its place. On a Redis Cluster
// every round trip runs on a goroutine of its own, bounded only by the
// client's timeouts, as a pipeline there must be: go-redis fails every
// command of a cluster pipeline whose context ends while it retries one
// node, those other nodes answered included, which would hide what a Take
// spanning slots reserved from its refund.
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
// specific to the limit's parameters, expire at their time and are bounded
// by OverLimitEntries. A rejection that depended on another request of the
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
	queue    []*batch // batches not sent yet, oldest first; only the last may take more calls
	inflight int      // round trips in flight
}

// batch is a group of calls sent in one round trip.
type batch struct {
	calls  []*takeCall
	opened time.Time // when its leader arrived: its window runs from then
	full   bool      // it takes no more calls
	// kick tells the leader to look again (the batch filled up, or a round
	// trip ended); buffered, so no kick is lost while the leader is busy.
	kick chan struct{}
}

func (bt *batch) wake() {
	select {
	case bt.kick <- struct{}{}:
	default:
	}
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
	return b
}

// Take decides reqs like Redis.Take (all-or-nothing, one Decision per
// request, in order), batched with the node's other Takes, or from the
// over-limit cache. An error means no decision was made (Redis unreachable
// or slow, ctx done, invalid request); the caller's failure mode decides.
// When ctx ends first, Take returns at once (or, if it is sending its
// batch, when that round trip ends, within its time), but the Take may
// still be decided, and count, in Redis.
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
// reservations of a Take spanning slots carry the first one's), or ctx's.
func (b *Batcher) run(ctx context.Context, calls []*takeCall) error {
	now := time.Now()
	deadline := now.Add(b.timeout)
	for _, c := range calls {
		c.done = make(chan struct{})
		if !c.deadline.IsZero() && c.deadline.Before(deadline) {
			deadline = c.deadline
		}
	}
	byCtx := false // the deadline is ctx's: ending there is ctx's error
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline, byCtx = d, true
	}
	for _, c := range calls {
		c.deadline = deadline
	}
	b.mu.Lock()
	bt, lead := b.join(calls, now)
	if !lead {
		b.mu.Unlock()
		return wait(ctx, calls, deadline, byCtx)
	}
	return b.lead(ctx, bt, calls, deadline, byCtx)
}

// join adds calls to the open batch, or opens a new one when there is none
// or they do not fit, and reports whether the caller leads it. b.mu is held.
func (b *Batcher) join(calls []*takeCall, now time.Time) (*batch, bool) {
	if n := len(b.queue); n > 0 && !b.queue[n-1].full {
		last := b.queue[n-1]
		if len(last.calls)+len(calls) <= b.maxBatch {
			last.calls = append(last.calls, calls...)
			if len(last.calls) == b.maxBatch {
				last.full = true
				last.wake()
			}
			return last, false
		}
		last.full = true
		last.wake()
	}
	// A copy: calls may be the start of a longer slice of the caller's.
	bt := &batch{calls: append(make([]*takeCall, 0, 8), calls...), opened: now, kick: make(chan struct{}, 1)}
	bt.full = len(bt.calls) >= b.maxBatch
	b.queue = append(b.queue, bt)
	return bt, true
}

// due reports whether bt, first in the queue, may be sent at now: a round
// trip may start, and nothing is in flight, or bt is full, or its window has
// passed. b.mu is held.
func (b *Batcher) due(bt *batch, now time.Time) bool {
	return b.inflight < b.maxInFlight &&
		(b.inflight == 0 || bt.full || !now.Before(bt.opened.Add(b.window)))
}

// lead waits until bt is due, then sends it. mine are the leader's own
// calls, and deadline is when it stops waiting; a leader with none (mine
// nil) is a goroutine that took over from a leader that left. b.mu is held
// on entry, and released.
func (b *Batcher) lead(ctx context.Context, bt *batch, mine []*takeCall, deadline time.Time, byCtx bool) error {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		now := time.Now()
		first := b.queue[0] == bt
		if first && b.due(bt, now) {
			b.queue[0] = nil
			b.queue = b.queue[1:]
			b.inflight++
			b.wakeFirst()
			b.mu.Unlock()
			return b.send(ctx, bt, mine, deadline, byCtx)
		}
		// Sleep until kicked (bt is full, or first with a round trip
		// ended or started), the window passes (when only that holds it
		// back), or the leader's own time is up.
		wakeAt := deadline
		if first && b.inflight < b.maxInFlight {
			if w := bt.opened.Add(b.window); wakeAt.IsZero() || w.Before(wakeAt) {
				wakeAt = w
			}
		}
		b.mu.Unlock()
		var alarm <-chan time.Time
		if !wakeAt.IsZero() {
			if timer == nil {
				timer = time.NewTimer(wakeAt.Sub(now))
			} else {
				timer.Reset(wakeAt.Sub(now))
			}
			alarm = timer.C
		}
		select {
		case <-bt.kick:
		case <-alarm:
		case <-ctx.Done():
		}
		if mine != nil && (ctx.Err() != nil || !time.Now().Before(deadline)) {
			// Leave, and leave the batch a leader: the others' calls (and
			// ours, until they expire) still go.
			go func() {
				b.mu.Lock()
				_ = b.lead(context.Background(), bt, nil, time.Time{}, false)
			}()
			return waitErr(ctx, byCtx)
		}
		b.mu.Lock()
	}
}

// wakeFirst wakes the leader of the first batch in the queue, which may
// now be due. b.mu is held.
func (b *Batcher) wakeFirst() {
	if len(b.queue) > 0 {
		b.queue[0].wake()
	}
}

// sendSlack is how much earlier than the batch's latest deadline a leader's
// own may be for it to send the batch itself, bounded by its own deadline.
// It cuts the wait of the batch's others by at most that much, and only
// when Redis is about to time out anyway.
func (b *Batcher) sendSlack() time.Duration { return b.timeout / 10 }

// send sends bt (taken off the queue, its round trip counted in flight),
// bounded by the latest deadline of its calls still waited for, and wakes
// its callers: on the leader's goroutine when the leader's context is live
// and its deadline within sendSlack of that one; else (and on a cluster)
// on a goroutine of its own, the leader waiting as the others do.
func (b *Batcher) send(ctx context.Context, bt *batch, mine []*takeCall, deadline time.Time, byCtx bool) error {
	now := time.Now()
	live := unexpired(bt.calls, now)
	var latest time.Time
	for _, c := range live {
		if c.deadline.After(latest) {
			latest = c.deadline
		}
	}
	if mine == nil {
		b.roundTrip(bt, live, latest)
		return nil
	}
	if b.r.cluster != nil || ctx.Err() != nil || !now.Before(deadline) || deadline.Add(b.sendSlack()).Before(latest) {
		go b.roundTrip(bt, live, latest)
		return wait(ctx, mine, deadline, byCtx)
	}
	b.roundTrip(bt, live, latest)
	if ctx.Err() != nil {
		return waitErr(ctx, byCtx)
	}
	return lateErr(ctx, mine, deadline, byCtx)
}

// roundTrip sends live (the calls of bt still waited for), bounded by until
// (on a cluster, by the client's timeouts alone: see Batcher), then frees
// its place in flight, letting the next batch go, and wakes bt's callers.
// The calls' own contexts are not used: the batch is shared.
func (b *Batcher) roundTrip(bt *batch, live []*takeCall, until time.Time) {
	if len(live) > 0 {
		ctx, cancel := context.Background(), context.CancelFunc(func() {})
		if b.r.cluster == nil {
			ctx, cancel = context.WithDeadline(ctx, until)
		}
		b.r.exec(ctx, live, b.coalesce)
		cancel()
	}
	b.mu.Lock()
	b.inflight--
	b.wakeFirst()
	b.mu.Unlock()
	for _, c := range bt.calls {
		close(c.done)
	}
}

// wait waits for calls to be decided, until deadline or ctx's end.
func wait(ctx context.Context, calls []*takeCall, deadline time.Time, byCtx bool) error {
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for _, c := range calls {
		select {
		case <-c.done:
		case <-timer.C:
			return waitErr(ctx, byCtx)
		case <-ctx.Done():
			return waitErr(ctx, byCtx)
		}
	}
	return lateErr(ctx, calls, deadline, byCtx)
}

// lateErr is waitErr if a call failed once its deadline had passed: the
// round trip ended at the batch's latest deadline, which was the caller's
// (or, for a leader, within sendSlack after it), so the caller reports
// giving up, as one whose timer fired first does, and its caller treats
// the calls as possibly still taking (refundLater), not as refused.
func lateErr(ctx context.Context, calls []*takeCall, deadline time.Time, byCtx bool) error {
	if firstErr(calls) != nil && !time.Now().Before(deadline) {
		return waitErr(ctx, byCtx)
	}
	return nil
}

// waitErr is the error of a Take that stopped waiting: ctx's when it ended
// (or its deadline was the one reached), else the Batcher's timeout.
func waitErr(ctx context.Context, byCtx bool) error {
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("wait for limiter batch: %w", ctx.Err())
	case byCtx:
		return fmt.Errorf("wait for limiter batch: %w", context.DeadlineExceeded)
	}
	return fmt.Errorf("wait for limiter batch: %w", ErrBatchTimeout)
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
		if !now.Before(e.until) {
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
		if !now.Before(e.until) {
			delete(c.m, key)
			dropped = true
		} else if victim == "" || e.until.Before(soonest) {
			victim, soonest = key, e.until
		}
		if n++; n == sample {
			break
		}
	}
	if !dropped && victim != "" {
		delete(c.m, victim)
	}
}
