package limiter

import (
	"context"
	_ "embed" // async.lua
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Async counting: a node may admit requests for a limit from its own view
// and send what it admitted to Redis afterwards, many keys in one call
// (Redis.Flush), learning each limit's remaining (the fleet's total) from
// the same round trip. The policy (when a node may decide alone) is the
// caller's; see package engine. Flush is the mechanism: it counts hits
// unconditionally (they were admitted already), each at the time it was
// admitted, so a window counts them in the window they were admitted in and
// a bucket refills as if they had been taken then.

//go:embed async.lua
var asyncLua string

var asyncScript = redis.NewScript(assemble(asyncLua))

// Admitted is hits a node admitted at about one time: Age before the
// flush's time (Flush's at; the node rounds its hits' times down to the start of a short
// interval, so Age is at least their real age). Flush turns ages into
// Redis's time through its estimate of Redis's clock (see redisClock), so a
// hit is counted at most that estimate's error before it was admitted, and
// never after.
type Admitted struct {
	Age  time.Duration
	Hits int64
}

// Flush is one limit's hits to count: Req names the limit (its Hits and
// MaxDelay are ignored), Admitted its hits, oldest first.
type Flush struct {
	Req      Request
	Admitted []Admitted
}

// Synced is what Redis reports for one Flush: the limit's remaining after
// its hits (negative when the fleet admitted more than the limit) and its
// time to a full reset; or Err, when that key's call failed (nothing of it
// may have been counted, or all of it).
type Synced struct {
	Remaining  int64
	ResetAfter time.Duration
	Err        error
}

// Limits of one flush call: it runs atomically on the server, so it stays
// short (a key costs the script a few µs).
const (
	maxFlushKeys = 256
	maxFlushArgs = 4096
)

// Asyncable reports whether Flush accepts req: every algorithm, but not a
// shaping leaky_bucket (each of its requests needs its own delay).
func Asyncable(req Request) bool {
	return req.MaxDelay == 0
}

// FlushMarkerTTL is how long Redis remembers that a call of a flush with
// an id was counted (see Flush): a flush retried with its id later than
// this may count its hits twice, so its sender gives up on it sooner.
const FlushMarkerTTL = 30 * time.Second

// Flush counts fs in Redis, in as few script calls as the keys' hash slots
// and the call size allow, sent in one pipeline, and returns one Synced per
// Flush, in order. The hits' ages count back from at, the node's time they
// were measured at (the zero time: the call's). The error is for invalid
// input only; Redis failures are reported per key in Synced.Err.
//
// A failed call may have been counted all the same (its answer timed out
// or was lost). id, unique to this flush on the fleet, makes retrying it
// safe: sent again with the same id and the same fs (the ages may differ:
// at moves on), within FlushMarkerTTL, every call counted the first time
// counts nothing again and reports the remaining. With id "" a retry may
// count twice.
func (r *Redis) Flush(ctx context.Context, at time.Time, id string, fs []Flush) ([]Synced, error) {
	out := make([]Synced, len(fs))
	type call struct {
		keys  []string
		args  []any
		idx   []int
		cmd   *redis.Cmd
		clock *redisClock
	}
	now := ""
	if r.now != nil {
		now = strconv.FormatInt(r.now(), 10)
	}
	var calls []*call
	open := map[int]*call{}
	for i, f := range fs {
		if !Asyncable(f.Req) {
			return nil, fmt.Errorf("%w: flush %d: a shaping leaky_bucket cannot be counted asynchronously", ErrInvalidRequest, i)
		}
		s, err := specOf(f.Req)
		if err != nil {
			return nil, fmt.Errorf("flush %d: %w", i, err)
		}
		slot := -1
		if r.cluster != nil {
			slot = Slot(s.key)
		}
		c := open[slot]
		if c == nil || len(c.keys) >= maxFlushKeys || len(c.args)+6+2*len(f.Admitted) > maxFlushArgs {
			c = &call{args: []any{now, "", ""}}
			calls = append(calls, c)
			open[slot] = c
		}
		c.keys = append(c.keys, s.key)
		c.idx = append(c.idx, i)
		c.args = append(c.args, s.code, s.limit, s.period, s.capacity, s.calendar, len(f.Admitted))
		for _, a := range f.Admitted {
			c.args = append(c.args, max(a.Age.Microseconds(), 0), max(a.Hits, 0))
		}
	}
	if len(calls) == 0 {
		return out, nil
	}
	if id != "" {
		ttl := strconv.FormatInt(FlushMarkerTTL.Milliseconds(), 10)
		for i, c := range calls {
			if m, ok := flushMarker(c.keys[0], id, i); ok {
				c.args[2] = ttl
				c.keys = append(c.keys, m)
			}
		}
	}
	sent := time.Now()
	if at.IsZero() || at.After(sent) {
		at = sent
	}
	if r.now == nil {
		for _, c := range calls {
			c.clock = r.clockOf(ctx, c.keys[0])
			if b, ok := c.clock.at(at); ok {
				c.args[1] = strconv.FormatInt(b, 10)
			}
		}
		sent = time.Now()
	}
	if len(calls) == 1 {
		c := calls[0]
		c.cmd = asyncScript.EvalSha(ctx, r.client, c.keys, c.args...)
	} else {
		_, _ = r.client.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, c := range calls {
				c.cmd = asyncScript.EvalSha(ctx, p, c.keys, c.args...)
			}
			return nil
		}) // each command carries its own error
	}
	for _, c := range calls {
		if isNoScript(c.cmd.Err()) {
			// Not run: loading it and running it again counts nothing twice.
			c.cmd = asyncScript.Eval(ctx, r.client, c.keys, c.args...)
		}
	}
	received := time.Now()
	reloaded := false
	for _, c := range calls {
		reply, err := c.cmd.Result()
		var at int64
		if err == nil {
			at, err = decodeSynced(reply, out, c.idx)
		}
		if err == nil && c.clock != nil {
			c.clock.observe(sent, received, at)
		}
		if err != nil {
			if r.cluster != nil && !reloaded {
				r.cluster.ReloadState(ctx) // see NewRedis
				reloaded = true
			}
			err = fmt.Errorf("run async flush script: %w", err)
			for _, i := range c.idx {
				out[i] = Synced{Err: err}
			}
		}
	}
	return out, nil
}

