package engine

// # Async counting (consistency: async)
//
// A limit whose rule sets consistency: async is decided from the node's
// local view while it is far from its limit: the node admits the request
// without asking Redis, keeps the hits pending, and sends them in a
// pipelined flush (limiter.Redis.Flush: many keys per script call, one call
// per hash slot on a cluster), which counts them in Redis at the times they
// were admitted and reports each limit's remaining: the fleet's total,
// learnt in the same round trip. Near the limit the node does not guess:
// the check goes to Redis exactly as with consistency: exact (after
// flushing the key's pending hits first).
//
// The local view of a key on node i: R, the remaining Redis reported at
// its last flush or exact check, a time a ago (the limit's capacity once
// its reset time has passed); P, the hits node i admitted that R does not
// hold. With C the limit's capacity (its burst, or its limit), N the node
// count (the console's node_count), the key's share on a node is
//
//	S = ⌊C / (100·N)⌋   (1% of the capacity over the fleet)
//
// A check of h hits is admitted locally when the key has a view no older
// than AsyncOptions.MaxAge (2 s) and
//
//	R − P − h ≥ M,   M = N·r·(a + T + 2d) + N·h + (N − 1)·S
//
// with r the key's rate on this node (hits/s, rising at once with a burst,
// decaying over a second), T the flush interval (AsyncOptions.Interval,
// default 100 ms) and d the last flush round trip; or, when it has no
// view (its first check) or an older one, when P + h ≤ S: a node may admit
// its share unseen, whatever the fleet did. Otherwise, and while the key's
// last flush failed, the check goes exact. So a limit with C < 100·N has
// no share: its first check, and checks on an old view, are exact.
//
// Flushes. A key's pending hits are sent at the next interval once P ≥ S,
// at the next tick (10 ms) once R − P < 2M (near the limit), and otherwise
// at the last interval before the oldest of them are AsyncOptions.Hold
// (10 s) old: a key far from its limit, checked less than C/(100·N) times
// in 10 s, costs Redis one key operation per 10 s instead of one per check.
// Hits held so keep four distinct times at most (later ones count at the
// newest of them: up to a hold early). A node holds at most
// S + r·(T + d) of a key's hits that Redis has not counted, so Redis lags
// the fleet by at most N·S (1% of C) on a key far from its limit.
//
// The bound. Every admitted hit reaches Redis (locally admitted ones by a
// flush, exact ones at once), at a time never later than it was admitted:
// the flush times hits on Redis's clock as estimated from earlier flushes
// (limiter.Redis.Flush), rounded down to 1 ms. So Redis refuses a request
// only when the fleet has admitted at least limit − h: async never
// under-admits (short of the loss below). Over-admission: what Redis has
// not counted when it or a node decides is at most Σ_i (S + r_i·(T + d))
// = N·S + F·(T + d), with F the fleet's rate on the key. Hits are counted
// early by up to δ = 1 ms + ρ (ρ the shortest flush round trip seen), and
// held ones (at most S per node) by up to a hold: at a window's start they
// may fall in the window before their own, and a bucket may take them as
// refilled. Per window
//
//	admitted ≤ limit + 2·N·S + F·(T + d + δ)   ≤ limit·1.02 + F·(T + d + δ)
//
// and, when the load is spread evenly over the nodes (r_j ≤ r_i·N/(N−1)),
// M covers the other nodes' unflushed hits, so
//
//	admitted ≤ limit + 2·N·S + F·δ.
//
// Buckets may also take δ of refill per flush (limit × δ / period).
//
// Losses: hits admitted but not yet flushed when a node dies (at most
// S + r·(T + d) per key) are never counted: the fleet over-admits by them.
// Flushes that fail are kept and sent again at the next interval (a
// window's hits count only while their window lasts). A flush that finds
// Redis unreachable (refused, reset: StoreDown), or an open breaker, makes
// the key's checks exact at once, so the store's failure modes (open,
// closed, local) answer for them as for any limit; a flush that times out
// (Redis slow or frozen) leaves the key deciding locally on its ageing
// view (the margin grows with its age a) for at most MaxAge, then its
// checks go exact (no share while its flushes fail) and the failure modes
// answer. A rule change (Apply) retires the keys whose limit changed and
// flushes their pending hits under the old limit at the next interval.
// Close flushes everything.

