package limiter

import (
	"context"
	_ "embed" // the Lua sources
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/rules"
)

// The limiter runs one Lua script, assembled from one file per algorithm and
// the driver (take.lua). One script for every algorithm is what lets a single
// call decide keys of different algorithms all-or-nothing.
var (
	//go:embed take.lua
	takeLua string
	//go:embed token_bucket.lua
	tokenBucketLua string
	//go:embed leaky_bucket.lua
	leakyBucketLua string
	//go:embed fixed_window.lua
	fixedWindowLua string
	//go:embed sliding_window_log.lua
	slidingWindowLogLua string
	//go:embed sliding_window_counter.lua
	slidingWindowCounterLua string
)

// algorithmInfo is what the engine knows about one algorithm.
type algorithmInfo struct {
	// code names the algorithm in the script's arguments (short: it is sent
	// with every request).
	code string
	// suffix is appended to Request.Key (after its hash tag, so the slot is
	// unchanged) to form the key the algorithm keeps its state under.
	// Algorithms never share state: switching a limit's algorithm starts it
	// afresh instead of misreading (or failing with WRONGTYPE on) another
	// algorithm's value.
	suffix string
	// bucket is set for the algorithms whose capacity is Burst.
	bucket bool
	lua    string
}

// algorithms lists every supported algorithm. Adding one is one .lua file and
// one entry here (and its Go twin in local.go).
var algorithms = map[rules.Algorithm]algorithmInfo{
	rules.TokenBucket:          {code: "tb", suffix: ":tb", bucket: true, lua: tokenBucketLua},
	rules.LeakyBucket:          {code: "lb", suffix: ":lb", bucket: true, lua: leakyBucketLua},
	rules.FixedWindow:          {code: "fw", suffix: ":fw", lua: fixedWindowLua},
	rules.SlidingWindowLog:     {code: "sl", suffix: ":sl", lua: slidingWindowLogLua},
	rules.SlidingWindowCounter: {code: "sc", suffix: ":sc", lua: slidingWindowCounterLua},
}

// valuesPerRequest is the number of integers take.lua returns per request.
const valuesPerRequest = 5

var takeScript = redis.NewScript(assemble(takeLua))

// assemble builds a script source: each algorithm file wrapped in a
// function (so its locals stay its own) that algorithm(code) calls to build
// its module on first use in a call, then the driver (take.lua, or
// lease.lua for the lease script). Building only the
// algorithms a call uses matters: the script body runs on every call, and an
// if-chain over locals creates no closure or table for the ones it skips.
func assemble(driver string) string {
	// Sorted, so every node runs a byte-identical script (one SHA in the cache).
	codes := make([]string, 0, len(algorithms))
	byCode := map[string]string{}
	for _, info := range algorithms {
		codes = append(codes, info.code)
		byCode[info.code] = info.lua
	}
	slices.Sort(codes)
	var b strings.Builder
	b.WriteString("local m_" + strings.Join(codes, ", m_") + "\nlocal function algorithm(code)\n")
	for i, code := range codes {
		kw := "elseif"
		if i == 0 {
			kw = "if"
		}
		fmt.Fprintf(&b, "\t%s code == %q then\n\t\tif m_%s == nil then\n\t\t\tm_%s = (function()\n%s\nend)()\n\t\tend\n\t\treturn m_%s\n",
			kw, code, code, code, byCode[code], code)
	}
	b.WriteString("\tend\n\treturn nil\nend\n")
	b.WriteString(driver)
	return b.String()
}

// Limits of one script call. A call runs atomically on the Redis server,
// blocking it, so it must stay short: a request costs the script 1–3 µs, so
// a full call runs for about a millisecond at most.
const (
	maxTakesPerScript    = 256
	maxRequestsPerScript = 512
)