// flushMarker names the marker of call i of flush id, in the hash slot of
// key: its hash tag is the part of key that names key's slot. A key
// without a hash tag that holds a "}" has no such name (false).
func flushMarker(key, id string, i int) (string, bool) {
	tag := key
	if open := strings.IndexByte(key, '{'); open >= 0 {
		if n := strings.IndexByte(key[open+1:], '}'); n > 0 {
			tag = key[open+1 : open+1+n]
		}
	}
	if strings.IndexByte(tag, '}') >= 0 {
		return "", false
	}
	return "{" + tag + "}:sluice-flush:" + id + ":" + strconv.Itoa(i), true
}

// decodeSynced reads a flush reply: Redis's time (µs), then two integers
// per key of idx; it returns the time.
func decodeSynced(reply any, out []Synced, idx []int) (int64, error) {
	v, ok := reply.([]any)
	if !ok || len(v) != 1+2*len(idx) {
		return 0, fmt.Errorf("%w: flush reply %T of %d values", errMalformedReply, reply, len(v))
	}
	at, ok := v[0].(int64)
	if !ok {
		return 0, fmt.Errorf("%w: flush time %T", errMalformedReply, v[0])
	}
	v = v[1:]
	for j, i := range idx {
		rem, ok1 := v[2*j].(int64)
		reset, ok2 := v[2*j+1].(int64)
		if !ok1 || !ok2 {
			return 0, fmt.Errorf("%w: flush values %T, %T", errMalformedReply, v[2*j], v[2*j+1])
		}
		out[i] = Synced{Remaining: min(rem, maxCount), ResetAfter: micros(reset)}
	}
	return at, nil
}

// redisClock estimates Redis's clock from the flushes, as NTP does: a
// flush sent at s and answered at e (the node's monotonic clock) ran at
// Redis time x, so Redis's clock read x at some instant of [s, e]: at e it
// read x or later, at most e − s later. The estimate keeps
// the flush with the shortest round trip, whose error is smallest, and
// counts its age against it (1 ms per second, far more than clocks drift),
// so a faster flush later, or an old estimate, gives way.
type redisClock struct {
	mu   sync.Mutex
	have bool
	mono time.Time     // when x was read, at the latest (e)
	x    int64         // Redis's time, µs
	rtt  time.Duration // e − s
}

// clockAging is how fast an estimate's error is taken to grow.
const clockAging = 1000 // 1 ms per second

// at returns Redis's time (µs) at the node's time t, never later than it
// is, when an estimate exists.
func (c *redisClock) at(t time.Time) (int64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.have {
		return 0, false
	}
	// Redis's time at mono was x or later; since then it advanced as
	// the node's clock did, give or take the drift.
	el := t.Sub(c.mono)
	return c.x + (el - max(el, -el)/clockAging).Microseconds(), true
}

// observe takes a flush sent at s, answered at e, run at Redis time x.
func (c *redisClock) observe(s, e time.Time, x int64) {
	rtt := e.Sub(s)
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.have || rtt <= c.rtt+e.Sub(c.mono)/clockAging {
		c.have, c.mono, c.x, c.rtt = true, e, x, rtt
	}
}

// known reports whether an estimate exists.
func (c *redisClock) known() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.have
}

// redisClocks holds the clock estimates of one Redis: one, or on a
// cluster one per master (each has its own clock), by address.
type redisClocks struct {
	one redisClock
	mu  sync.Mutex
	by  map[string]*redisClock
}

// clockOf returns the clock of the server that holds key (on a cluster,
// key's master), reading it first (TIME) when it is not known yet. If that
// fails, the clock stays unknown and the flush counts its hits back from
// when it runs.
func (r *Redis) clockOf(ctx context.Context, key string) *redisClock {
	c, client := &r.clocks.one, redis.Cmdable(r.client)
	if r.cluster != nil {
		m, err := r.cluster.MasterForKey(ctx, key)
		if err != nil {
			return c
		}
		addr := m.Options().Addr
		r.clocks.mu.Lock()
		if r.clocks.by == nil {
			r.clocks.by = map[string]*redisClock{}
		}
		if c = r.clocks.by[addr]; c == nil {
			c = &redisClock{}
			r.clocks.by[addr] = c
		}
		r.clocks.mu.Unlock()
		client = m
	}
	if !c.known() {
		s := time.Now()
		if t, err := client.Time(ctx).Result(); err == nil {
			c.observe(s, time.Now(), t.UnixMicro())
		}
	}
	return c
}
