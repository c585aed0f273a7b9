// Package limiter is Sluice's limiter engine: it decides whether requests fit
// their rate limits. Counters live in Redis (standalone, Sentinel or
// Cluster); Local keeps them in process for the `failure_mode: local`
// fallback. It is the only package that imports go-redis; everyone else sees
// Request and Decision.
//
// # Algorithms
//
// Five algorithms, each its own embedded .lua file, all reading the time from
// Redis TIME: token_bucket (GCRA), leaky_bucket (policing, or shaping with a
// delay up to Request.MaxDelay), fixed_window (optionally aligned to UTC
// calendar days, weeks, months and years), sliding_window_log (exact, a
// sorted set bounded by the limit) and sliding_window_counter (current plus
// weighted previous window). Every Decision reports allowed, limit,
// remaining, reset-after and retry-after as its algorithm defines them. A
// Request's Hits > 1 consumes that many; 0 peeks without consuming.
//
// # All-or-nothing
//
// A Take decides several requests (one per matched limit of an incoming
// request) and is all-or-nothing: when any of them is not allowed, nothing is
// consumed from any of them. On one Redis node the whole Take is one Lua
// script call (EVALSHA, falling back to EVAL after a script cache flush), so
// this holds exactly under any concurrency: the script decides every key and
// writes only if every key allows. The algorithm files and the driver
// (take.lua) are assembled into a single script so that one call can mix
// algorithms.
//
// # Redis Cluster
//
// A script may only touch keys of one hash slot. Key wraps a descriptor's
// domain and entries in a {hash tag}, so each limit lives on one slot, but
// the limits of one request usually do not share one. A Take whose keys
// share a slot (one descriptor, or any Take on a standalone Redis) is one
// script call and exact, as above. A Take spanning slots groups its keys by
// slot and reserves, then refunds:
//
//  1. the first slot's call takes what its requests ask if they all fit
//     (all-or-nothing on that slot, as on one node), at its node's TIME,
//     which it reports;
//  2. the other slots' calls, in parallel (one pipeline, one round trip per
//     node), do the same at that time: if the first refused, they only
//     decide (nothing is taken, nothing needs giving back);
//  3. if any slot refused, the calls that took give it back (one more round
//     trip) before Take returns.
//
// So a slot admits a request only when it fits there, with no race between
// a check and a commit: a limit never admits more than it holds because of
// a multi-slot Take. A request refused by one limit has consumed nothing
// from the others once Take has returned. Costs: two round trips for an
// allowed Take (as many as the check-then-commit it replaces, with one
// script call per slot instead of two: BenchmarkClusterTakes measured
// 8,000 two-slot Takes/s direct and 17,000 batched, against 4,000 and
// 13,600 before), two for one the first slot refuses, three for one a later
// slot refuses. Bounds:
//
//   - Transient under-admission: while a reservation is held (the round
//     trips until its refund), the limit counts it, so a concurrent request
//     may be refused for hits that are then given back. At most the hits
//     reserved by Takes that end up refused, for about two round trips.
//   - Refunds are exact for fixed_window, sliding_window_counter (the hits
//     come off the window they were counted in) and sliding_window_log
//     (hits logged at one time are interchangeable: the refund unlogs that
//     many at the Take's time). For token_bucket and leaky_bucket the refund
//     moves the bucket's time back by the hits' worth, which is exact unless
//     the bucket was full when they were reserved and another Take counted
//     from them before the refund: then the refund also gives back the
//     refill of the time between the two (at most the refunded hits; less
//     than one hit for a limit under ~1000/s and a millisecond's round
//     trip).
//   - One clock per Take: every slot judges the Take at the time the first
//     slot's node read, kept within 100 ms of each node's own TIME (masters'
//     clocks agree within milliseconds under NTP; a node whose clock is
//     further off judges at its own ± 100 ms). That time is a round trip
//     old when the other slots judge the Take, so their limits admit as if
//     that much later: a delay, never an excess (a limit of r/s shared by
//     such Takes under-admits by about r × the round trip, at most r ×
//     100 ms; 0.6% of a 100/s limit over 10 s on a quiet machine, up to 3%
//     over 1.5 s on a loaded one). A fixed or sliding window
//     counter whose state is of a later window than the shared time (its
//     last writer's clock ran ahead) counts the Take in that later window
//     rather than overwrite it.
//   - Errors: if a slot is unreachable, Take returns an error, after giving
//     back what the others took. If the caller stopped waiting (a Batcher's
//     Timeout, ctx), the refund follows when the calls in flight end. A
//     refund that fails (the node went away meanwhile) leaves its hits
//     consumed: under-admission by them, never over, until they would have
//     expired anyway.
//
// This package's cluster tests hold it to that on a real three-master
// cluster: 48 callers starting at once, each a fresh user, on a global limit
// of 20 get exactly 20 admitted; 48 callers of 8 users on per-user limits
// and a global 20 get at most 20, each limit counting exactly the
// admissions it took part in; and 200 callers on a global 100/s token
// bucket get its burst plus 100/s of the run (TestClusterSustained: at most
// 2% over what the bucket allows by the last admission's time).
//
// # Throughput and the node side
//
// Batcher is what an enforcer uses: concurrent Takes on a node go to Redis
// together, in one pipeline per short window, with the Takes that share a
// hash slot (on a standalone Redis: all of them) packed into one script call
// that decides them one after another exactly as separate calls would, so a
// hot key costs one script call per batch rather than one per request. It
// also keeps an over-limit cache: a limit known to reject until some time is
// answered without asking Redis.
//
// # Reading and resetting counters
//
// Peek reads limits' counters (remaining, reset-after, at Redis TIME)
// without consuming anything: a separate read-only script (peek.lua)
// decides 0 hits with the same algorithm files and calls no store, run
// with EVALSHA_RO on Redis 7+ so that the server refuses any write too.
// Reset deletes limits' state (every algorithm's key of each, one DEL per
// limit on its hash slot). The console's support desk uses both.
//
// # Local fallback
//
// Local implements the same Take in process, with the same arithmetic, for
// limits whose failure mode is `local` while Redis is unreachable; each node
// then enforces its share of a limit (SetNodeCount).
//
// Requires Redis 5 or newer (effects replication of scripts that call TIME).
package limiter

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/rules"
)