import (
	"context"
	"crypto/rand"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/enforcer/breaker"
	"github.com/sluicehq/sluice/enforcer/limiter"
	"github.com/sluicehq/sluice/rules"
)

// Defaults of AsyncOptions.
const (
	DefaultAsyncInterval = 100 * time.Millisecond
	DefaultAsyncMaxAge   = 2 * time.Second
	DefaultAsyncHold     = 10 * time.Second
	DefaultAsyncMaxKeys  = 100_000
	DefaultAsyncTimeout  = 500 * time.Millisecond
	// DefaultAsyncGiveUp is within limiter.FlushMarkerTTL, so that a
	// retry never counts twice.
	DefaultAsyncGiveUp = limiter.FlushMarkerTTL / 2
)

// asyncTick is how often keys near their limit are flushed.
const asyncTick = 10 * time.Millisecond

// asyncSlot is the resolution of the times hits are counted at.
const asyncSlot = time.Millisecond

// maxAsyncSlots bounds the times kept per key; past it, hits count at the
// newest time kept (earlier than theirs).
const maxAsyncSlots = 128

// maxAsyncHeldFlush bounds the held keys flushed per interval, so that keys
// held since the same moment go out over a few intervals, not in one
// flush too large to answer in time.
const maxAsyncHeldFlush = 10_000

// asyncHeldSlots bounds the times kept per key that holds its hits (P < S,
// far from its limit): what a flush sends, and Redis parses, stays small
// however long the hold. Its hits may so count up to a hold early; they
// are at most S per node.
const asyncHeldSlots = 4

// asyncShare sets a key's share on a node, S = C / (asyncShare·N): the
// hits (1% of the limit's capacity C over the fleet) a node may admit
// without a view of the key, and keep unflushed while far from the limit.
const asyncShare = 100

// AsyncOptions configures WithAsync; zero values mean the defaults.
type AsyncOptions struct {
	// Interval is the time between flushes of a key's pending hits
	// (default DefaultAsyncInterval).
	Interval time.Duration
	// MaxAge is how old a key's view may be for a local decision (default
	// DefaultAsyncMaxAge); with an older one, the check is decided by the
	// key's share or exactly.
	MaxAge time.Duration
	// Hold is how long a key far from its limit may keep its hits before
	// they are flushed (default DefaultAsyncHold).
	Hold time.Duration
	// MaxKeys bounds the keys tracked (default DefaultAsyncMaxKeys); past
	// it, new keys are checked exactly until idle ones are dropped.
	MaxKeys int
	// Timeout bounds each flush call (default DefaultAsyncTimeout).
	Timeout time.Duration
	// GiveUp is how long a failed flush is sent again before its hits are
	// given up (default, and at most, DefaultAsyncGiveUp).
	GiveUp time.Duration
}

// WithAsync lets the limits whose rule sets consistency: async be counted
// asynchronously through r (the Redis the store counts in). See "Async
// counting" in async.go.
func WithAsync(r *limiter.Redis, o AsyncOptions) Option {
	return func(e *Engine) {
		if o.Interval <= 0 {
			o.Interval = DefaultAsyncInterval
		}
		if o.MaxAge <= 0 {
			o.MaxAge = DefaultAsyncMaxAge
		}
		if o.Hold <= 0 {
			o.Hold = DefaultAsyncHold
		}
		if o.MaxKeys <= 0 {
			o.MaxKeys = DefaultAsyncMaxKeys
		}
		if o.Timeout <= 0 {
			o.Timeout = DefaultAsyncTimeout
		}
		if o.GiveUp <= 0 || o.GiveUp > DefaultAsyncGiveUp {
			o.GiveUp = DefaultAsyncGiveUp
		}
		e.async = &asyncs{e: e, redis: r, opts: o, m: map[leaseKey]*akey{}, stop: make(chan struct{}), nonce: rand.Text()}
	}
}

// AsyncStats reports, since start, how many limits of checks were admitted
// locally (Local) and how many async limits of checks went to the store
// (Exact), how many flush calls were made and failed, and the hits of the
// flushes given up after failing for a while (Dropped: perhaps never
// counted).
type AsyncStats struct {
	Local, Exact, Flushes, FlushErrors, Dropped int64
}

// Async reports whether the engine counts consistency: async limits
// asynchronously (WithAsync).
func (e *Engine) Async() bool { return e.async != nil }

