package limiter

import (
	"context"
	_ "embed" // async.lua
	"fmt"
	"strconv"
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

// Admitted is hits a node admitted at about one time: Age before the flush
// is sent (the node rounds its hits' times down to the start of a short
// interval, so Age is at least their real age).
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

// Flush counts fs in Redis, in as few script calls as the keys' hash slots
// and the call size allow, sent in one pipeline, and returns one Synced per
// Flush, in order. The error is for invalid input only; Redis failures are
// reported per key in Synced.Err.
func (r *Redis) Flush(ctx context.Context, fs []Flush) ([]Synced, error) {
	out := make([]Synced, len(fs))
	type call struct {
		keys []string
		args []any
		idx  []int
		cmd  *redis.Cmd
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
			c = &call{args: []any{now}}
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
	reloaded := false
	for _, c := range calls {
		reply, err := c.cmd.Result()
		if err == nil {
			err = decodeSynced(reply, out, c.idx)
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

// decodeSynced reads a flush reply: two integers per key of idx.
func decodeSynced(reply any, out []Synced, idx []int) error {
	v, ok := reply.([]any)
	if !ok || len(v) != 2*len(idx) {
		return fmt.Errorf("%w: flush reply %T of %d values", errMalformedReply, reply, len(v))
	}
	for j, i := range idx {
		rem, ok1 := v[2*j].(int64)
		reset, ok2 := v[2*j+1].(int64)
		if !ok1 || !ok2 {
			return fmt.Errorf("%w: flush values %T, %T", errMalformedReply, v[2*j], v[2*j+1])
		}
		out[i] = Synced{Remaining: min(rem, maxCount), ResetAfter: micros(reset)}
	}
	return nil
}