// invocation is one script call deciding one or more takeCalls, all on one
// hash slot.
type invocation struct {
	clock  string // ARGV[1]: see takeCall.clock
	calls  []*takeCall
	keys   []string
	limits []limitParams // distinct limits, numbered from 1 in the script
	index  map[limitParams]int
	takes  []any // the per-Take part of ARGV
	n      int   // requests
	cmd    *redis.Cmd

	// The argument of the last Take of one request, and what it encodes.
	last     string
	lastMode mode
	lastJ    int
	lastHits int64
}

// limitParams is what the script needs to know about a limit besides its key.
type limitParams struct {
	code                                        string
	limit, period, capacity, calendar, maxDelay int64
}

// add appends c's keys and per-Take arguments (see take.lua): "<mode><j>:<hits>"
// for a Take of one request, else "<mode><count>" and "<j>:<hits>" per
// request.
func (inv *invocation) add(c *takeCall) {
	if len(inv.calls) == 0 || c.clock == clockReport {
		inv.clock = c.clock // "" and "?" share calls; the others are alone
	}
	inv.calls = append(inv.calls, c)
	if len(c.specs) == 1 {
		s := c.specs[0]
		inv.keys = append(inv.keys, s.key)
		j := inv.limitNumber(s)
		// Consecutive Takes are often alike (a hot key): reuse the text.
		if inv.last == "" || c.mode != inv.lastMode || j != inv.lastJ || s.hits != inv.lastHits {
			b := append(make([]byte, 0, 24), byte(c.mode))
			b = strconv.AppendInt(b, int64(j), 10)
			b = append(b, ':')
			b = strconv.AppendInt(b, s.hits, 10)
			inv.last, inv.lastMode, inv.lastJ, inv.lastHits = string(b), c.mode, j, s.hits
		}
		inv.takes = append(inv.takes, inv.last)
	} else {
		inv.takes = append(inv.takes, string(rune(c.mode))+strconv.Itoa(len(c.specs)))
		for _, s := range c.specs {
			inv.keys = append(inv.keys, s.key)
			inv.takes = append(inv.takes, strconv.Itoa(inv.limitNumber(s))+":"+strconv.FormatInt(s.hits, 10))
		}
	}
	inv.n += len(c.specs)
}

// limitNumber returns the script's number for s's limit, adding it if new.
func (inv *invocation) limitNumber(s spec) int {
	p := limitParams{s.code, s.limit, s.period, s.capacity, s.calendar, s.maxDelay}
	if inv.index != nil {
		if i, ok := inv.index[p]; ok {
			return i
		}
	} else {
		// Usually a call holds a handful of limits: a scan beats a map.
		for i, have := range inv.limits {
			if have == p {
				return i + 1
			}
		}
	}
	inv.limits = append(inv.limits, p)
	i := len(inv.limits)
	if inv.index != nil {
		inv.index[p] = i
	} else if i == 8 {
		inv.index = make(map[limitParams]int, 16)
		for j, have := range inv.limits {
			inv.index[have] = j + 1
		}
	}
	return i
}

// args returns the script's ARGV, with now as ARGV[1] when set (tests'
// clock), else the invocation's clock.
func (inv *invocation) args(now string) []any {
	args := make([]any, 0, 2+6*len(inv.limits)+len(inv.takes))
	args = append(args, inv.arg1(now), len(inv.limits))
	for _, p := range inv.limits {
		args = append(args, p.code, p.limit, p.period, p.capacity, p.calendar, p.maxDelay)
	}
	return append(args, inv.takes...)
}

// arg1 is the script's ARGV[1]: the call's clock, or the tests' fixed time
// in place of Redis TIME.
func (inv *invocation) arg1(now string) string {
	if now != "" && (inv.clock == "" || inv.clock == clockReport) {
		return now
	}
	return inv.clock
}

// clockKey is how exec finds the open invocation of a slot and clock.
type clockKey struct {
	slot  int
	clock string
}

