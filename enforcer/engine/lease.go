package engine

// # Leases (lease: true)
//
// A limit whose rule sets lease: true may be served from a local lease on a
// hot key: the node takes part of the limit's remaining quota in one script
// call (limiter.Redis.Lease), consuming it in Redis up front, and admits
// requests against it without asking Redis until it is spent or expires,
// then gives back what it did not use (limiter.Redis.Return). Refusals
// always come from Redis: a request that does not fit in the node's lease
// goes to Redis as usual, exactly.
//
// Which algorithms: token_bucket and leaky_bucket in policing mode (a lease
// is tokens taken early), fixed_window and sliding_window_counter (units of
// the current window). Not sliding_window_log (validation refuses it: its
// exactness is one log entry per request at the time it is admitted), not a
// shaping leaky_bucket or an on_limit: delay token bucket on a shaping
// caller (each request needs its own delay), not shadow-mode limits (they
// never refuse) and not a caller's limit override.
//
// When: the rule opts in, and the key is hot on this node: at least
// LeaseOptions.MinRate checks per second (default 100), measured over 100 ms
// first in a fixed array of 4,096 counters the keys hash into (so a rule
// with many cold keys tracks none of them), then per key.
//
// How much and how long, with N the console's node count and R the limit's
// remaining when the lease is asked for (Redis computes both in the grant):
//   - a grant is at most floor(R / (2N)), at most what the node used of the
//     key in one lifetime at its recent rate (so an idle node never holds
//     much), and at most LeaseOptions.MaxUnits;
//   - no grant when R < max(capacity/10, 2N): the last tenth of a limit is
//     decided in Redis, request by request;
//   - a lease lives min(period/10, LeaseOptions.MaxLifetime (1 s)) and, for
//     a window algorithm, never past the end of the window its units were
//     counted in (measured on the node's monotonic clock from before the
//     grant was sent, so it ends no later than Redis's window does);
//   - a node refills ahead (when less than a quarter of its last grant is
//     left), merging what is left into the new lease: it holds one lease per
//     key, of at most its last grant plus a quarter of the one before.
//
// The bounds. Never above the limit: every unit a node admits from a lease
// was counted in Redis first, in the window it is admitted in; for a bucket,
// a leased token is spent at most two lifetimes after it was taken (so a
// bucket may admit, in one instant, its burst plus what nodes took in the
// last two lifetimes and not yet spent, while its rate over any longer
// interval is unchanged). Under the limit by at most: a node is refused (R
// below its hits, in Redis) while each other node holds at most its last
// two grants' unspent units, each grant at most R/(2N) of the R left when
// it was made and at most what that node used of the key in one lifetime;
// those units are spent, or back in Redis, within one lifetime. So a node
// that uses its lease cannot starve another for longer than a lifetime, and
// an idle one holds little. What is unspent when a window ends is lost with
// that window (the window under-admits by it).
//
// All-or-nothing holds across a request's limits: the leased ones are
// reserved locally first; if the request's other limits (asked from Redis
// in one Take) refuse it, or Redis fails, the reservations go back into the
// leases and nothing was consumed.
//
// Rule changes: Apply retires the leases of every limit the new ruleset
// changes or removes (no check spends them after Apply returns, except one
// that had reserved before it) and returns their units asynchronously;
// the leases of unchanged limits keep serving. Close returns every lease
// (graceful shutdown).
//
// Redis outage: an unexpired lease keeps serving, since its units were
// counted before the outage (never over-admits, and it lasts at most one
// lifetime); once it is spent or expired, requests go to Redis and the
// limit's failure_mode decides. A request that also needs Redis for a
// non-leased limit gets its failure modes for every limit, leased ones
// included. Units of leases that expire during the outage cannot be
// returned and are lost (under-admission, never over).

import (
	"cmp"
	"context"
	"hash/maphash"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/enforcer/limiter"
	"github.com/sluicehq/sluice/rules"
)

