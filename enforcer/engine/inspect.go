package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/sluicehq/sluice/enforcer/limiter"
	"github.com/sluicehq/sluice/rules"
)

// Inspecting: which limits a request's descriptors match and what their
// counters hold, read without consuming anything, and resetting those
// counters. The console's support desk uses it, with the same matching and
// the same counter keys as Check, so it sees exactly what an enforcer
// counts.
//
// Accounting. A sharded limit is the sum over its shards: Used is what all
// of them counted (at most the limit's capacity), Remaining the capacity
// less Used, ResetAfter the latest of theirs. A leased unit (lease: true)
// was consumed in the store when the lease was granted, so it counts as
// used until a node spends it or gives it back, within a lease's lifetime
// (at most a second). Shadow-mode limits count like any other. Unlimited
// limits and limits of 0 requests_per_unit have no counter. The in-process
// counters of failure_mode: local (while the store is down) and the
// counters of a caller's per-descriptor limit override (Envoy's
// limit_override, Descriptor.Override, which Inspect ignores) are not
// inspected: only the engine's store is.

// Counters is what Inspect and Reset need from the counter store besides
// Take: limiter.Redis and limiter.Local satisfy it.
type Counters interface {
	Peek(ctx context.Context, reqs []limiter.Request) ([]limiter.State, error)
	Reset(ctx context.Context, keys []string) (int64, error)
}

// ErrUnknownDomain is returned by Inspect and Limits for a domain the
// applied ruleset does not configure.
var ErrUnknownDomain = errors.New("domain not in the ruleset")

// ErrNoCounters is returned by Inspect and Reset when the engine's store
// cannot be read or reset (it is not a Counters).
var ErrNoCounters = errors.New("the counter store cannot be inspected")

// Inspection is the limits a request's descriptors match, in request order.
type Inspection struct {
	// Version is the ruleset version they were matched in.
	Version int64
	Limits  []Inspected
}

// Inspected is one limit a descriptor matched, and its counter.
type Inspected struct {
	// Descriptor is the index of the request descriptor that matched it.
	Descriptor int
	Limit      *rules.Limit
	// Shards is the number of store keys it counts on (1 unless sharded; 0
	// for a limit without a counter).
	Shards int
	// Capacity is what the limit holds: a bucket's burst, a window's
	// requests_per_unit. Used + Remaining = Capacity.
	Capacity, Used, Remaining int64
	// ResetAfter is the time, from At, until the limit is back to full if
	// nothing else arrives.
	ResetAfter time.Duration
	// At is the store's time of the reading (zero when not read).
	At time.Time

	reqs []limiter.Request // one per shard; nil without a counter
}

// Counted reports whether the limit has a counter in the store.
func (l Inspected) Counted() bool { return len(l.reqs) > 0 }

// Keys returns the store keys of the limit's counter, one per shard.
func (l Inspected) Keys() []string {
	keys := make([]string, len(l.reqs))
	for i, r := range l.reqs {
		keys[i] = r.Key
	}
	return keys
}

// Limits matches req's descriptors against the applied ruleset as Check
// does (Lyft's replaces included) and returns the limits they match, with
// their counters' keys, without asking the store. req is bounded as
// Check's is: an error wrapping ErrInvalidRequest, ErrUnknownDomain or
// ErrNoRuleset.
func (e *Engine) Limits(req Request) (Inspection, error) {
	rs := e.current.Load()
	if rs == nil {
		return Inspection{}, ErrNoRuleset
	}
	if err := checkRequest(&req); err != nil {
		return Inspection{}, err
	}
	if !rs.domains[req.Domain] {
		return Inspection{}, fmt.Errorf("%w: %q", ErrUnknownDomain, req.Domain)
	}
	statuses := make([]Status, len(req.Descriptors))
	for i, d := range req.Descriptors {
		statuses[i].Limit = rs.set.Match(req.Domain, d.Entries)
	}
	dropReplaced(statuses)
	ins := Inspection{Version: rs.version, Limits: []Inspected{}}
	for i, s := range statuses {
		l := s.Limit
		if l == nil {
			continue
		}
		in := Inspected{Descriptor: i, Limit: l}
		if !l.Unlimited && !l.BlocksAll() {
			entries := l.CounterEntries(req.Descriptors[i].Entries, nil)
			r := e.counterRequest(req.Domain, entries, l, 0)
			in.Capacity = r.Limit
			if bucket(l.Algorithm) {
				in.Capacity = r.Burst
			}
			if n := int64(l.Shards); n > 1 {
				for shard := range uint64(n) {
					in.reqs = append(in.reqs, shardRequest(r, n, shard))
				}
			} else {
				in.reqs = []limiter.Request{r}
			}
			in.Shards = len(in.reqs)
			in.Remaining = in.Capacity
		}
		ins.Limits = append(ins.Limits, in)
	}
	return ins, nil
}

// bucket reports whether alg's capacity is its burst.
func bucket(alg rules.Algorithm) bool {
	return alg == "" || alg == rules.TokenBucket || alg == rules.LeakyBucket
}

// Inspect returns the limits req's descriptors match (see Limits) with
// their counters read from the store, without consuming anything: the store
// holds the same before and after.
func (e *Engine) Inspect(ctx context.Context, req Request) (Inspection, error) {
	ins, err := e.Limits(req)
	if err != nil {
		return Inspection{}, err
	}
	c, ok := e.store.(Counters)
	if !ok {
		return Inspection{}, ErrNoCounters
	}
	var reqs []limiter.Request
	for _, l := range ins.Limits {
		reqs = append(reqs, l.reqs...)
	}
	if len(reqs) == 0 {
		return ins, nil
	}
	states, err := c.Peek(ctx, reqs)
	if err != nil {
		return Inspection{}, err
	}
	if len(states) != len(reqs) {
		return Inspection{}, fmt.Errorf("store answered %d states for %d limits", len(states), len(reqs))
	}
	for i := range ins.Limits {
		l := &ins.Limits[i]
		var used int64
		for range l.reqs {
			s := states[0]
			states = states[1:]
			used += s.Used()
			l.ResetAfter = max(l.ResetAfter, s.ResetAfter)
			if s.At.After(l.At) {
				l.At = s.At
			}
		}
		l.Used = min(used, l.Capacity)
		l.Remaining = l.Capacity - l.Used
	}
	return ins, nil
}

// Reset deletes the counters of ins's limits (every shard of each) from
// the store, so they start afresh, and returns how many state keys
// existed. Each limit's keys go in one command per shard, on that shard's
// hash slot.
func (e *Engine) Reset(ctx context.Context, ins Inspection) (int64, error) {
	c, ok := e.store.(Counters)
	if !ok {
		return 0, ErrNoCounters
	}
	var keys []string
	for _, l := range ins.Limits {
		for _, k := range l.Keys() {
			if !slices.Contains(keys, k) {
				keys = append(keys, k)
			}
		}
	}
	return c.Reset(ctx, keys)
}