// exec runs calls, one script call each, or, with pack, one script call per
// hash slot for all calls on it (within the size limits), and sets each
// call's ds or err. Several script calls go in one pipeline.
func (r *Redis) exec(ctx context.Context, calls []*takeCall, pack bool) {
	now := ""
	if r.now != nil {
		now = strconv.FormatInt(r.now(), 10)
	}
	var invs []*invocation
	var open map[int]*invocation        // slot → invocation on Redis's clock still taking calls
	var openAt map[clockKey]*invocation // the same on a given clock (rare)
	if pack && len(calls) > 1 {
		open = make(map[int]*invocation)
	}
	for _, c := range calls {
		var inv *invocation
		timed := c.clock != "" && c.clock != clockReport
		switch {
		case open == nil:
		case !timed:
			inv = open[c.slot]
		case openAt != nil:
			inv = openAt[clockKey{c.slot, c.clock}]
		}
		if inv == nil || len(inv.calls) >= maxTakesPerScript || inv.n+len(c.specs) > maxRequestsPerScript {
			inv = &invocation{}
			invs = append(invs, inv)
			switch {
			case open == nil:
			case !timed:
				open[c.slot] = inv
			default:
				if openAt == nil {
					openAt = make(map[clockKey]*invocation)
				}
				openAt[clockKey{c.slot, c.clock}] = inv
			}
		}
		inv.add(c)
	}

	r.run(ctx, invs, now)

	// A Redis error reply (not a connection failure) in a packed call is one
	// of its Takes failing, say WRONGTYPE on a key something else wrote: run
	// those calls again one by one, so the others still get decided. The
	// script fails before writing anything (state is read, and its type
	// checked, before any write), so nothing is counted twice.
	var alone []*invocation
	for i, inv := range invs {
		var rerr redis.Error
		if len(inv.calls) > 1 && errors.As(inv.cmd.Err(), &rerr) {
			for _, c := range inv.calls {
				one := &invocation{}
				one.add(c)
				alone = append(alone, one)
			}
			invs[i] = nil
		}
	}
	if len(alone) > 0 {
		r.run(ctx, alone, now)
		invs = append(slices.DeleteFunc(invs, func(inv *invocation) bool { return inv == nil }), alone...)
	}

	reloaded := false
	for _, inv := range invs {
		reply, err := inv.cmd.Result()
		if err != nil {
			var rerr redis.Error
			if r.cluster != nil && !reloaded && !errors.As(err, &rerr) {
				r.cluster.ReloadState(ctx) // see NewRedis
				reloaded = true
			}
			err = fmt.Errorf("run limiter script: %w", err)
			for _, c := range inv.calls {
				c.ds, c.err = nil, err
			}
			continue
		}
		if err := decode(reply, inv.calls, inv.n, inv.arg1(now) != ""); err != nil {
			err = fmt.Errorf("decode limiter script reply: %w", err)
			for _, c := range inv.calls {
				c.ds, c.err = nil, err
			}
		}
	}
}

// run sends invs with EVALSHA, in one pipeline when there are several, and
// sends again with EVAL (which loads the script) those that failed with
// NOSCRIPT: the script cache was flushed or the server restarted. A NOSCRIPT
// reply means the script did not run, so the retry cannot double-count.
func (r *Redis) run(ctx context.Context, invs []*invocation, now string) {
	if len(invs) == 1 {
		inv := invs[0]
		args := inv.args(now)
		inv.cmd = takeScript.EvalSha(ctx, r.client, inv.keys, args...)
		if isNoScript(inv.cmd.Err()) {
			inv.cmd = takeScript.Eval(ctx, r.client, inv.keys, args...)
		}
		return
	}
	pipe := r.client.Pipeline()
	for _, inv := range invs {
		inv.cmd = takeScript.EvalSha(ctx, pipe, inv.keys, inv.args(now)...)
	}
	_, _ = pipe.Exec(ctx) // each command carries its own error
	var again []*invocation
	for _, inv := range invs {
		if isNoScript(inv.cmd.Err()) {
			again = append(again, inv)
		}
	}
	if len(again) == 0 {
		return
	}
	pipe = r.client.Pipeline()
	for _, inv := range again {
		inv.cmd = takeScript.Eval(ctx, pipe, inv.keys, inv.args(now)...)
	}
	_, _ = pipe.Exec(ctx)
}