// LeaseOptions configures WithLeases; zero values mean the defaults.
type LeaseOptions struct {
	// MinRate is the checks per second one key must see on this node before
	// the node leases it (default 100). Negative: lease from the first
	// check (tests).
	MinRate float64
	// MaxLifetime caps a lease's life (default 1 s); it is also at most a
	// tenth of the limit's period.
	MaxLifetime time.Duration
	// MaxUnits caps one grant (default 1<<20).
	MaxUnits int64
	// Units, when set, is what every grant asks for instead of the units
	// the key used in one lifetime (tests and benchmarks); MaxUnits and
	// Redis's cap still apply.
	Units int64
	// MaxKeys bounds the keys tracked for leases (default 10,000); past it,
	// new keys are not leased until idle ones are dropped.
	MaxKeys int
	// Timeout bounds each lease and return call (default
	// limiter.DefaultTimeout).
	Timeout time.Duration
}

// WithLeases lets the limits whose rule sets lease: true be served from
// local leases taken through r (the Redis the store counts in). See
// "Leases" in lease.go.
func WithLeases(r *limiter.Redis, o LeaseOptions) Option {
	return func(e *Engine) {
		if o.MinRate == 0 {
			o.MinRate = 100
		}
		if o.MaxLifetime <= 0 {
			o.MaxLifetime = time.Second
		}
		if o.MaxUnits <= 0 {
			o.MaxUnits = 1 << 20
		}
		if o.MaxKeys <= 0 {
			o.MaxKeys = 10_000
		}
		if o.Timeout <= 0 {
			o.Timeout = limiter.DefaultTimeout
		}
		e.leases = &leases{e: e, redis: r, opts: o, m: map[leaseKey]*lease{}}
		e.leases.heat.seed = maphash.MakeSeed()
	}
}

// LeaseStats reports how many checks' limits were admitted from local
// leases, and how many units leases were granted in all, since start.
func (e *Engine) LeaseStats() (admitted, granted int64) {
	if e.leases == nil {
		return 0, 0
	}
	return e.leases.admitted.Load(), e.leases.granted.Load()
}

// Close returns every unused leased unit to Redis and flushes every
// pending async hit (graceful shutdown), and stops leasing and async
// counting. Checks after Close go to the store.
func (e *Engine) Close(ctx context.Context) error {
	var err error
	if e.async != nil {
		err = e.async.close(ctx)
	}
	if e.leases != nil {
		err = cmp.Or(e.leases.close(ctx), err)
	}
	return err
}

// Leases of one engine.
type leases struct {
	e        *Engine
	redis    *limiter.Redis
	opts     LeaseOptions
	admitted atomic.Int64
	granted  atomic.Int64
	closed   atomic.Bool

	heat heat // which keys not tracked yet are hot

	mu        sync.RWMutex
	m         map[leaseKey]*lease
	lastSweep time.Time
}

// heat counts checks per key in a fixed array of slots (keys hash into
// them) per rateInterval, so that a key gets a lease entry only once it
// is seen at MinRate: a rule with many cold keys costs a check one hash
// and one atomic add, not a map entry per key.
type heat struct {
	seed  maphash.Seed
	slots [4096]atomic.Uint64 // interval number << 32 | hits in it
}

// hot adds hits to key's slot and reports whether the slot has seen at
// least rate per second in the current interval.
func (h *heat) hot(key string, hits int64, now time.Time, rate float64) bool {
	s := &h.slots[maphash.String(h.seed, key)%uint64(len(h.slots))]
	iv := uint64(now.UnixNano()/int64(rateInterval)) & math.MaxUint32
	for {
		v := s.Load()
		n := uint64(min(max(hits, 0), math.MaxUint32))
		if v>>32 == iv {
			n = min(v&math.MaxUint32+n, math.MaxUint32)
		}
		if s.CompareAndSwap(v, iv<<32|n) {
			return float64(n) >= rate*rateInterval.Seconds()
		}
	}
}

// leaseKey is a limit's state key with its counting parameters: a rule
// change that alters them makes a new lease, never reuses the old one.
type leaseKey struct {
	key          string
	alg          rules.Algorithm
	limit, burst int64
	period       time.Duration
	calendar     bool
}

