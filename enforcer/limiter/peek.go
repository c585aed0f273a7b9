package limiter

import (
	"context"
	_ "embed" // peek.lua
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Peeking: reading a limit's counter without consuming anything, for the
// console's support desk. The peek script decides 0 hits with the same
// algorithm modules as a Take and writes nothing; it runs with EVALSHA_RO
// where the server has it (Redis 7+), so the server refuses any write too.

//go:embed peek.lua
var peekLua string

var peekScript = redis.NewScript(assemble(peekLua))

// State is a limit's counter as Peek read it.
type State struct {
	// Limit is the capacity: a bucket's burst, a window's limit.
	Limit int64
	// Remaining is what the limit would admit right now (0..Limit).
	Remaining int64
	// ResetAfter is the time until the limit is back to full if nothing
	// else arrives.
	ResetAfter time.Duration
	// At is the store's time of the reading (Redis TIME).
	At time.Time
}

// Used is what the limit has counted: Limit - Remaining.
func (s State) Used() int64 { return s.Limit - s.Remaining }

// Peek reads the counters of reqs (their Hits and MaxDelay are ignored)
// without consuming anything or writing to the store: one script call per
// hash slot, in one pipeline. It returns one State per request, in order.
func (r *Redis) Peek(ctx context.Context, reqs []Request) ([]State, error) {
	if len(reqs) == 0 {
		return []State{}, nil
	}
	specs := make([]spec, len(reqs))
	for i, req := range reqs {
		req.Hits, req.MaxDelay = 0, 0
		s, err := specOf(req)
		if err != nil {
			return nil, fmt.Errorf("request %d: %w", i, err)
		}
		specs[i] = s
	}
	now := ""
	if r.now != nil {
		now = strconv.FormatInt(r.now(), 10)
	}
	calls := r.group(specs)
	cmds := make([]*redis.Cmd, len(calls))
	keys := make([][]string, len(calls))
	args := make([][]any, len(calls))
	for i, c := range calls {
		keys[i] = make([]string, len(c.specs))
		args[i] = append(make([]any, 0, 1+5*len(c.specs)), now)
		for j, s := range c.specs {
			keys[i][j] = s.key
			args[i] = append(args[i], s.code, s.limit, s.period, s.capacity, s.calendar)
		}
	}
	ro := true
	send := func(eval func(*redis.Script, context.Context, redis.Scripter, []string, ...any) *redis.Cmd, which []int) {
		if len(which) == 1 {
			i := which[0]
			cmds[i] = eval(peekScript, ctx, r.client, keys[i], args[i]...)
			return
		}
		pipe := r.client.Pipeline()
		for _, i := range which {
			cmds[i] = eval(peekScript, ctx, pipe, keys[i], args[i]...)
		}
		_, _ = pipe.Exec(ctx) // each command carries its own error
	}
	all := make([]int, len(calls))
	for i := range all {
		all[i] = i
	}
	send((*redis.Script).EvalShaRO, all)
	if unknownCommand(cmds) {
		// Before Redis 7: the script writes nothing either way.
		ro = false
		send((*redis.Script).EvalSha, all)
	}
	var again []int
	for i, cmd := range cmds {
		if isNoScript(cmd.Err()) {
			again = append(again, i)
		}
	}
	if len(again) > 0 {
		if ro {
			send((*redis.Script).EvalRO, again)
		} else {
			send((*redis.Script).Eval, again)
		}
	}

	out := make([]State, len(reqs))
	for i, c := range calls {
		reply, err := cmds[i].Result()
		if err != nil {
			var rerr redis.Error
			if r.cluster != nil && !errors.As(err, &rerr) {
				r.cluster.ReloadState(ctx) // see NewRedis
			}
			return nil, fmt.Errorf("run peek script: %w", err)
		}
		vals, ok := reply.([]any)
		if !ok || len(vals) != 2*len(c.specs)+1 {
			return nil, fmt.Errorf("%w: peek reply %T of %d values for %d limits", errMalformedReply, reply, lenOf(reply), len(c.specs))
		}
		ints := make([]int64, len(vals))
		for x, v := range vals {
			if ints[x], ok = v.(int64); !ok {
				return nil, fmt.Errorf("%w: peek value %d is %T", errMalformedReply, x, v)
			}
		}
		at := time.UnixMicro(ints[len(ints)-1]).UTC()
		for j, s := range c.specs {
			out[c.idx[j]] = State{
				Limit:      s.capacity,
				Remaining:  min(max(ints[2*j], 0), s.capacity),
				ResetAfter: micros(ints[2*j+1]),
				At:         at,
			}
		}
	}
	return out, nil
}

// unknownCommand reports whether the server refused EVALSHA_RO as a command
// it does not know (Redis before 7).
func unknownCommand(cmds []*redis.Cmd) bool {
	for _, cmd := range cmds {
		if redis.HasErrorPrefix(cmd.Err(), "unknown command") {
			return true
		}
	}
	return false
}

func lenOf(reply any) int {
	if v, ok := reply.([]any); ok {
		return len(v)
	}
	return 0
}

// StateKeys returns every key the limiter may keep a limit's state under
// for key (a Request.Key): one per algorithm, all on key's hash slot.
func StateKeys(key string) []string {
	out := make([]string, 0, len(algorithms))
	for _, info := range algorithms {
		out = append(out, key+info.suffix)
	}
	slices.Sort(out)
	return out
}

// Reset deletes the state of the limits whose Request.Key is in keys, under
// every algorithm, so their counters start afresh: one DEL per key (its
// algorithms' state keys share its hash slot, so Redis Cluster accepts it),
// in one pipeline. It returns how many state keys existed.
func (r *Redis) Reset(ctx context.Context, keys []string) (int64, error) {
	if len(keys) == 0 {
		return 0, nil
	}
	pipe := r.client.Pipeline()
	cmds := make([]*redis.IntCmd, len(keys))
	for i, k := range keys {
		if k == "" {
			return 0, fmt.Errorf("%w: empty key", ErrInvalidRequest)
		}
		cmds[i] = pipe.Del(ctx, StateKeys(k)...)
	}
	_, _ = pipe.Exec(ctx)
	var n int64
	for _, cmd := range cmds {
		d, err := cmd.Result()
		if err != nil {
			return n, fmt.Errorf("delete limiter state: %w", err)
		}
		n += d
	}
	return n, nil
}
