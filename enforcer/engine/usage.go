package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/sluicehq/sluice/enforcer/limiter"
	"github.com/sluicehq/sluice/rules"
)

// Usage reports: the enforcer's Rate Limit Quota Service (package rlqs)
// serves clients that admit requests themselves, against the share of a
// limit they were assigned, and report what they admitted and denied per
// bucket. A bucket is a set of key/value pairs (an Envoy bucket id); Bucket
// orders them as the domain's descriptor tree nests their keys
// (rules.Set.MatchUnordered) and matches the limit an RLS descriptor of
// those entries in that order gets, keyed on the same counter. Report adds
// the allowed hits to that counter (limiter.Redis.Count), so checks and
// reports share one limit, and to the per-rule stats (allowed, and denied
// as limited) and quota usage the console receives.
//
// Bounds. One report of a bucket counts at most the limit's capacity plus
// what it refills over the report's elapsed time (at most one period):
// more than that limit could have admitted in that time comes only from a
// broken or hostile client, and counting it would block the limit for as
// long as the excess takes to refill. A token or leaky bucket is charged as
// of the elapsed time before now (limiter.Redis.Count), the windows in the
// current window. A sharded limit's hits are spread evenly over its shards.

// Recorder is what Report needs from the counter store: limiter.Redis and
// limiter.Batcher satisfy it.
type Recorder interface {
	Count(ctx context.Context, us []limiter.Usage) ([]limiter.State, error)
}

// ErrNoRecorder is returned by Report when the engine's store cannot count
// usage (it is not a Recorder).
var ErrNoRecorder = errors.New("the counter store cannot count usage reports")

// Bucket is a set of entries resolved in the applied ruleset.
type Bucket struct {
	Domain string
	// Entries are in the order the domain's tree nests them (key order when
	// no limit matched).
	Entries []rules.Entry
	// Limit is the limit that applies; nil when none does.
	Limit *rules.Limit
	// Version is the ruleset version the bucket was resolved in.
	Version int64

	reqs []limiter.Request // one per shard, Hits 0; nil without a counter
	key  string            // the counter's key before sharding
}

// Counted reports whether the bucket's limit has a counter: a matched limit
// that is neither unlimited nor of 0 requests_per_unit.
func (b Bucket) Counted() bool { return len(b.reqs) > 0 }

// Key is the key of the bucket's counter (before sharding); "" when it has
// none. Buckets with one Key share one limit.
func (b Bucket) Key() string { return b.key }

// Capacity is what the bucket's limit holds: a bucket's burst, a window's
// requests_per_unit; 0 without a counter.
func (b Bucket) Capacity() int64 {
	if b.Limit == nil || !b.Counted() {
		return 0
	}
	if bucket(b.Limit.Algorithm) {
		return int64(b.Limit.Burst)
	}
	return int64(b.Limit.RequestsPerUnit)
}

// Bucket resolves the entries (distinct keys, in any order) in domain. The
// request bounds of Check apply (at most MaxEntries entries, MaxKeyBytes per
// key and domain, MaxValueBytes per value); an empty domain, no entries, an
// empty key or value, or two entries of one key are invalid too: errors
// wrapping ErrInvalidRequest. ErrNoRuleset before the first Apply.
func (e *Engine) Bucket(domain string, entries []rules.Entry) (Bucket, error) {
	rs := e.current.Load()
	if rs == nil {
		return Bucket{}, ErrNoRuleset
	}
	req := Request{Domain: domain, Descriptors: []Descriptor{{Entries: entries}}}
	if err := checkRequest(&req); err != nil {
		return Bucket{}, err
	}
	if len(entries) == 0 {
		return Bucket{}, fmt.Errorf("%w: no entries", ErrInvalidRequest)
	}
	seen := make(map[string]bool, len(entries))
	for _, en := range entries {
		switch {
		case en.Key == "" || en.Value == "":
			return Bucket{}, fmt.Errorf("%w: empty key or value", ErrInvalidRequest)
		case seen[en.Key]:
			return Bucket{}, fmt.Errorf("%w: key %q given twice", ErrInvalidRequest, en.Key)
		}
		seen[en.Key] = true
	}
	ordered, l := rs.set.MatchUnordered(domain, entries)
	b := Bucket{Domain: domain, Entries: ordered, Limit: l, Version: rs.version}
	if l == nil || l.Unlimited || l.BlocksAll() {
		return b, nil
	}
	r := e.counterRequest(domain, l.CounterEntries(ordered, nil), l, 0)
	b.key = r.Key
	if n := int64(l.Shards); n > 1 {
		for shard := range uint64(n) {
			b.reqs = append(b.reqs, shardRequest(r, n, shard))
		}
	} else {
		b.reqs = []limiter.Request{r}
	}
	return b, nil
}