// lease is one key's lease on this node.
type lease struct {
	req     limiter.Request // Hits 0
	domain  string
	entries []rules.Entry // the descriptor that made it, for Apply
	rule    rules.Limit   // the limit it was made for, for Apply

	mu       sync.Mutex
	units    int64     // unspent leased units
	expires  time.Time // local monotonic clock
	grant    limiter.Grant
	gen      uint64 // bumped per grant and when dropped
	want     int64  // the last grant asked for
	fetching bool
	retryAt  time.Time
	dead     bool
	// The key's rate on this node: hits since rateStart, and the rate
	// measured over the last full interval.
	hits      int64
	rateStart time.Time
	rate      float64
	last      time.Time // last check
	// Reported to clients for a check admitted from the lease: Redis's
	// remaining after the grant, and when the limit resets.
	remaining int64
	resetAt   time.Time
}

const rateInterval = 100 * time.Millisecond

// held is one limit of a request admitted from a lease, not yet final,
// with what its status reports (as of the grant the hits came from).
type held struct {
	l          *lease
	gen        uint64
	hits       int64
	i          int // status index
	remaining  int64
	resetAfter time.Duration
}

// decideLeased is decide for a check's store requests (reqs, of statuses
// idx) with leases: the limits that fit in a lease are reserved there, the
// others go to the store in one Take, and the reservations stand only if
// that Take admits the request.
func (e *Engine) decideLeased(ctx context.Context, res *Result, reqs []limiter.Request, idx []int, descs []Descriptor, shape bool) error {
	ls := e.leases
	if ls == nil || ls.closed.Load() {
		return e.decide(ctx, false, res, reqs, idx)
	}
	var (
		hs   []held
		rest []limiter.Request
		ridx []int
	)
	for j, r := range reqs {
		i := idx[j]
		l := res.Statuses[i].Limit
		if !l.Lease || l.ShadowMode || r.Hits <= 0 || descs[i].Override != nil ||
			(shape && l.OnLimit.Action == rules.Delay) || !limiter.Leasable(r) {
			continue
		}
		le := ls.get(r, res.Statuses[i].Limit, descs[i].Entries)
		if le == nil {
			continue
		}
		if h, ok := le.reserve(ls, r.Hits); ok {
			if hs == nil {
				hs = make([]held, 0, len(reqs))
			}
			h.i = i
			hs = append(hs, h)
		}
	}
	if len(hs) == 0 {
		return e.decide(ctx, false, res, reqs, idx)
	}
	if len(hs) < len(reqs) {
		rest = make([]limiter.Request, 0, len(reqs)-len(hs))
		ridx = make([]int, 0, len(reqs)-len(hs))
		for j, r := range reqs {
			if !slices.ContainsFunc(hs, func(h held) bool { return h.i == idx[j] }) {
				rest = append(rest, r)
				ridx = append(ridx, idx[j])
			}
		}
		if err := e.decide(ctx, false, res, rest, ridx); err != nil {
			for _, h := range hs {
				h.l.release(h.gen, h.hits)
			}
			return err
		}
		if res.Code == OverLimit {
			for _, h := range hs {
				h.l.release(h.gen, h.hits)
			}
		}
	}
	for _, h := range hs {
		s := &res.Statuses[h.i]
		s.Code, s.RetryAfter, s.Delay = OK, 0, 0
		s.Remaining, s.ResetAfter = h.remaining, h.resetAfter
	}
	if res.Code != OverLimit {
		ls.admitted.Add(1)
	}
	return nil
}

