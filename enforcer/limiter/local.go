package limiter

import (
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultLocalMaxKeys is the number of limits a Local keeps when
// LocalOptions.MaxKeys is 0.
const DefaultLocalMaxKeys = 100_000

// LocalOptions configures NewLocal.
type LocalOptions struct {
	// MaxKeys bounds the limits kept in memory (default
	// DefaultLocalMaxKeys). A limit whose state is back to empty (when its
	// Redis key would expire) counts as absent and is the first dropped when
	// room is needed; failing that, the limit closest to expiring among a
	// small random sample is dropped, which can only forget counts
	// (over-admit), never invent them.
	MaxKeys int
	// Now, when set, replaces the wall clock. Production leaves it nil;
	// tests of code built on Local (the console's sign-in throttle) set it
	// to move time without sleeping.
	Now func() time.Time
}

// Local is an in-process limiter with the same Take semantics as Redis: the
// same five algorithms with the same arithmetic, the same Decision values,
// all-or-nothing across the requests of a Take. It is the fallback for limits
// with `failure_mode: local` while Redis is unreachable: each node then
// enforces its share of every limit, Limit and Burst divided by the node
// count the console sends (SetNodeCount), rounded up so that the nodes
// together never admit less than the limit. Time is the node's wall clock
// (UTC calendar windows need it). It is safe for concurrent use; state is
// lost when the process exits.
type Local struct {
	maxKeys int
	nodes   atomic.Int64
	// now, when set, replaces the wall clock (µs since the epoch): tests only.
	now func() int64

	mu     sync.Mutex
	states map[string]*localState
}

// NewLocal returns an empty Local limiter for a single node (SetNodeCount 1).
func NewLocal(opts LocalOptions) *Local {
	if opts.MaxKeys <= 0 {
		opts.MaxKeys = DefaultLocalMaxKeys
	}
	l := &Local{maxKeys: opts.MaxKeys, states: make(map[string]*localState)}
	if opts.Now != nil {
		l.now = func() int64 { return opts.Now().UnixMicro() }
	}
	l.nodes.Store(1)
	return l
}

// SetNodeCount sets the number of enforcer nodes sharing every limit; Take
// then enforces ceil(Limit/n) and ceil(Burst/n). Values below 1 mean 1.
func (l *Local) SetNodeCount(n int) {
	l.nodes.Store(int64(max(n, 1)))
}

// Len returns the number of limits held in memory.
func (l *Local) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.states)
}

// localState is one key's state, the Go twin of what the Lua chunks store.
// The fields used depend on the algorithm (the key's suffix names it).
type localState struct {
	t       float64 // token bucket TAT, leaky bucket empty-at (µs)
	start   float64 // window start (µs), fixed window and sliding counter
	count   float64 // fixed window count, sliding counter current window
	prev    float64 // sliding counter previous window
	hasWin  bool    // start/count/prev are set
	log     []logHit
	expires int64 // µs; the state is empty (as if absent) from then on
}

// logHit is a run of n hits admitted at one time t (µs).
type logHit struct {
	t float64
	n float64
}

// lstate is the state decide works on: a copy of localState plus, for the
// sliding log, the hits admitted by this Take but not yet logged.
type lstate struct {
	localState
	has    bool    // t is set (buckets)
	base   float64 // sliding log: hits logged in the window of period
	period int64   // sliding log: the period base was counted over (µs)
	newest float64 // sliding log: time of the newest of them
	added  float64 // sliding log: hits admitted by this Take, at now
}

// lresult holds what the Lua decide functions return.
type lresult struct {
	allowed    bool
	retry      float64
	delay      float64
	rem0       float64
	reset0     float64
	rem, reset float64
	state      *lstate
	dup        bool
}