// AsyncStats returns the async counters (zero without WithAsync).
func (e *Engine) AsyncStats() AsyncStats {
	as := e.async
	if as == nil {
		return AsyncStats{}
	}
	return AsyncStats{Local: as.local.Load(), Exact: as.exact.Load(), Flushes: as.flushes.Load(), FlushErrors: as.flushErrors.Load(), Dropped: as.dropped.Load()}
}

// asyncs is the async counting of one engine.
type asyncs struct {
	e     *Engine
	redis *limiter.Redis
	opts  AsyncOptions

	local, exact, flushes, flushErrors atomic.Int64
	dropped                            atomic.Int64 // hits of flushes given up
	nonce                              string       // this engine's part of flush ids
	seq                                atomic.Uint64
	rtt                                atomic.Int64 // ns, the last flush's round trip
	closed                             atomic.Bool

	mu        sync.RWMutex
	m         map[leaseKey]*akey
	lastSweep time.Time

	qmu     sync.Mutex
	queue   []aqueued // keys with pending hits, in the order they got them
	due     []*akey   // of those, keys to flush at the next interval
	urgent  []*akey   // of those, keys near their limit: flushed every tick
	retry   []*abatch // flushes that failed, sent again at the next interval
	running bool      // the flush loop runs
	stop    chan struct{}
	loopWG  sync.WaitGroup
}

// aqueued is a key queued at since.
type aqueued struct {
	k     *akey
	since time.Time
}

// akey is one async key on this node.
type akey struct {
	req     limiter.Request // Hits 0
	domain  string
	entries []rules.Entry // the descriptor that made it, for Apply
	rule    rules.Limit

	mu       sync.Mutex
	have     bool      // known is set
	known    int64     // Redis's remaining at knownAt
	knownAt  time.Time // local monotonic clock
	resetAt  time.Time // when the limit is full again (as of known)
	gen      uint64    // bumped when known is set by a flush
	pending  []aslot   // admitted, not flushed; oldest first
	npending int64
	inflight int64         // hits in a flush not answered yet
	flushing chan struct{} // closed when the flush in flight ends
	failed   bool          // the last flush found Redis unreachable
	stale    bool          // the last flush failed (unreachable or slow)
	queued   bool          // in as.queue
	due      bool          // in as.due
	urgent   bool          // in as.urgent
	dead     bool
	// The key's rate on this node: hits since rateStart, and the rate.
	hits      int64
	rateStart time.Time
	rate      float64
	last      time.Time
}

// aslot is hits admitted from at on (within asyncTick).
type aslot struct {
	at   time.Time
	hits int64
}

// aheld is one limit of a request admitted locally, not final yet.
type aheld struct {
	k          *akey
	hits       int64
	i          int
	remaining  int64
	resetAfter time.Duration
}

// decideAsync is decideLeased for a check's store requests with async
// counting: the async limits that the local view admits are reserved
// there, the others go to decideLeased, and the reservations stand only if
// it admits the request. Async limits that go exact have their pending
// hits flushed first, and refresh the view from the answer.
func (e *Engine) decideAsync(ctx context.Context, res *Result, reqs []limiter.Request, idx []int, descs []Descriptor, shape bool) error {
	as := e.async
	if as == nil || as.closed.Load() || !hasAsync(res.Statuses, idx) {
		return e.decideLeased(ctx, res, reqs, idx, descs, shape)
	}
	var (
		hs    []aheld
		exact []*akey // async keys of requests that go to the store
		eidx  []int   // their status indexes
		gens  []uint64
	)
	now := time.Now()
	nodes := int64(e.NodeCount())
	for j, r := range reqs {
		i := idx[j]
		l := res.Statuses[i].Limit
		if !l.Async || r.Hits <= 0 || descs[i].Override != nil || !limiter.Asyncable(r) {
			continue
		}
		k := as.get(r, l, descs[i].Entries, now)
		if k == nil {
			continue
		}
		if h, ok := k.reserve(as, r.Hits, nodes, now); ok {
			h.i = i
			hs = append(hs, h)
			continue
		}
		exact = append(exact, k)
		eidx = append(eidx, i)
	}
	for _, k := range exact {
		gens = append(gens, as.sync(ctx, k))
	}
	if len(exact) > 0 {
		as.exact.Add(int64(len(exact)))
	}
	if len(hs) > 0 {
		rest := make([]limiter.Request, 0, len(reqs)-len(hs))
		ridx := make([]int, 0, len(reqs)-len(hs))
		for j, r := range reqs {
			if !slices.ContainsFunc(hs, func(h aheld) bool { return h.i == idx[j] }) {
				rest = append(rest, r)
				ridx = append(ridx, idx[j])
			}
		}
		reqs, idx = rest, ridx
	}
	if len(reqs) > 0 {
		if err := e.decideLeased(ctx, res, reqs, idx, descs, shape); err != nil {
			for _, h := range hs {
				h.k.release(h.hits)
			}
			return err
		}
		for n, k := range exact {
			if s := res.Statuses[eidx[n]]; s.Limited() && !s.undecided && !s.StoreFailed {
				k.learn(gens[n], s.Remaining, s.ResetAfter, now)
			}
		}
		if res.Code == OverLimit {
			for _, h := range hs {
				h.k.release(h.hits)
			}
			return nil
		}
	}
	for _, h := range hs {
		s := &res.Statuses[h.i]
		s.Code, s.RetryAfter, s.Delay = OK, 0, 0
		s.Remaining, s.ResetAfter = h.remaining, h.resetAfter
	}
	if len(hs) > 0 {
		as.local.Add(int64(len(hs)))
	}
	return nil
}