// get returns the lease entry of r's limit, made on first use; nil when
// too many keys are tracked.
func (ls *leases) get(r limiter.Request, l *rules.Limit, entries []rules.Entry) *lease {
	k := leaseKey{r.Key, r.Algorithm, r.Limit, r.Burst, r.Period, r.Calendar}
	ls.mu.RLock()
	le := ls.m[k]
	ls.mu.RUnlock()
	if le != nil {
		return le
	}
	now := time.Now()
	if ls.opts.MinRate >= 0 && !ls.heat.hot(r.Key, r.Hits, now, ls.opts.MinRate) {
		return nil // not hot: Redis decides, and nothing is tracked
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if le = ls.m[k]; le != nil {
		return le
	}
	if len(ls.m) >= ls.opts.MaxKeys {
		if now.Sub(ls.lastSweep) < time.Second {
			return nil
		}
		ls.lastSweep = now
		ls.sweep()
		if len(ls.m) >= ls.opts.MaxKeys {
			return nil
		}
	}
	req := r
	req.Hits = 0
	le = &lease{req: req, domain: l.Domain, entries: slices.Clone(entries), rule: *l}
	ls.m[k] = le
	return le
}

// sweep drops entries idle for a second that hold nothing; ls.mu is held.
func (ls *leases) sweep() {
	cutoff := time.Now().Add(-time.Second)
	for k, le := range ls.m {
		le.mu.Lock()
		idle := le.units == 0 && !le.fetching && le.last.Before(cutoff)
		if idle {
			le.dead = true
			le.gen++
		}
		le.mu.Unlock()
		if idle {
			delete(ls.m, k)
		}
	}
}

// reserve takes hits from the lease if it holds them, and starts a refill
// when it runs low on a hot key. It returns the lease generation the hits
// came from and what the check reports: Redis's remaining after that grant
// plus what is left of it, and the time to the limit's reset.
func (le *lease) reserve(ls *leases, hits int64) (held, bool) {
	le.mu.Lock()
	// The time is read under the lock: read before it, it could be from
	// before the lease expired, however long the wait for the lock.
	now := time.Now()
	le.last = now
	le.hits += hits
	if le.rateStart.IsZero() {
		le.rateStart = now
	} else if el := now.Sub(le.rateStart); el >= rateInterval {
		le.rate = float64(le.hits) / el.Seconds()
		le.hits, le.rateStart = 0, now
	}
	live := !le.dead && now.Before(le.expires)
	ok := live && le.units >= hits
	h := held{l: le, gen: le.gen, hits: hits}
	if ok {
		le.units -= hits
		h.remaining, h.resetAfter = le.remaining+le.units, max(le.resetAt.Sub(now), 0)
	}
	fetch := !le.dead && !le.fetching && (!live || le.units < le.want/4 || le.units < hits) &&
		!now.Before(le.retryAt) && (ls.opts.MinRate < 0 || le.rate >= ls.opts.MinRate)
	if fetch {
		le.fetching = true
	}
	rate := le.rate
	le.mu.Unlock()
	if fetch {
		go ls.refill(le, rate)
	}
	return h, ok
}

// release puts reserved hits back, if the lease they came from is still
// the live one (else they are lost: under-admission of a few hits).
func (le *lease) release(gen uint64, hits int64) {
	le.mu.Lock()
	if le.gen == gen && !le.dead {
		le.units += hits
	}
	le.mu.Unlock()
}

// lifetime is how long a grant for l's period may serve.
func (ls *leases) lifetime(period time.Duration) time.Duration {
	return min(period/10, ls.opts.MaxLifetime)
}

// refill asks Redis for a new grant and merges it into le.
func (ls *leases) refill(le *lease, rate float64) {
	life := ls.lifetime(le.req.Period)
	want := int64(math.Ceil(rate * life.Seconds()))
	if ls.opts.Units > 0 {
		want = ls.opts.Units
	}
	want = min(max(want, 1), ls.opts.MaxUnits)
	capacity := le.req.Limit
	if le.req.Burst > 0 && (le.req.Algorithm == "" || le.req.Algorithm == rules.TokenBucket || le.req.Algorithm == rules.LeakyBucket) {
		capacity = le.req.Burst
	}
	nodes := int64(ls.e.NodeCount())
	ctx, cancel := context.WithTimeout(context.Background(), ls.opts.Timeout)
	defer cancel()
	sent := time.Now()
	g, err := ls.redis.Lease(ctx, le.req, want, nodes, max(capacity/10, 2*nodes))

	le.mu.Lock()
	le.fetching = false
	if err != nil {
		le.retryAt = time.Now().Add(200 * time.Millisecond)
		le.mu.Unlock()
		return
	}
	if le.dead || ls.closed.Load() {
		le.mu.Unlock()
		ls.giveBack(le, g, g.Units)
		return
	}
	if g.Units == 0 {
		// Near the limit: Redis decides; ask again a little later.
		le.retryAt = sent.Add(max(life/4, time.Millisecond))
		le.remaining, le.resetAt = g.Remaining, sent.Add(g.ResetAfter)
		le.mu.Unlock()
		return
	}
	ls.granted.Add(g.Units)
	if g.WindowLeft > 0 {
		life = min(life, g.WindowLeft)
	}
	now := time.Now()
	if le.units > 0 && now.Before(le.expires) && g.SameWindow(le.grant) {
		le.units += g.Units
	} else {
		le.units = g.Units // what was left is expired, or of an ended window
	}
	le.expires = sent.Add(life)
	le.grant, le.want = g, want
	le.remaining, le.resetAt = g.Remaining, sent.Add(g.ResetAfter)
	le.gen++
	gen, left := le.gen, max(le.expires.Sub(now), 0)
	le.mu.Unlock()
	time.AfterFunc(left, func() { ls.expire(le, gen) })
}

// expire returns what is left of grant generation gen when it expires
// (unless a newer grant took it over), and forgets an idle key.
func (ls *leases) expire(le *lease, gen uint64) {
	le.mu.Lock()
	if le.gen != gen || le.dead {
		le.mu.Unlock()
		return
	}
	units, g := le.units, le.grant
	le.units = 0
	le.gen++
	le.mu.Unlock()
	ls.giveBack(le, g, units)
}

// giveBack returns units of g to Redis (best effort: units that cannot be
// returned are lost, never counted twice).
func (ls *leases) giveBack(le *lease, g limiter.Grant, units int64) {
	if units <= 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), ls.opts.Timeout)
	defer cancel()
	_, _ = ls.redis.Return(ctx, le.req, g, units)
}

