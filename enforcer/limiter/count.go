package limiter

import (
	"context"
	_ "embed" // count.lua, presence.lua
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Counting usage admitted elsewhere, and presence: what the enforcer's Rate
// Limit Quota Service needs besides Take. Its clients (Envoys) admit
// requests themselves against the share of a limit they were assigned and
// report what they admitted; Count adds those reports to the same counters
// checks take from, and the presence sets say how many clients a limit is
// shared between.

//go:embed count.lua
var countLua string

//go:embed presence.lua
var presenceLua string

var (
	countScript    = redis.NewScript(assemble(countLua))
	presenceScript = redis.NewScript(presenceLua)
)

// Usage is hits admitted elsewhere, over the Elapsed time before now, to be
// counted in a limit (Request, whose Hits they are; MaxDelay is ignored).
type Usage struct {
	Request
	Elapsed time.Duration
}

// Count adds each usage's hits to its limit, whether or not they fit (they
// were admitted already): a counter over its limit rejects checks until it
// has recovered. A token or leaky bucket is charged as of Elapsed before
// now (at most one period), so the refill of that time pays for them; the
// windows count them in the current window; a sliding_window_log logs at
// most what its window still has room for. Each usage is counted on its
// own (nothing is all-or-nothing here), one script call each, in one
// pipeline. It returns the limits' states after counting, in order; Hits
// of 0 only read the state. The caller bounds the hits (see package rlqs):
// a bucket's debt lasts as long as the hits over its capacity take to
// refill.
func (r *Redis) Count(ctx context.Context, us []Usage) ([]State, error) {
	if len(us) == 0 {
		return []State{}, nil
	}
	specs := make([]spec, len(us))
	for i, u := range us {
		u.MaxDelay = 0
		s, err := specOf(u.Request)
		if err != nil {
			return nil, fmt.Errorf("usage %d: %w", i, err)
		}
		if u.Elapsed < 0 {
			return nil, fmt.Errorf("usage %d: %w: elapsed %v is negative", i, ErrInvalidRequest, u.Elapsed)
		}
		specs[i] = s
	}
	now := ""
	if r.now != nil {
		now = strconv.FormatInt(r.now(), 10)
	}
	cmds := r.evalEach(ctx, countScript, len(us), func(i int) ([]string, []any) {
		s := specs[i]
		return []string{s.key}, []any{now, s.code, s.limit, s.period, s.capacity, s.calendar, s.hits, min(us[i].Elapsed.Microseconds(), maxMicros)}
	})
	out := make([]State, len(us))
	for i, cmd := range cmds {
		reply, err := cmd.Result()
		if err != nil {
			var rerr redis.Error
			if r.cluster != nil && !errors.As(err, &rerr) {
				r.cluster.ReloadState(ctx) // see NewRedis
			}
			return nil, fmt.Errorf("run count script: %w", err)
		}
		v, ok := reply.([]any)
		if !ok || len(v) != 3 {
			return nil, fmt.Errorf("%w: count reply %T of %d values", errMalformedReply, reply, lenOf(reply))
		}
		var n [3]int64
		for x := range n {
			if n[x], ok = v[x].(int64); !ok {
				return nil, fmt.Errorf("%w: count value %d is %T", errMalformedReply, x, v[x])
			}
		}
		s := specs[i]
		out[i] = State{
			Limit:      s.capacity,
			Remaining:  min(max(n[0], 0), s.capacity),
			ResetAfter: micros(n[1]),
			At:         time.UnixMicro(n[2]).UTC(),
		}
	}
	return out, nil
}

// Presence is one member of a presence set: Key is the set's Redis key,
// Member the member's name, TTL how long it counts after joining (Join).
type Presence struct {
	Key, Member string
	TTL         time.Duration
}

// Join adds each presence's member to its set, or refreshes it, until its
// TTL from now (Redis TIME; at least 1 ms), and returns each set's member
// count after the call, expired members left out: one script call per set,
// in one pipeline.
func (r *Redis) Join(ctx context.Context, ps []Presence) ([]int64, error) {
	return r.presence(ctx, "j", ps)
}

// Leave removes each presence's member from its set and returns the sets'
// member counts after it.
func (r *Redis) Leave(ctx context.Context, ps []Presence) ([]int64, error) {
	return r.presence(ctx, "l", ps)
}

// Members returns the member counts of the sets of ps (their Member is
// ignored), expired members left out.
func (r *Redis) Members(ctx context.Context, ps []Presence) ([]int64, error) {
	return r.presence(ctx, "c", ps)
}

func (r *Redis) presence(ctx context.Context, op string, ps []Presence) ([]int64, error) {
	if len(ps) == 0 {
		return []int64{}, nil
	}
	for i, p := range ps {
		if p.Key == "" || (op != "c" && p.Member == "") {
			return nil, fmt.Errorf("presence %d: %w: empty key or member", i, ErrInvalidRequest)
		}
	}
	cmds := r.evalEach(ctx, presenceScript, len(ps), func(i int) ([]string, []any) {
		return []string{ps[i].Key}, []any{op, ps[i].Member, max(ps[i].TTL.Milliseconds(), 1)}
	})
	out := make([]int64, len(ps))
	for i, cmd := range cmds {
		n, err := cmd.Int64()
		if err != nil {
			return nil, fmt.Errorf("run presence script: %w", err)
		}
		out[i] = n
	}
	return out, nil
}

// Count reads or adds usage as Redis.Count does, without batching (usage
// reports are few next to checks). The over-limit cache learns nothing
// from it: a limit a report pushed over is found over by the next Take.
func (b *Batcher) Count(ctx context.Context, us []Usage) ([]State, error) {
	return b.r.Count(ctx, us)
}