// hasAsync reports whether a status at idx has an async limit.
func hasAsync(ss []Status, idx []int) bool {
	for _, i := range idx {
		if ss[i].Limit.Async {
			return true
		}
	}
	return false
}

// get returns r's key entry, made on first use; nil when too many keys are
// tracked.
func (as *asyncs) get(r limiter.Request, l *rules.Limit, entries []rules.Entry, now time.Time) *akey {
	lk := leaseKey{r.Key, r.Algorithm, r.Limit, r.Burst, r.Period, r.Calendar}
	as.mu.RLock()
	k := as.m[lk]
	as.mu.RUnlock()
	if k != nil {
		return k
	}
	as.mu.Lock()
	defer as.mu.Unlock()
	if k = as.m[lk]; k != nil {
		return k
	}
	if len(as.m) >= as.opts.MaxKeys {
		if now.Sub(as.lastSweep) < time.Second {
			return nil
		}
		as.lastSweep = now
		as.sweep(now)
		if len(as.m) >= as.opts.MaxKeys {
			return nil
		}
	}
	req := r
	req.Hits = 0
	k = &akey{req: req, domain: l.Domain, entries: slices.Clone(entries), rule: *l}
	as.m[lk] = k
	return k
}

// sweep drops keys idle for MaxAge that hold nothing; as.mu is held.
func (as *asyncs) sweep(now time.Time) {
	cutoff := now.Add(-as.opts.MaxAge)
	for lk, k := range as.m {
		k.mu.Lock()
		idle := k.npending == 0 && k.inflight == 0 && k.last.Before(cutoff)
		if idle {
			k.dead = true
		}
		k.mu.Unlock()
		if idle {
			delete(as.m, lk)
		}
	}
}

// capacity is the most the key's limit holds.
func (k *akey) capacity() int64 {
	if k.req.Burst > 0 && (k.req.Algorithm == "" || k.req.Algorithm == rules.TokenBucket || k.req.Algorithm == rules.LeakyBucket) {
		return k.req.Burst
	}
	return k.req.Limit
}

// share is the key's share S on a node of nodes (see the package doc).
func (k *akey) share(nodes int64) int64 {
	return k.capacity() / (asyncShare * max(nodes, 1))
}