// Usage is one bucket's usage in a client's report: requests it allowed
// and denied over Elapsed.
type Usage struct {
	Bucket          Bucket
	Allowed, Denied uint64
	Elapsed         time.Duration
}

// Report counts a client's usage of buckets: the allowed hits into each
// bucket's counter (bounded, see above) and into the stats and quota
// usage, the denied ones into the stats as limited. It returns each
// counter's state after (Limit its capacity; summed over shards), in
// order. Allowed and Denied of 0 only read the counter. A bucket without a
// counter counts nothing and gets a zero State. The counters are counted in
// one store call (one pipeline), through the breaker with the per-call
// deadline as a check's Take is; on its error nothing is counted.
func (e *Engine) Report(ctx context.Context, usage []Usage) ([]limiter.State, error) {
	out := make([]limiter.State, len(usage))
	var (
		us  []limiter.Usage
		idx []int // usage index of each of us
	)
	for i, u := range usage {
		b := u.Bucket
		if !b.Counted() {
			continue
		}
		l := b.Limit
		elapsed := min(max(u.Elapsed, 0), l.Period)
		refill := int64(math.Ceil(float64(l.RequestsPerUnit) * float64(elapsed) / float64(l.Period)))
		hits := min(clampHits(u.Allowed), b.Capacity()+refill)
		n := int64(len(b.reqs))
		for j, r := range b.reqs {
			r.Hits = hits / n
			if int64(j) < hits%n {
				r.Hits++
			}
			us = append(us, limiter.Usage{Request: r, Elapsed: elapsed})
			idx = append(idx, i)
		}
	}
	if len(us) == 0 {
		return out, nil
	}
	rec, ok := e.store.(Recorder)
	if !ok {
		return nil, ErrNoRecorder
	}
	if e.breaker != nil {
		if err := e.breaker.Allow(); err != nil {
			return nil, err
		}
	}
	tctx, cancel := ctx, context.CancelFunc(nil)
	if e.storeTimeout > 0 {
		tctx, cancel = context.WithTimeout(ctx, e.storeTimeout)
	}
	states, err := rec.Count(tctx, us)
	if cancel != nil {
		cancel()
	}
	if e.breaker != nil {
		if herr := storeHealth(ctx, err); herr != nil && len(us) > HeavyLimits {
			e.breaker.Release() // as for a heavy Take
		} else {
			e.breaker.Record(herr)
		}
	}
	if err == nil && len(states) != len(us) {
		err = fmt.Errorf("store answered %d states for %d usages", len(states), len(us))
	}
	if err != nil {
		return nil, err
	}
	for j, s := range states {
		st := &out[idx[j]]
		st.Remaining += s.Remaining
		st.ResetAfter = max(st.ResetAfter, s.ResetAfter)
		if s.At.After(st.At) {
			st.At = s.At
		}
	}
	for i, u := range usage {
		b := u.Bucket
		if !b.Counted() {
			continue
		}
		out[i].Limit = b.Capacity()
		out[i].Remaining = min(out[i].Remaining, out[i].Limit)
		if e.noStats || (u.Allowed == 0 && u.Denied == 0) {
			continue
		}
		e.stats.report(b.Domain, b.Limit, b.Entries, clampHits(u.Allowed), clampHits(u.Denied))
		if isQuota(b.Limit) && u.Allowed > 0 {
			e.quota.count(&Request{Domain: b.Domain, Hits: u.Allowed, Descriptors: []Descriptor{{Entries: b.Entries}}},
				&Result{Code: OK, Statuses: []Status{{Code: OK, Limit: b.Limit, ResetAfter: out[i].ResetAfter}}})
		}
	}
	return out, nil
}