// Request asks to take Hits from the limit whose state lives under Key.
type Request struct {
	// Key identifies the limit's counter, usually built by Key. The algorithm
	// keeps its state under Key plus a short algorithm suffix (":tb" for
	// token_bucket), outside the hash tag.
	Key string
	// Algorithm is the counting algorithm; "" means rules.TokenBucket.
	Algorithm rules.Algorithm
	// Limit is the number of requests a Period admits: the refill (token
	// bucket) or drain (leaky bucket) rate, or the count a window allows.
	Limit int64
	// Period is the time over which Limit applies; at least 1 µs.
	Period time.Duration
	// Burst is the capacity of a token or leaky bucket; 0 means Limit. The
	// window algorithms ignore it.
	Burst int64
	// Hits is the number of requests (tokens) the request takes; 0 peeks at
	// the limit without consuming anything and is always allowed.
	Hits int64
	// Calendar aligns a fixed_window's windows to the UTC calendar instead of
	// to multiples of Period since the epoch: Period must then be the nominal
	// length of rules.Day, rules.Week (windows start on Monday), rules.Month
	// or rules.Year (rules.Unit.Period), and the window is that calendar day,
	// week, month or year. Other algorithms ignore it.
	Calendar bool
	// MaxDelay turns a leaky_bucket from policing into shaping: a request
	// that fits in the bucket is admitted with a Decision.Delay (the time
	// until the requests queued before it have drained) as long as that delay
	// is at most MaxDelay, and rejected otherwise. 0 means policing: admit
	// without delay when the request fits, else reject. Other algorithms
	// ignore it.
	MaxDelay time.Duration
}

// Decision is the verdict for one Request.
type Decision struct {
	// Allowed reports whether this request's own limit admits it. When any
	// request of a Take is not allowed, nothing is consumed from any of them,
	// even from those whose Allowed is true.
	Allowed bool
	// Limit is the bucket capacity (Burst) or the window's limit.
	Limit int64
	// Remaining is the number of hits the limit would still admit right now:
	// after this request if the whole Take was allowed, else for the
	// untouched limit.
	Remaining int64
	// ResetAfter is the time until the limit is back to its full capacity if
	// nothing else arrives: a bucket full (token) or empty (leaky), a fixed
	// window's end, a sliding window empty.
	ResetAfter time.Duration
	// RetryAfter is 0 when allowed; otherwise the time until a request of the
	// same Hits would be allowed if nothing else arrives. When Hits can never
	// fit (more than the capacity or limit), it is the time to a full reset.
	RetryAfter time.Duration
	// Delay is how long an admitted request must wait before it proceeds: a
	// shaping leaky bucket's queue ahead of it (at most Request.MaxDelay),
	// 0 for everything else. The request's slot is already reserved.
	Delay time.Duration
	// Cached reports that Redis was not asked: a Batcher answered the Take
	// from its over-limit cache. The rejecting request's Remaining is what
	// Redis last reported and its RetryAfter and ResetAfter are counted down
	// on the local clock; the other requests of the Take were not decided at
	// all: they carry Allowed true, their Limit and zero Remaining,
	// ResetAfter and RetryAfter.
	Cached bool
}