// evalEach runs script once per i in [0, n), all in one pipeline, with
// the keys and arguments of call(i): by SHA, and again in full for the
// calls that found Redis without the script (NOSCRIPT). Each command
// carries its own error.
func (r *Redis) evalEach(ctx context.Context, script *redis.Script, n int, call func(i int) ([]string, []any)) []*redis.Cmd {
	cmds := make([]*redis.Cmd, n)
	send := func(eval func(*redis.Script, context.Context, redis.Scripter, []string, ...any) *redis.Cmd, which []int) {
		pipe := r.client.Pipeline()
		for _, i := range which {
			keys, args := call(i)
			cmds[i] = eval(script, ctx, pipe, keys, args...)
		}
		_, _ = pipe.Exec(ctx) // each command carries its own error
	}
	all := make([]int, n)
	for i := range all {
		all[i] = i
	}
	send((*redis.Script).EvalSha, all)
	var again []int
	for i, cmd := range cmds {
		if isNoScript(cmd.Err()) {
			again = append(again, i)
		}
	}
	if len(again) > 0 {
		send((*redis.Script).Eval, again)
	}
	return cmds
}

func isNoScript(err error) bool {
	return err != nil && redis.HasErrorPrefix(err, "NOSCRIPT")
}

// errMalformedReply marks a script reply that does not have the expected shape.
var errMalformedReply = errors.New("malformed limiter script reply")

// decode turns the script's flat integer reply (valuesPerRequest per request
// of every call, in order: allowed, remaining, reset_after µs, retry_after
// µs, delay µs; then, withNow, the time used) into each call's decisions
// (and now). It is the only place that interprets the reply.
func decode(reply any, calls []*takeCall, n int, withNow bool) error {
	vals, ok := reply.([]any)
	if !ok {
		return fmt.Errorf("%w: got %T, want an array", errMalformedReply, reply)
	}
	want := valuesPerRequest * n
	if withNow {
		want++
	}
	if len(vals) != want {
		return fmt.Errorf("%w: got %d values, want %d", errMalformedReply, len(vals), want)
	}
	var now int64
	if withNow {
		t, ok := vals[want-1].(int64)
		if !ok || t <= 0 {
			return fmt.Errorf("%w: time %v", errMalformedReply, vals[want-1])
		}
		now = t
	}
	at := 0
	for _, c := range calls {
		ds := make([]Decision, len(c.specs))
		for j, s := range c.specs {
			var v [valuesPerRequest]int64
			for x := range v {
				i, ok := vals[at].(int64)
				if !ok {
					return fmt.Errorf("%w: value %d is %T, want an integer", errMalformedReply, at, vals[at])
				}
				v[x] = i
				at++
			}
			if v[0] != 0 && v[0] != 1 {
				return fmt.Errorf("%w: allowed flag %d", errMalformedReply, v[0])
			}
			ds[j] = Decision{
				Allowed:    v[0] == 1,
				Limit:      s.capacity,
				Remaining:  min(max(v[1], 0), s.capacity),
				ResetAfter: micros(v[2]),
				RetryAfter: micros(v[3]),
				Delay:      micros(v[4]),
			}
		}
		c.ds, c.now = ds, now
	}
	return nil
}

// maxMicros matches MAX_US in take.lua; it keeps µs→ns conversion in range.
const maxMicros = 9_000_000_000_000_000

// micros converts a µs count from the script to a duration, clamped so a
// corrupted reply can never overflow.
func micros(us int64) time.Duration {
	return time.Duration(min(max(us, 0), maxMicros)) * time.Microsecond
}