// Take decides reqs against the in-memory counters, all-or-nothing, with the
// limits scaled to this node's share. It does no I/O and fails only for an
// invalid request.
func (l *Local) Take(_ context.Context, reqs []Request) ([]Decision, error) {
	if len(reqs) == 0 {
		return []Decision{}, nil
	}
	if n := l.nodes.Load(); n > 1 {
		scaled := make([]Request, len(reqs))
		for i, r := range reqs {
			r.Limit = Share(r.Limit, n)
			r.Burst = Share(r.Burst, n)
			scaled[i] = r
		}
		reqs = scaled
	}
	specs, err := specsOf(reqs)
	if err != nil {
		return nil, err
	}
	var now int64
	if l.now != nil {
		now = l.now()
	} else {
		now = time.Now().UnixMicro()
	}
	fnow := float64(now)

	l.mu.Lock()
	defer l.mu.Unlock()

	// Tentative states of this Take, for a key named twice. Takes are short
	// (one entry per descriptor), so a slice beats a map.
	type pending struct {
		key string
		st  *lstate
		s   *spec // the request that made st: its parameters set the TTL
	}
	var tentative []pending
	lookup := func(key string) *lstate {
		for i := len(tentative) - 1; i >= 0; i-- {
			if tentative[i].key == key {
				return tentative[i].st
			}
		}
		return nil
	}

	results := make([]lresult, len(specs))
	all := true
	for i := range specs {
		s := &specs[i]
		st := lookup(s.key)
		dup := st != nil
		if st == nil {
			st = l.load(s, now)
		}
		r := localDecide(st, fnow, s, false)
		r.dup = dup
		results[i] = r
		if r.state != nil {
			tentative = append(tentative, pending{s.key, r.state, s})
		}
		if !r.allowed {
			all = false
		}
	}

	ds := make([]Decision, len(specs))
	for i := range specs {
		s, r := &specs[i], &results[i]
		allowed, remaining, reset, retry, delay := true, r.rem, r.reset, 0.0, r.delay
		if !all {
			remaining, reset = r.rem0, r.reset0
			if r.dup {
				p0 := *s
				p0.hits = 0
				r0 := localDecide(l.load(s, now), fnow, &p0, false)
				remaining, reset = r0.rem0, r0.reset0
			}
			delay = 0
			if !r.allowed {
				allowed, retry = false, clampF(math.Ceil(r.retry), 1, maxMicros)
			}
		}
		ds[i] = Decision{
			Allowed:    allowed,
			Limit:      s.capacity,
			Remaining:  int64(clampF(math.Floor(remaining), 0, float64(s.capacity))),
			ResetAfter: micros(int64(clampF(math.Ceil(reset), 0, maxMicros))),
			RetryAfter: micros(int64(retry)),
			Delay:      micros(int64(clampF(math.Ceil(delay), 0, maxMicros))),
		}
	}
	if all {
		// Later states of a key build on earlier ones: the last one wins.
		seen := make(map[string]bool, len(tentative))
		for i := len(tentative) - 1; i >= 0; i-- {
			p := tentative[i]
			if seen[p.key] {
				continue
			}
			seen[p.key] = true
			s := p.s
			if s.code == "sl" {
				s = longestPeriod(specs, s)
			}
			l.store(p.key, p.st, s, now)
		}
	}
	return ds, nil
}

// load returns a copy of key's live state, or an empty one.
func (l *Local) load(s *spec, now int64) *lstate {
	st := &lstate{}
	ls, ok := l.states[s.key]
	if !ok || now >= ls.expires {
		return st
	}
	st.localState = *ls
	switch s.code {
	case "tb", "lb":
		st.has = true
	case "sl":
		st.base, st.newest = logged(ls.log, float64(now), s.period)
		st.period = s.period
	}
	return st
}

// logged returns the hits of log in the window of period ending at now and
// the time of the newest of them, like the Lua chunk's logged.
func logged(log []logHit, now float64, period int64) (base, newest float64) {
	for _, h := range log {
		if h.t > now-float64(period) {
			base += h.n
			newest = max(newest, h.t)
		}
	}
	return base, newest
}