// reserve admits hits from the local view if it is far enough from the
// limit, or, without a view, if they fit in the key's share (see the
// package doc), adding them to the pending hits.
func (k *akey) reserve(as *asyncs, hits, nodes int64, now time.Time) (aheld, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.last = now
	rate := k.observe(hits, now)
	if k.dead || k.failed {
		return aheld{}, false
	}
	if b := as.e.breaker; b != nil && b.State() == breaker.Open {
		return aheld{}, false // the store is down: the failure modes answer
	}
	share := k.share(nodes)
	unflushed := k.npending + k.inflight
	age := now.Sub(k.knownAt)
	known, resetAt := k.known, k.resetAt
	if !k.have {
		known, resetAt = k.capacity(), now.Add(k.req.Period)
	} else if !now.Before(resetAt) {
		known = k.capacity() // back to full since
		resetAt = now
	}
	est := known - unflushed - hits
	var margin float64
	if !k.have || age > as.opts.MaxAge {
		// No view, or too old to plan with: the hits must fit in the
		// share, whatever the fleet did unseen.
		if k.stale || unflushed+hits > share {
			return aheld{}, false
		}
	} else {
		d := time.Duration(as.rtt.Load())
		margin = float64(nodes)*rate*(age+as.opts.Interval+2*d).Seconds() + float64(nodes*hits) + float64((nodes-1)*share)
		if float64(est) < margin {
			return aheld{}, false
		}
	}
	at := now.Truncate(asyncSlot)
	slots := maxAsyncSlots
	if !k.due && !k.urgent && k.npending+hits < share {
		slots = asyncHeldSlots
	}
	if n := len(k.pending); n > 0 && !k.pending[n-1].at.Before(at) {
		k.pending[n-1].hits += hits
	} else if n >= slots {
		k.pending[n-1].hits += hits // its earlier time only makes them count sooner
	} else {
		k.pending = append(k.pending, aslot{at: at, hits: hits})
	}
	k.npending += hits
	if !k.queued {
		k.queued = true
		as.enqueue(k, queueDeferred, now)
	}
	if !k.due && k.npending >= share {
		// The share unflushed: sent at the next interval.
		k.due = true
		as.enqueue(k, queueDue, now)
	}
	if !k.urgent && margin > 0 && float64(est) < 2*margin {
		// Near the limit: flushed every tick, so that when another node
		// goes exact, Redis lacks at most a tick of this one's hits.
		k.urgent = true
		as.enqueue(k, queueUrgent, now)
	}
	return aheld{k: k, hits: hits, remaining: max(est, 0), resetAfter: max(resetAt.Sub(now), 0)}, true
}

// observe counts hits into the key's rate and returns the rate to plan
// with: the last interval's, or the current one's if higher (a burst),
// decaying by half per second of quiet. k.mu is held.
func (k *akey) observe(hits int64, now time.Time) float64 {
	if k.rateStart.IsZero() {
		k.rateStart = now
	}
	k.hits += hits
	el := now.Sub(k.rateStart)
	if el >= rateInterval {
		measured := float64(k.hits) / el.Seconds()
		decayed := k.rate / (1 + el.Seconds())
		k.rate = max(measured, decayed)
		k.hits, k.rateStart = 0, now
		return k.rate
	}
	return max(k.rate, float64(k.hits)/max(el, asyncTick).Seconds())
}

// release takes back reserved hits of a request that was refused or
// failed (from the newest times; if they were flushed already, they stay
// counted: a few hits of under-admission).
func (k *akey) release(hits int64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for i := len(k.pending) - 1; i >= 0 && hits > 0; i-- {
		n := min(k.pending[i].hits, hits)
		k.pending[i].hits -= n
		k.npending -= n
		hits -= n
		if k.pending[i].hits == 0 {
			k.pending = k.pending[:i]
		}
	}
}

// learn sets the view from an exact check's answer, unless a flush has
// answered since gen was read (its answer is newer).
func (k *akey) learn(gen uint64, remaining int64, resetAfter time.Duration, sent time.Time) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.gen != gen {
		return
	}
	k.have, k.failed, k.stale = true, false, false
	k.known, k.knownAt = remaining, sent
	k.resetAt = time.Now().Add(resetAfter)
}

