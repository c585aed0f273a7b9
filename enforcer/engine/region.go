package engine

// # Regions (scope: global)
//
// Enforcers may run in several regions, each with its own Redis (the
// store checks count in) and all sharing one global store (WithRegions,
// limiter.Global). A limit without scope: global holds in each region on
// its own: nothing here applies to it. A limit with scope: global holds
// across the regions:
//
//   - On the request path a region counts only in its own Redis, as for
//     any limit, but against limit − others, where others is what the
//     other regions admitted in the current window as this node last read
//     it from the global store. For sliding_window_counter, others is
//     weighed as Redis weighs the region's own count: the other regions'
//     current window plus their previous one × (period − elapsed)/period.
//     When others reaches the limit, the check is refused without asking
//     Redis.
//   - Off the request path, every RegionOptions.Interval (default 100 ms),
//     the node sends, in one pipelined round trip, the hits it admitted for
//     each global key's window since the last round to its region's field
//     of that window's hash in the global store, and reads every region's
//     field back. A key's window is tracked from the first check that
//     touches it on this node, admitted or not, so the next round reads it.
//
// Overshoot bound. With I the interval and D = 2·(I + RTT), RTT the
// time one round takes (the global store's round trip, plus the node's
// scheduling delay on a loaded machine): a region's hit reaches the store
// within I + RTT, and another region's round reads it within another
// I + RTT. A window admits at most
//
//	limit + Σ_r λ_r · D
//
// where λ_r is the rate at which region r admits the key: what each region
// admits while its view of the others is behind (a node's first checks of
// a key's window, before a round has read it, are such checks). Two
// regions each admitting 500/s with I = 100 ms and a 1 ms RTT over-admit
// by at most 2 · 500 · 0.202 ≈ 202 per window; BENCHMARKS.md has measured
// figures. While the global store answers, it never under-admits: others
// only ever counts hits some region admitted (a failed round is sent
// again, so a round that failed after Redis applied part of it counts
// those hits twice, which refuses early, by them).
//
// A caller's limit override (Envoy's per-descriptor limit) counts in its
// region only.
//
// Only fixed_window and sliding_window_counter (rules refuses the other
// algorithms): their counts belong to windows that every region can name
// and add up, where a bucket's level or a log's entries cannot be summed
// from per-region deltas. Not with lease (rules refuses it).
//
// Global store unreachable: when no round has succeeded for 2·I plus the
// round's timeout (or there is no global store at all), each region
// enforces its share of the limit: min(⌈limit/R⌉, limit − others as last
// known), with R the larger of the console's region count (SetRegionCount:
// the regions of the connected nodes) and the regions seen in the global
// store. The regions together then admit at most R·⌈limit/R⌉ < limit + R
// per window, never more than one region on its own would be let through
// by the last known state. Hits admitted meanwhile are kept (up to
// MaxKeys windows) and sent when the store is back, so every region's view
// converges within one round of its return.

import (
	"context"
	"log/slog"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/enforcer/limiter"
	"github.com/sluicehq/sluice/rules"
)

// RegionOptions configures WithRegions; zero values mean the defaults.
type RegionOptions struct {
	// Region names the node's region (required).
	Region string
	// Global is the store regions exchange their counts through; nil means
	// none, and global limits then always enforce the region's share.
	Global *limiter.Global
	// Interval is how often the node exchanges counts (default 100 ms).
	Interval time.Duration
	// Timeout bounds one exchange (default 1 s, at most Interval × 10).
	Timeout time.Duration
	// MaxKeys bounds the key windows tracked (default 100,000); a key's
	// window that finds the table full is enforced at the region's share.
	MaxKeys int
	// Log receives one line when the global store becomes unreachable and
	// one when it is back; discarded when nil.
	Log *slog.Logger
}

// WithRegions makes the node one region of several: scope: global limits
// hold across regions through o.Global (see "Regions" in region.go). Run
// the exchange with RunRegions. Without this option a global limit counts
// like any other (one region).
func WithRegions(o RegionOptions) Option {
	return func(e *Engine) {
		if o.Interval <= 0 {
			o.Interval = 100 * time.Millisecond
		}
		if o.Timeout <= 0 {
			o.Timeout = min(time.Second, 10*o.Interval)
		}
		if o.MaxKeys <= 0 {
			o.MaxKeys = 100_000
		}
		if o.Log == nil {
			o.Log = slog.New(slog.DiscardHandler)
		}
		e.regions = &regions{opts: o, m: map[windowKey]*tally{}}
	}
}