// longestPeriod returns s with the longest period of the specs naming its
// key: like the Lua chunk's longest, how much of a sliding log store keeps
// when limits of different periods share the key.
func longestPeriod(specs []spec, s *spec) *spec {
	out := *s
	for i := range specs {
		if specs[i].key == s.key {
			out.period = max(out.period, specs[i].period)
		}
	}
	return &out
}

// store writes st back under key with its expiry, as the Lua store
// functions do, and keeps the map within maxKeys.
func (l *Local) store(key string, st *lstate, s *spec, now int64) {
	fnow := float64(now)
	ls := st.localState
	switch s.code {
	case "tb", "lb":
		ls.expires = now + max(1, int64(math.Ceil((ls.t-fnow)/1000)))*1000
	case "fw":
		_, stop := fixedWindow(now, s)
		ls.expires = stop
	case "sl":
		cutoff := fnow - float64(s.period)
		kept := ls.log[:0:0]
		for _, h := range ls.log {
			if h.t > cutoff {
				kept = append(kept, h)
			}
		}
		if st.added > 0 {
			kept = append(kept, logHit{t: fnow, n: st.added})
		}
		ls.log = kept
		ls.expires = now + s.period
	case "sc":
		ls.expires = int64(ls.start) + 2*s.period
	}
	if old, ok := l.states[key]; ok {
		*old = ls
		return
	}
	if len(l.states) >= l.maxKeys {
		l.evict(now)
	}
	l.states[key] = &ls
}

// evict drops expired states from a random sample of the map, or, if none
// is expired, the one expiring soonest, like Redis's approximate eviction.
func (l *Local) evict(now int64) {
	const sample = 16
	var victim string
	var soonest int64 = math.MaxInt64
	n, dropped := 0, false
	for key, st := range l.states { // map order is random
		if st.expires <= now {
			delete(l.states, key)
			dropped = true
		} else if st.expires < soonest {
			victim, soonest = key, st.expires
		}
		if n++; n == sample {
			break
		}
	}
	if !dropped && victim != "" {
		delete(l.states, victim)
	}
}

func clampF(x, lo, hi float64) float64 {
	if x != x || x < lo {
		return lo
	}
	return min(x, hi)
}

// localDecide dispatches to the Go twin of the spec's Lua chunk. Each twin
// performs the same float64 operations in the same order as its Lua file,
// so both stores reach the same decisions (TestStoresAgree checks it).
func localDecide(st *lstate, now float64, s *spec, force bool) lresult {
	switch s.code {
	case "tb":
		return decideTokenBucket(st, now, s, force)
	case "lb":
		return decideLeakyBucket(st, now, s, force)
	case "fw":
		return decideFixedWindow(st, now, s, force)
	case "sl":
		return decideSlidingLog(st, now, s, force)
	default:
		return decideSlidingCounter(st, now, s, force)
	}
}

func decideTokenBucket(st *lstate, now float64, s *spec, force bool) lresult {
	emission := float64(s.period) / float64(s.limit)
	tolerance := emission * float64(s.capacity)
	tat := st.t
	if !st.has || tat < now {
		tat = now
	}
	r := lresult{rem0: (now - (tat - tolerance) + 1) / emission, reset0: tat - now}
	increment := emission * float64(s.hits)
	newTAT := tat + increment
	slack := now - (newTAT - tolerance)
	r.allowed = slack >= 0
	if !r.allowed {
		r.retry = -slack
		if increment > tolerance {
			r.retry = tolerance
		}
	}
	if s.hits > 0 && (r.allowed || force) {
		next := *st
		next.t, next.has = newTAT, true
		r.state = &next
		r.rem, r.reset = (slack+1)/emission, newTAT-now
	} else {
		r.rem, r.reset = r.rem0, r.reset0
	}
	return r
}