// ErrInvalidRequest reports a Request whose numbers cannot describe a limit.
var ErrInvalidRequest = errors.New("invalid limiter request")

// ErrUnsupportedAlgorithm reports a Request whose algorithm this engine does
// not implement.
var ErrUnsupportedAlgorithm = errors.New("unsupported limiter algorithm")

// Redis is the limiter engine backed by Redis (standalone, Sentinel or
// Cluster): each Take is one script call per hash slot it touches, sent as
// it comes. It is safe for concurrent use. An enforcer normally wraps it in
// a Batcher.
type Redis struct {
	client  redis.UniversalClient
	cluster *redis.ClusterClient // nil when not on a cluster
	// now, when set, replaces Redis TIME in the script: tests inject time
	// with it. Production never sets it.
	now func() int64
	// clocks estimates Redis's clock for Flush (async.go).
	clocks redisClocks
}

// NewRedis returns an engine that keeps its counters through client. The
// client should be built by NewClient (short timeouts, no retries); Redis
// does not close it. A *redis.ClusterClient makes Take group keys by slot.
//
// On a cluster, a call that fails without a reply from Redis (a node
// unreachable or slow) makes the client reload its slot map: go-redis
// otherwise reloads it only on a MOVED or ASK reply, which a dead master
// never sends, or once a minute, so after a failover checks would fail
// over to the failure mode for up to a minute instead of reaching the
// promoted replica. Reloads are asynchronous and at most one per 200 ms.
func NewRedis(client redis.UniversalClient) *Redis {
	cluster, _ := client.(*redis.ClusterClient)
	return &Redis{client: client, cluster: cluster}
}

// Take decides reqs and returns one Decision per request, in order. It is
// all-or-nothing: if any request is not allowed, nothing is consumed from any
// of them (on Redis Cluster with keys on several slots, once Take has
// returned: see the package documentation). An error (invalid request, Redis unreachable or slow)
// means no decision was made; the caller's failure mode decides.
func (r *Redis) Take(ctx context.Context, reqs []Request) ([]Decision, error) {
	if len(reqs) == 0 {
		return []Decision{}, nil
	}
	specs, err := specsOf(reqs)
	if err != nil {
		return nil, err
	}
	return r.take(ctx, specs, func(ctx context.Context, calls []*takeCall) error {
		r.exec(ctx, calls, true)
		return nil
	})
}

// Ping checks that client reaches Redis; /readyz uses it.
func Ping(ctx context.Context, client redis.UniversalClient) error {
	if err := client.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("ping redis: %w", err)
	}
	return nil
}

// mode says what the script does with one Take (see take.lua).
type mode byte

const (
	modeTake   mode = 't' // commit only if every request is allowed
	modeCheck  mode = 'c' // decide, never commit
	modeRefund mode = 'r' // give back what a modeTake call of the same requests took
)

// clockReport is the clock of a call that reads Redis TIME and reports the
// time it used (see take.lua's ARGV[1]).
const clockReport = "?"

// spec is a validated Request in the form the script reads.
type spec struct {
	key      string // state key: Request.Key + algorithm suffix
	code     string // algorithm code in the script
	limit    int64
	period   int64 // µs
	capacity int64 // bucket burst, or the window's limit
	hits     int64
	calendar int64 // 0 none, 1 day, 2 week, 3 month, 4 year
	maxDelay int64 // µs
}

// takeCall is one all-or-nothing unit the script decides: a whole Take, or
// the part of one that lives on one Redis Cluster slot.
type takeCall struct {
	mode  mode
	specs []spec
	idx   []int // idx[j] is the position of specs[j] in the caller's Take
	slot  int   // hash slot of every key; -1 when not on a cluster
	// clock is the script's clock for the call: "" Redis TIME, clockReport,
	// "~N" another node's time N (µs) bounded by this one's, "N" exactly N.
	clock string
	ds    []Decision
	now   int64 // the time the script used, when clock is not ""
	err   error
	done  chan struct{} // closed by a Batcher when ds or err is set
	// deadline is when a Batcher's caller stops waiting for the call.
	deadline time.Time
}