// regions is the node's view of the other regions' counts.
type regions struct {
	opts    RegionOptions
	count   atomic.Int64 // the console's region count (SetRegionCount)
	seen    atomic.Int64 // the most regions one window had (see SyncRegions)
	seenAt  atomic.Int64 // Unix ns when seen was set
	lastOK  atomic.Int64 // Unix ns of the last round that succeeded; 0: none yet
	wasDown atomic.Bool  // for the log lines

	syncMu sync.Mutex // one round at a time
	mu     sync.Mutex
	m      map[windowKey]*tally
}

// seenFor is how long a region seen in the global store counts after its
// last sighting: a region idle on every key this node tracks still holds
// its share.
const seenFor = 10 * time.Minute

// windowKey is one counter key's counting window, by its start (Unix ms).
type windowKey struct {
	key   string
	start int64
}

// tally is one key window: what this node admitted in it and has not sent
// yet, and what the other regions had admitted as of the last round.
type tally struct {
	pending  int64
	sending  int64 // taken out of pending by the round in flight
	others   int64
	keepTill int64 // Unix ms after which the window weighs in no decision
}

// SetRegionCount tells the engine how many regions enforce the fleet's
// global limits (the console's region_count); see "Regions". Values below
// 1 count as 1.
func (e *Engine) SetRegionCount(n int) {
	if e.regions != nil {
		e.regions.count.Store(int64(max(n, 1)))
	}
}

// RegionCount returns the number of regions global limits are shared
// between while the global store is unreachable: the larger of
// SetRegionCount's and the regions seen in the global store; 1 without
// WithRegions.
func (e *Engine) RegionCount() int {
	if e.regions == nil {
		return 1
	}
	return int(e.regions.n())
}

// GlobalUp reports whether the node's view of the other regions is
// current (the last exchange with the global store succeeded recently).
// It is false without WithRegions or a global store.
func (e *Engine) GlobalUp() bool { return e.regions != nil && e.regions.up(time.Now()) }

// Region returns the node's region (RegionOptions.Region), "" without
// WithRegions.
func (e *Engine) Region() string {
	if e.regions == nil {
		return ""
	}
	return e.regions.opts.Region
}

func (rg *regions) n() int64 { return max(rg.count.Load(), rg.seen.Load(), 1) }

// up reports whether a round succeeded within 2 intervals and a timeout.
func (rg *regions) up(now time.Time) bool {
	last := rg.lastOK.Load()
	return last != 0 && now.UnixNano()-last <= int64(2*rg.opts.Interval+rg.opts.Timeout)
}

// window returns the start and end (Unix ms) of the counting window of l
// holding now, as fixed_window.lua and sliding_window_counter.lua count
// it (the node's clock stands in for Redis's).
func window(l *rules.Limit, period time.Duration, now time.Time) (start, end int64) {
	if l.Calendar && l.Unit.Calendar() {
		s, e := l.Unit.Window(now)
		return s.UnixMilli(), e.UnixMilli()
	}
	p := period.Milliseconds()
	ms := now.UnixMilli()
	start = ms - ms%p
	return start, start + p
}

// globalLimit returns what a global limit of limit per period allows this
// region's own counter now (at most limit, below 1 when the other regions
// used it all), the start of the window it counts in and the time to that
// window's end.
func (rg *regions) globalLimit(key string, l *rules.Limit, limit int64, period time.Duration, now time.Time) (eff, start int64, left time.Duration) {
	start, end := window(l, period, now)
	ms := now.UnixMilli()
	left = time.Duration(end-ms) * time.Millisecond
	sliding := l.Algorithm == rules.SlidingWindowCounter
	keep := end
	if sliding {
		keep = end + (end - start) // it weighs in the next window
	}
	share := limiter.Share(limit, rg.n())
	rg.mu.Lock()
	cur, ok := rg.tallyLocked(key, start, keep)
	others := 0.0
	if ok {
		others = float64(cur.others)
		if sliding {
			p := end - start
			if prev, ok2 := rg.tallyLocked(key, start-p, end); ok2 {
				others += float64(prev.others) * float64(p-(ms-start)) / float64(p)
			} else {
				ok = false
			}
		}
	}
	rg.mu.Unlock()
	eff = limit - int64(math.Round(others))
	if !ok || !rg.up(now) {
		eff = min(eff, share)
	}
	return eff, start, left
}

// tallyLocked returns key's window starting at start, tracking it (until
// keepTill) if it is new; false when the table is full. Caller holds mu.
func (rg *regions) tallyLocked(key string, start, keepTill int64) (*tally, bool) {
	t := rg.m[windowKey{key, start}]
	if t != nil {
		return t, true
	}
	if len(rg.m) >= rg.opts.MaxKeys {
		return nil, false
	}
	t = &tally{keepTill: keepTill}
	rg.m[windowKey{key, start}] = t
	return t, true
}