func decideLeakyBucket(st *lstate, now float64, s *spec, force bool) lresult {
	emission := float64(s.period) / float64(s.limit)
	capacity := emission * float64(s.capacity)
	emptyAt := st.t
	if !st.has || emptyAt < now {
		emptyAt = now
	}
	r := lresult{rem0: (capacity - (emptyAt - now) + 1) / emission, reset0: emptyAt - now}
	increment := emission * float64(s.hits)
	newEmptyAt := emptyAt + increment
	room := capacity - (newEmptyAt - now)
	ahead := emptyAt - now
	maxDelay := float64(s.maxDelay)
	shaping := s.maxDelay > 0
	r.allowed = room >= 0 && (!shaping || ahead <= maxDelay)
	if !r.allowed {
		if increment > capacity {
			r.retry = capacity
		} else {
			r.retry = -room
			if shaping && ahead-maxDelay > r.retry {
				r.retry = ahead - maxDelay
			}
		}
	}
	if shaping && s.hits > 0 {
		r.delay = ahead
	}
	if s.hits > 0 && (r.allowed || force) {
		next := *st
		next.t, next.has = newEmptyAt, true
		r.state = &next
		r.rem, r.reset = (room+1)/emission, newEmptyAt-now
	} else {
		r.rem, r.reset = r.rem0, r.reset0
	}
	return r
}

// fixedWindow returns the start and end (µs) of the window holding now: a
// multiple of the period since the epoch, or the UTC calendar day, ISO week,
// month or year. fixed_window.lua computes the same with civil-date
// arithmetic.
func fixedWindow(now int64, s *spec) (start, stop int64) {
	if s.calendar == 0 {
		start = now - floorMod(now, s.period)
		return start, start + s.period
	}
	t := time.UnixMicro(now).UTC()
	y, m, d := t.Date()
	var from, to time.Time
	switch s.calendar {
	case 1:
		from = time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
		to = from.AddDate(0, 0, 1)
	case 2:
		back := (int(t.Weekday()) + 6) % 7 // days since Monday
		from = time.Date(y, m, d-back, 0, 0, 0, 0, time.UTC)
		to = from.AddDate(0, 0, 7)
	case 3:
		from = time.Date(y, m, 1, 0, 0, 0, 0, time.UTC)
		to = from.AddDate(0, 1, 0)
	default:
		from = time.Date(y, 1, 1, 0, 0, 0, 0, time.UTC)
		to = from.AddDate(1, 0, 0)
	}
	return from.UnixMicro(), to.UnixMicro()
}

func floorMod(a, b int64) int64 {
	m := a % b
	if m < 0 {
		m += b
	}
	return m
}

func decideFixedWindow(st *lstate, now float64, s *spec, force bool) lresult {
	start, stop := fixedWindow(int64(now), s)
	fstart, fstop := float64(start), float64(stop)
	limit, hits := float64(s.limit), float64(s.hits)
	count := 0.0
	if st.hasWin && st.start == fstart {
		count = st.count
	}
	r := lresult{rem0: limit - count, reset0: fstop - now}
	r.allowed = count+hits <= limit
	if !r.allowed {
		r.retry = fstop - now
	}
	if s.hits > 0 && (r.allowed || force) {
		next := *st
		next.start, next.count, next.hasWin = fstart, count+hits, true
		r.state = &next
		r.rem, r.reset = limit-count-hits, fstop-now
	} else {
		r.rem, r.reset = r.rem0, r.reset0
	}
	return r
}

func decideSlidingLog(st *lstate, now float64, s *spec, force bool) lresult {
	limit, hits, period := float64(s.limit), float64(s.hits), float64(s.period)
	base, newest := st.base, st.newest
	if s.period != st.period {
		// A key repeated in a Take under limits of different periods.
		base, newest = logged(st.log, now, s.period)
	}
	count := base + st.added
	if st.added > 0 {
		newest = now
	}
	r := lresult{rem0: limit - count}
	if count > 0 {
		r.reset0 = newest + period - now
	}
	r.allowed = count+hits <= limit
	if !r.allowed {
		k := count + hits - limit
		switch {
		case hits > limit:
			r.retry = period
		case k <= base:
			// The k-th oldest logged hit of the window.
			seen := 0.0
			for _, h := range st.log {
				if h.t <= now-period {
					continue
				}
				if seen += h.n; seen >= k {
					r.retry = h.t + period - now
					break
				}
			}
		default:
			r.retry = period
		}
	}
	if s.hits > 0 && (r.allowed || force) {
		next := *st
		next.added, next.newest = st.added+hits, now
		r.state = &next
		r.rem, r.reset = limit-count-hits, period
	} else {
		r.rem, r.reset = r.rem0, r.reset0
	}
	return r
}