// runner executes calls, setting each one's ds or err. It returns an error
// only when it stopped waiting (the context ended); the calls must then not
// be read, as they may still be running.
type runner func(ctx context.Context, calls []*takeCall) error

// take is Take of validated, non-empty specs, with the way calls reach Redis
// left to run: directly (Redis) or through the batching queue (Batcher).
func (r *Redis) take(ctx context.Context, specs []spec, run runner) ([]Decision, error) {
	calls := r.group(specs)
	if len(calls) == 1 {
		c := calls[0]
		c.mode = modeTake
		if err := run(ctx, calls); err != nil {
			return nil, err
		}
		if c.err != nil {
			return nil, c.err
		}
		return c.ds, nil
	}

	return r.takeAcross(ctx, calls, len(specs), run)
}

// takeAcross is take of keys on several Redis Cluster slots: reserve, then
// refund (see the package documentation). The first slot's call takes what
// its requests ask if they all fit, on its node's clock, which it reports;
// then the others, in parallel, do the same at that time. If any refused,
// the calls that took give it back before takeAcross returns.
func (r *Redis) takeAcross(ctx context.Context, calls []*takeCall, n int, run runner) ([]Decision, error) {
	first, rest := calls[0], calls[1:]
	first.mode, first.clock = modeTake, clockReport
	if err := run(ctx, calls[:1]); err != nil {
		r.refundLater(calls[:1])
		return nil, err
	}
	if first.err != nil {
		return nil, first.err
	}
	took := allowed(first.ds)
	m, clock := modeCheck, strconv.FormatInt(first.now, 10)
	if took {
		m = modeTake
	}
	if r.now == nil {
		clock = "~" + clock // bounded by each node's own clock
	}
	for _, c := range rest {
		// One deadline for all the reservations (a Batcher's; zero else).
		c.mode, c.clock, c.deadline = m, clock, first.deadline
	}
	if err := run(ctx, rest); err != nil {
		if took {
			r.refundLater(calls)
		}
		return nil, fmt.Errorf("reserve on %d more cluster slots: %w", len(rest), err)
	}
	if err := firstErr(rest); err != nil {
		if took {
			r.refund(ctx, calls, run)
		}
		return nil, fmt.Errorf("reserve on %d more cluster slots: %w", len(rest), err)
	}
	ds := gather(calls, n)
	if allowed(ds) {
		return ds, nil
	}
	if took {
		for _, c := range r.refund(ctx, calls, run) {
			for j, i := range c.idx {
				ds[i] = c.ds[j]
			}
		}
	}
	return ds, nil
}

// allowed reports whether every decision of ds allows.
func allowed(ds []Decision) bool {
	for _, d := range ds {
		if !d.Allowed {
			return false
		}
	}
	return true
}

// taken reports whether c took something: a modeTake call that was decided
// and allowed, with hits to give back.
func taken(c *takeCall) bool {
	if c.mode != modeTake || c.err != nil || c.ds == nil || !allowed(c.ds) {
		return false
	}
	for _, s := range c.specs {
		if s.hits > 0 {
			return true
		}
	}
	return false
}

// refund gives back, at the time each took it, what the calls that took
// something took, and returns the refund calls that succeeded: their
// decisions report the limits as the refund left them. It does not stop
// when ctx ends: a reservation must not outlive its Take. A refund that
// fails leaves its hits consumed (the limit under-admits by them until
// they would have expired anyway).
func (r *Redis) refund(ctx context.Context, calls []*takeCall, run runner) []*takeCall {
	var back []*takeCall
	for _, c := range calls {
		if taken(c) {
			back = append(back, &takeCall{mode: modeRefund, specs: c.specs, idx: c.idx, slot: c.slot,
				clock: strconv.FormatInt(c.now, 10)})
		}
	}
	if len(back) == 0 {
		return nil
	}
	if err := run(context.WithoutCancel(ctx), back); err != nil {
		return nil
	}
	return slices.DeleteFunc(back, func(c *takeCall) bool { return c.err != nil })
}