// add records hits this node admitted in key's window starting at start.
func (rg *regions) add(key string, start, hits int64) {
	rg.mu.Lock()
	if t := rg.m[windowKey{key, start}]; t != nil {
		t.pending += hits
	}
	rg.mu.Unlock()
}

// globalHit is an admitted hit of a global limit, to be recorded once the
// request is decided: the status it belongs to, its counter key (before
// sharding) and window start.
type globalHit struct {
	status int
	key    string
	start  int64
	hits   int64
	left   time.Duration // to the window's end
}

// refuseGlobal answers status i of res, a global limit the other regions
// used up: over limit (or shadowed) until the window ends.
func refuseGlobal(res *Result, i int, left time.Duration) {
	s := &res.Statuses[i]
	s.RetryAfter, s.ResetAfter = left, left
	if s.Limit.ShadowMode {
		s.Shadowed = true
		return
	}
	s.Code = OverLimit
	res.Code = OverLimit
}

// recordGlobal adds the hits of the admitted global limits of res.
func (e *Engine) recordGlobal(res *Result, hits []globalHit) {
	if res.Code != OK {
		return // all-or-nothing: nothing was consumed
	}
	for _, h := range hits {
		if s := res.Statuses[h.status]; s.Code == OK && !s.Shadowed && h.hits > 0 {
			e.regions.add(h.key, h.start, h.hits)
		}
	}
}

// RunRegions exchanges counts with the global store every interval until
// ctx is done (see "Regions"). It returns at once without WithRegions or a
// global store.
func (e *Engine) RunRegions(ctx context.Context) {
	rg := e.regions
	if rg == nil || rg.opts.Global == nil {
		return
	}
	t := time.NewTicker(rg.opts.Interval)
	defer t.Stop()
	for {
		_ = e.SyncRegions(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// SyncRegions runs one exchange with the global store: it sends every
// tracked window's pending hits and reads the other regions' counts back.
// On failure the hits stay pending for the next round.
func (e *Engine) SyncRegions(ctx context.Context) error {
	rg := e.regions
	if rg == nil || rg.opts.Global == nil {
		return nil
	}
	rg.syncMu.Lock()
	defer rg.syncMu.Unlock()
	now := time.Now()
	ms := now.UnixMilli()
	rg.mu.Lock()
	counts := make([]limiter.RegionCount, 0, len(rg.m))
	tallies := make([]*tally, 0, len(rg.m))
	for k, t := range rg.m {
		if t.keepTill < ms {
			delete(rg.m, k) // its hits no longer weigh in any decision
			continue
		}
		t.sending, t.pending = t.pending, 0
		counts = append(counts, limiter.RegionCount{
			Key: globalKey(k), Add: t.sending,
			// Long enough for every region's reads, whatever its clock.
			TTL: time.Duration(t.keepTill-ms)*time.Millisecond + time.Minute,
		})
		tallies = append(tallies, t)
	}
	rg.mu.Unlock()

	ctx, cancel := context.WithTimeout(ctx, rg.opts.Timeout)
	totals, err := rg.opts.Global.Sync(ctx, rg.opts.Region, counts)
	cancel()

	rg.mu.Lock()
	seen := int64(0)
	for i, t := range tallies {
		if err != nil {
			t.pending += t.sending
		} else {
			t.others = totals[i].Others
			seen = max(seen, int64(totals[i].Regions))
		}
		t.sending = 0
	}
	rg.mu.Unlock()
	if err != nil {
		if !rg.wasDown.Swap(true) {
			rg.opts.Log.Warn("global store unreachable: global limits enforce this region's share", "region", rg.opts.Region,
				"regions", rg.n(), "error", err)
		}
		return err
	}
	if seen > 0 && (seen >= rg.seen.Load() || now.UnixNano()-rg.seenAt.Load() > int64(seenFor)) {
		rg.seen.Store(seen)
		rg.seenAt.Store(now.UnixNano())
	}
	rg.lastOK.Store(time.Now().UnixNano())
	if rg.wasDown.Swap(false) {
		rg.opts.Log.Warn("global store reachable again: global limits count every region", "region", rg.opts.Region)
	}
	return nil
}

// globalKey is the global store's hash of one key window.
func globalKey(k windowKey) string {
	return k.key + ":@" + strconv.FormatInt(k.start, 10)
}