// sync flushes k's pending hits before an exact check of it, waiting for
// a flush in flight, so that Redis holds every hit this node admitted; it
// returns the view's generation. A key whose flushes fail, or with the
// breaker open, is not flushed here (the flush loop retries it).
func (as *asyncs) sync(ctx context.Context, k *akey) uint64 {
	k.mu.Lock()
	wait := k.flushing
	skip := k.failed || (k.npending == 0 && wait == nil)
	k.mu.Unlock()
	if b := as.e.breaker; b != nil && b.State() != breaker.Closed {
		skip = true
	}
	if !skip {
		if wait != nil {
			t := time.NewTimer(as.opts.Timeout)
			select {
			case <-wait:
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
		}
		as.flush(ctx, []*akey{k})
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.gen
}

// The queues of enqueue.
const (
	queueDeferred = iota // flushed once its hits are Hold old
	queueDue             // flushed at the next interval
	queueUrgent          // flushed at the next tick
)

// enqueue adds k to one of the queues the flush loop sends, starting the
// loop.
func (as *asyncs) enqueue(k *akey, queue int, now time.Time) {
	as.qmu.Lock()
	switch queue {
	case queueUrgent:
		as.urgent = append(as.urgent, k)
	case queueDue:
		as.due = append(as.due, k)
	default:
		as.queue = append(as.queue, aqueued{k, now})
	}
	as.startLoop()
}

// startLoop starts the flush loop unless it runs (or the engine closed)
// and unlocks as.qmu, which the caller holds.
func (as *asyncs) startLoop() {
	start := !as.running && !as.closed.Load()
	if start {
		as.running = true
		as.loopWG.Add(1)
	}
	as.qmu.Unlock()
	if start {
		go as.loop()
	}
}

// loop flushes the urgent keys every tick (asyncTick), the due ones every
// interval, and the others once their oldest hits are Hold old; it ends
// after a second with nothing queued (enqueue starts it again).
func (as *asyncs) loop() {
	defer as.loopWG.Done()
	tick := min(asyncTick, as.opts.Interval)
	t := time.NewTicker(tick)
	defer t.Stop()
	var idle, since time.Duration
	for {
		select {
		case <-t.C:
		case <-as.stop:
			return
		}
		since += tick
		as.qmu.Lock()
		keys := as.urgent
		as.urgent = nil
		retries := false
		if since >= as.opts.Interval {
			since = 0
			retries = len(as.retry) > 0
			keys = append(keys, as.due...)
			as.due = nil
			cutoff := time.Now().Add(as.opts.Interval - as.opts.Hold)
			n := 0
			for n < len(as.queue) && n < maxAsyncHeldFlush && as.queue[n].since.Before(cutoff) {
				keys = append(keys, as.queue[n].k)
				n++
			}
			as.queue = slices.Delete(as.queue, 0, n)
		}
		if len(keys) == 0 && len(as.queue) == 0 && len(as.due) == 0 && len(as.retry) == 0 {
			idle += tick
			if idle >= time.Second {
				as.running = false
				as.qmu.Unlock()
				return
			}
		}
		as.qmu.Unlock()
		if retries {
			idle = 0
			as.sendRetries(context.Background())
		}
		if len(keys) > 0 {
			idle = 0
			as.flush(context.Background(), keys)
		}
	}
}

// flush sends the pending hits of keys in one Redis.Flush and sets their
// views from the answer. Keys with a flush in flight are flushed again at
// the next interval; a flush that fails is sent again (see send).
func (as *asyncs) flush(ctx context.Context, keys []*akey) {
	b := &abatch{first: time.Now()}
	var again []*akey
	for _, k := range keys {
		k.mu.Lock()
		k.queued, k.due, k.urgent = false, false, false
		switch {
		case k.npending == 0 && k.flushing == nil:
			// Nothing to send (released, or flushed by a check).
		case k.flushing != nil:
			k.due = true
			again = append(again, k)
		default:
			b.keys = append(b.keys, k)
			b.slots = append(b.slots, k.pending)
			k.inflight += k.npending
			k.pending, k.npending = nil, 0
			k.flushing = make(chan struct{})
		}
		k.mu.Unlock()
	}
	if len(again) > 0 {
		as.requeue(again)
	}
	if len(b.keys) == 0 {
		return
	}
	b.id = as.nonce + ":" + strconv.FormatUint(as.seq.Add(1), 36)
	as.send(ctx, b)
}

// abatch is one flush: its keys' hits, held in flight until Redis answers.
type abatch struct {
	id    string // the flush's id for Redis.Flush, unique on the fleet
	keys  []*akey
	slots [][]aslot // per key, the hits sent
	first time.Time // when it was first sent
}

// send sends b and settles its keys. A flush that fails may have been
// counted all the same (a timeout after Redis got it), so its hits are not
// sent again as new ones, which could count them twice and refuse the
// fleet early: b is sent again as it was, with its id, at the next
// interval, and Redis counts each of its calls once. Its keys stay in
// flight meanwhile (their new hits wait), their views ageing. A flush that
// keeps failing for AsyncOptions.GiveUp is given up: its hits may then never be
// counted (the fleet over-admits by them, as when a node dies), and
// AsyncStats counts them.
func (as *asyncs) send(ctx context.Context, b *abatch) {
	now := time.Now()
	fs := make([]limiter.Flush, len(b.keys))
	for n, k := range b.keys {
		adm := make([]limiter.Admitted, len(b.slots[n]))
		for i, s := range b.slots[n] {
			adm[i] = limiter.Admitted{Age: now.Sub(s.at), Hits: s.hits}
		}
		fs[n] = limiter.Flush{Req: k.req, Admitted: adm}
	}
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), as.opts.Timeout)
	out, err := as.redis.Flush(fctx, now, b.id, fs)
	cancel()
	done := time.Now()
	as.flushes.Add(1)
	if err == nil {
		as.rtt.Store(int64(done.Sub(now)))
		for n := range out {
			if out[n].Err != nil {
				err = out[n].Err
				break
			}
		}
	}
	if err != nil {
		as.flushErrors.Add(1)
		giveUp := done.Sub(b.first) >= as.opts.GiveUp
		for n, k := range b.keys {
			k.mu.Lock()
			// Unreachable: the key's checks go exact, and the failure
			// modes answer. Slow (a timeout): its view keeps ageing, and
			// the margin grows with it, up to MaxAge.
			k.failed = k.failed || StoreDown(err)
			k.stale = true
			if giveUp {
				units := slotHits(b.slots[n])
				k.inflight -= units
				as.dropped.Add(units)
				close(k.flushing)
				k.flushing = nil
			}
			k.mu.Unlock()
		}
		if !giveUp {
			as.qmu.Lock()
			as.retry = append(as.retry, b)
			as.startLoop() // a check's flush (sync) may have failed with the loop stopped
		}
		return
	}
	for n, k := range b.keys {
		k.mu.Lock()
		k.inflight -= slotHits(b.slots[n])
		k.failed, k.stale = false, false
		k.have = true
		k.known, k.knownAt = out[n].Remaining, now
		k.resetAt = done.Add(out[n].ResetAfter)
		k.gen++
		close(k.flushing)
		k.flushing = nil
		k.mu.Unlock()
	}
}