func decideSlidingCounter(st *lstate, now float64, s *spec, force bool) lresult {
	limit, hits, period := float64(s.limit), float64(s.hits), float64(s.period)
	start := float64(int64(now) - floorMod(int64(now), s.period))
	elapsed := now - start
	cur, prev := 0.0, 0.0
	if st.hasWin && st.start == start {
		cur, prev = st.count, st.prev
	} else if st.hasWin && st.start == start-period {
		prev = st.count
	}
	estimate := prev*(period-elapsed)/period + cur
	clear := 0.0
	if cur > 0 {
		clear = start + 2*period - now
	} else if prev > 0 {
		clear = start + period - now
	}
	r := lresult{rem0: limit - estimate, reset0: clear}
	r.allowed = estimate+hits <= limit
	if !r.allowed {
		room := limit - cur - hits
		switch {
		case hits > limit:
			r.retry = r.reset0
			if r.retry <= 0 {
				r.retry = period
			}
		case room >= 0:
			r.retry = period - period*room/prev - elapsed
		default:
			room2 := limit - hits
			t := 0.0
			if cur > room2 {
				t = period - period*room2/cur
			}
			r.retry = start + period - now + t
		}
	}
	if s.hits > 0 && (r.allowed || force) {
		next := *st
		next.start, next.count, next.prev, next.hasWin = start, cur+hits, prev, true
		r.state = &next
		r.rem, r.reset = limit-estimate-hits, start+2*period-now
	} else {
		r.rem, r.reset = r.rem0, r.reset0
	}
	return r
}

// Peek reads the counters of reqs (their Hits and MaxDelay are ignored) as
// Redis.Peek does, with the limits scaled to this node's share as Take
// scales them, without changing anything.
func (l *Local) Peek(_ context.Context, reqs []Request) ([]State, error) {
	n := l.nodes.Load()
	specs := make([]spec, len(reqs))
	for i, r := range reqs {
		r.Hits, r.MaxDelay = 0, 0
		if n > 1 {
			r.Limit, r.Burst = Share(r.Limit, n), Share(r.Burst, n)
		}
		s, err := specOf(r)
		if err != nil {
			return nil, fmt.Errorf("request %d: %w", i, err)
		}
		specs[i] = s
	}
	var now int64
	if l.now != nil {
		now = l.now()
	} else {
		now = time.Now().UnixMicro()
	}
	at := time.UnixMicro(now).UTC()
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]State, len(specs))
	for i := range specs {
		s := &specs[i]
		r := localDecide(l.load(s, now), float64(now), s, false)
		out[i] = State{
			Limit:      s.capacity,
			Remaining:  int64(clampF(math.Floor(r.rem0), 0, float64(s.capacity))),
			ResetAfter: micros(int64(clampF(math.Ceil(r.reset0), 0, maxMicros))),
			At:         at,
		}
	}
	return out, nil
}

// Reset forgets the state of the limits whose Request.Key is in keys, under
// every algorithm, as Redis.Reset does, and returns how many were live.
func (l *Local) Reset(_ context.Context, keys []string) (int64, error) {
	now := time.Now().UnixMicro()
	if l.now != nil {
		now = l.now()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	var n int64
	for _, k := range keys {
		if k == "" {
			return n, fmt.Errorf("%w: empty key", ErrInvalidRequest)
		}
		for _, sk := range StateKeys(k) {
			if st, ok := l.states[sk]; ok {
				if now < st.expires {
					n++
				}
				delete(l.states, sk)
			}
		}
	}
	return n, nil
}