// drop takes le out of service and returns what it holds.
func (ls *leases) drop(ctx context.Context, le *lease) {
	if g, units := le.retire(); units > 0 {
		_, _ = ls.redis.Return(ctx, le.req, g, units)
	}
}

// retire takes le out of service at once and returns what it held, to be
// given back.
func (le *lease) retire() (limiter.Grant, int64) {
	le.mu.Lock()
	defer le.mu.Unlock()
	units, g := le.units, le.grant // expired or not: its timer will see dead
	le.units, le.dead = 0, true
	le.gen++
	return g, units
}

// changed retires the leases whose limit set no longer applies as it was
// (changed or removed), returning their units in the background.
func (ls *leases) changed(set *rules.Set) {
	if ls == nil {
		return
	}
	type back struct {
		le    *lease
		g     limiter.Grant
		units int64
	}
	var gone []back
	ls.mu.Lock()
	for k, le := range ls.m {
		nl := set.Match(le.domain, le.entries)
		if nl == nil || !sameCounting(nl, &le.rule) {
			delete(ls.m, k)
			if g, units := le.retire(); units > 0 {
				gone = append(gone, back{le, g, units})
			}
		}
	}
	ls.mu.Unlock()
	if len(gone) == 0 {
		return
	}
	go func() {
		for _, b := range gone {
			ctx, cancel := context.WithTimeout(context.Background(), ls.opts.Timeout)
			_, _ = ls.redis.Return(ctx, b.le.req, b.g, b.units)
			cancel()
		}
	}()
}

// sameCounting reports whether a and b count requests alike (what a lease
// was granted under).
func sameCounting(a, b *rules.Limit) bool {
	return a.Lease == b.Lease && a.Unit == b.Unit && a.RequestsPerUnit == b.RequestsPerUnit &&
		a.Burst == b.Burst && a.Algorithm == b.Algorithm && a.Unlimited == b.Unlimited &&
		a.ShadowMode == b.ShadowMode && a.Period == b.Period && a.Calendar == b.Calendar &&
		a.Shards == b.Shards && a.OnLimit == b.OnLimit
}

func (ls *leases) close(ctx context.Context) error {
	ls.closed.Store(true)
	ls.mu.Lock()
	all := make([]*lease, 0, len(ls.m))
	for k, le := range ls.m {
		all = append(all, le)
		delete(ls.m, k)
	}
	ls.mu.Unlock()
	for _, le := range all {
		ls.drop(ctx, le)
	}
	return ctx.Err()
}