// slotHits sums the hits of s.
func slotHits(s []aslot) int64 {
	var n int64
	for _, x := range s {
		n += x.hits
	}
	return n
}

// sendRetries sends again the flushes that failed.
func (as *asyncs) sendRetries(ctx context.Context) {
	as.qmu.Lock()
	bs := as.retry
	as.retry = nil
	as.qmu.Unlock()
	for _, b := range bs {
		as.send(ctx, b)
	}
}

// requeue queues keys for the next interval (their due flags are set).
func (as *asyncs) requeue(keys []*akey) {
	as.qmu.Lock()
	as.due = append(as.due, keys...)
	as.qmu.Unlock()
}

// changed retires the keys whose limit no longer applies as it was; their
// pending hits are flushed under the old limit by the flush loop.
func (as *asyncs) changed(set *rules.Set) {
	if as == nil {
		return
	}
	var gone []*akey
	as.mu.Lock()
	for lk, k := range as.m {
		nl := set.Match(k.domain, k.entries)
		if nl == nil || !sameCounting(nl, &k.rule) || nl.Async != k.rule.Async {
			delete(as.m, lk)
			gone = append(gone, k)
		}
	}
	as.mu.Unlock()
	for _, k := range gone {
		k.mu.Lock()
		k.dead = true
		queue := k.npending > 0 && !k.due
		if queue {
			k.due = true
		}
		k.mu.Unlock()
		if queue {
			as.enqueue(k, queueDue, time.Time{})
		}
	}
}

// close flushes every pending hit and stops the flush loop.
func (as *asyncs) close(ctx context.Context) error {
	as.closed.Store(true)
	as.qmu.Lock()
	if as.running {
		close(as.stop)
		as.running = false
	}
	as.qmu.Unlock()
	as.loopWG.Wait()
	as.mu.Lock()
	var keys []*akey
	for _, k := range as.m {
		keys = append(keys, k)
	}
	as.mu.Unlock()
	as.qmu.Lock()
	for _, q := range as.queue { // retired ones too
		keys = append(keys, q.k)
	}
	keys = append(keys, as.due...)
	as.queue, as.due, as.urgent = nil, nil, nil
	as.qmu.Unlock()
	for range 3 { // a key with a flush in flight comes back once
		var left []*akey
		for _, k := range keys {
			k.mu.Lock()
			if k.npending > 0 || k.flushing != nil {
				left = append(left, k)
			}
			k.mu.Unlock()
		}
		if len(left) == 0 || ctx.Err() != nil {
			break
		}
		as.sendRetries(ctx)
		as.flush(ctx, left)
		keys = left
	}
	return ctx.Err()
}