// refundLater refunds, once they have been decided, what calls took: a
// Take that stopped waiting (its context ended, the Batcher's timeout)
// returns an error, and its calls may still take in Redis after that.
func (r *Redis) refundLater(calls []*takeCall) {
	go func() {
		for _, c := range calls {
			if c.done != nil {
				<-c.done
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		r.refund(ctx, calls, func(ctx context.Context, calls []*takeCall) error {
			r.exec(ctx, calls, false)
			return nil
		})
	}()
}

// group splits specs into one takeCall per hash slot (one call in all when
// not on a cluster), keeping their order within each call.
func (r *Redis) group(specs []spec) []*takeCall {
	if r.cluster == nil {
		idx := make([]int, len(specs))
		for i := range idx {
			idx[i] = i
		}
		return []*takeCall{{specs: specs, idx: idx, slot: -1}}
	}
	var calls []*takeCall
	for i, s := range specs {
		slot := Slot(s.key)
		var c *takeCall
		for _, have := range calls {
			if have.slot == slot {
				c = have
				break
			}
		}
		if c == nil {
			c = &takeCall{slot: slot}
			calls = append(calls, c)
		}
		c.specs = append(c.specs, s)
		c.idx = append(c.idx, i)
	}
	return calls
}

func firstErr(calls []*takeCall) error {
	for _, c := range calls {
		if c.err != nil {
			return c.err
		}
	}
	return nil
}

// gather puts the decisions of calls back in the caller's order.
func gather(calls []*takeCall, n int) []Decision {
	ds := make([]Decision, n)
	for _, c := range calls {
		for j, i := range c.idx {
			ds[i] = c.ds[j]
		}
	}
	return ds
}

// maxCount bounds limits and capacities: the script computes in doubles,
// exact for integers up to 2^53.
const maxCount = 1 << 53

// calendarPeriods maps the periods Request.Calendar accepts to the script's
// calendar codes.
var calendarPeriods = map[time.Duration]int64{
	rules.Day.Period():   1,
	rules.Week.Period():  2,
	rules.Month.Period(): 3,
	rules.Year.Period():  4,
}

// specsOf validates reqs and converts them for the script.
func specsOf(reqs []Request) ([]spec, error) {
	specs := make([]spec, len(reqs))
	for i, req := range reqs {
		s, err := specOf(req)
		if err != nil {
			return nil, fmt.Errorf("request %d: %w", i, err)
		}
		specs[i] = s
	}
	return specs, nil
}

func specOf(req Request) (spec, error) {
	alg := req.Algorithm
	if alg == "" {
		alg = rules.TokenBucket
	}
	info, ok := algorithms[alg]
	if !ok {
		return spec{}, fmt.Errorf("%w: %q", ErrUnsupportedAlgorithm, alg)
	}
	switch {
	case req.Key == "":
		return spec{}, fmt.Errorf("%w: empty key", ErrInvalidRequest)
	case req.Limit <= 0 || req.Limit > maxCount:
		return spec{}, fmt.Errorf("%w: limit %d is not in [1, 2^53]", ErrInvalidRequest, req.Limit)
	case req.Period < time.Microsecond || req.Period > maxMicros*time.Microsecond:
		return spec{}, fmt.Errorf("%w: period %v is not in [1µs, 285y]", ErrInvalidRequest, req.Period)
	case req.Burst < 0 || req.Burst > maxCount:
		return spec{}, fmt.Errorf("%w: burst %d is not in [0, 2^53]", ErrInvalidRequest, req.Burst)
	case req.Hits < 0:
		return spec{}, fmt.Errorf("%w: hits %d is negative", ErrInvalidRequest, req.Hits)
	case req.MaxDelay < 0:
		return spec{}, fmt.Errorf("%w: max delay %v is negative", ErrInvalidRequest, req.MaxDelay)
	}
	s := spec{
		key:    req.Key + info.suffix,
		code:   info.code,
		limit:  req.Limit,
		period: req.Period.Microseconds(),
		hits:   req.Hits,
	}
	s.capacity = req.Limit
	if info.bucket && req.Burst > 0 {
		s.capacity = req.Burst
	}
	if alg == rules.FixedWindow && req.Calendar {
		code, ok := calendarPeriods[req.Period]
		if !ok {
			return spec{}, fmt.Errorf("%w: calendar windows need the period of a day, week, month or year, not %v", ErrInvalidRequest, req.Period)
		}
		s.calendar = code
	}
	if alg == rules.LeakyBucket {
		// Round up so a sub-µs MaxDelay still means shaping.
		s.maxDelay = int64((req.MaxDelay + time.Microsecond - 1) / time.Microsecond)
	}
	return s, nil
}

// Share is one of n equal parts of a limit or a burst a: ⌈a/n⌉, rounded up
// so that the parts never add up to less than a, and at least 1 for a
// positive a. A non-positive a, or n below 2, leaves a as it is. The shards
// of a rule and the nodes sharing the local fallback both split this way.
func Share(a, n int64) int64 {
	if a <= 0 || n <= 1 {
		return a
	}
	return (a + n - 1) / n
}
