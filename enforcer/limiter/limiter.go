// Package limiter is Sluice's limiter engine: it decides whether requests fit
// their rate limits, keeping counters in Redis. It is the only package that
// imports go-redis; everyone else sees Request and Decision.
//
// A Take decides a batch of requests (one per matched limit of an incoming
// request) in one round trip: one Lua script call (EVALSHA, falling back to
// EVAL after a script cache flush) that reads the time from Redis TIME,
// decides every key and writes only if every key allows the request. A
// request rejected by one limit therefore consumes nothing from the others.
//
// Each algorithm is its own embedded .lua file; the files and the driver
// (take.lua) are assembled into a single script so that one call can mix
// algorithms. Only token_bucket (GCRA) is implemented so far.
//
// Redis Cluster: a script call may only touch keys of one hash slot. Key wraps
// a descriptor's domain and entries in a {hash tag}, so all state of one
// descriptor lives on one slot, but the keys of different descriptors usually
// do not share a slot. On a cluster, callers must (for now) pass one Take only
// keys of one slot; a Take spanning slots fails with a CROSSSLOT error.
// Grouping a multi-slot batch is future work.
//
// Requires Redis 5 or newer (effects replication of scripts that call TIME).
package limiter

import (
	"context"
	"errors"
	"fmt"
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
	// Limit is the number of requests (tokens) that Period refills.
	Limit int64
	// Period is the time over which Limit tokens come back; at least 1 µs.
	Period time.Duration
	// Burst is the bucket capacity; 0 means Limit.
	Burst int64
	// Hits is the number of tokens the request takes; 0 peeks at the limit
	// without consuming anything.
	Hits int64
}

// Decision is the verdict for one Request.
type Decision struct {
	// Allowed reports whether this request's own limit admits it. When any
	// request of a Take is not allowed, nothing is consumed from any of them,
	// even from those whose Allowed is true.
	Allowed bool
	// Limit is the bucket capacity (the request's Burst).
	Limit int64
	// Remaining is the number of tokens left: after this request if the whole
	// Take was allowed, else in the untouched bucket.
	Remaining int64
	// ResetAfter is the time until the bucket is full again.
	ResetAfter time.Duration
	// RetryAfter is 0 when allowed; otherwise the time until a request of the
	// same Hits would be allowed, or, when Hits exceeds the capacity and never
	// can be, the time a drained bucket takes to fill (Period × Burst / Limit).
	RetryAfter time.Duration
}

// ErrInvalidRequest reports a Request whose numbers cannot describe a limit.
var ErrInvalidRequest = errors.New("invalid limiter request")

// ErrUnsupportedAlgorithm reports a Request whose algorithm this engine does
// not implement.
var ErrUnsupportedAlgorithm = errors.New("unsupported limiter algorithm")

// Redis is the limiter engine backed by Redis (standalone, Sentinel or
// Cluster). It is safe for concurrent use.
type Redis struct {
	client redis.UniversalClient
}

// NewRedis returns an engine that keeps its counters through client. The
// client should be built by NewClient (short timeouts, no retries); Redis
// does not close it.
func NewRedis(client redis.UniversalClient) *Redis {
	return &Redis{client: client}
}

// Take decides reqs in one round trip and returns one Decision per request,
// in order. It is all-or-nothing: if any request is not allowed, nothing is
// consumed from any of them. An error (invalid request, Redis unreachable or
// slow) means no decision was made; the caller's failure mode decides.
func (r *Redis) Take(ctx context.Context, reqs []Request) ([]Decision, error) {
	if len(reqs) == 0 {
		return []Decision{}, nil
	}
	keys := make([]string, len(reqs))
	args := make([]any, 0, argsPerKey*len(reqs))
	for i, req := range reqs {
		alg, err := check(req)
		if err != nil {
			return nil, fmt.Errorf("request %d: %w", i, err)
		}
		keys[i] = req.Key + stateSuffix[alg]
		args = append(args, string(alg), req.Limit, req.Period.Microseconds(), burst(req), req.Hits)
	}
	reply, err := takeScript.Run(ctx, r.client, keys, args...).Result()
	if err != nil {
		return nil, fmt.Errorf("run limiter script: %w", err)
	}
	ds, err := decode(reply, reqs)
	if err != nil {
		return nil, fmt.Errorf("decode limiter script reply: %w", err)
	}
	return ds, nil
}

// Ping checks that client reaches Redis; /readyz uses it.
func Ping(ctx context.Context, client redis.UniversalClient) error {
	if err := client.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("ping redis: %w", err)
	}
	return nil
}

// check validates req and returns its effective algorithm.
func check(req Request) (rules.Algorithm, error) {
	alg := req.Algorithm
	if alg == "" {
		alg = rules.TokenBucket
	}
	if _, ok := algorithms[alg]; !ok {
		return "", fmt.Errorf("%w: %q", ErrUnsupportedAlgorithm, alg)
	}
	switch {
	case req.Key == "":
		return "", fmt.Errorf("%w: empty key", ErrInvalidRequest)
	case req.Limit <= 0:
		return "", fmt.Errorf("%w: limit %d is not positive", ErrInvalidRequest, req.Limit)
	case req.Period < time.Microsecond:
		return "", fmt.Errorf("%w: period %v is shorter than 1µs", ErrInvalidRequest, req.Period)
	case req.Burst < 0:
		return "", fmt.Errorf("%w: burst %d is negative", ErrInvalidRequest, req.Burst)
	case req.Hits < 0:
		return "", fmt.Errorf("%w: hits %d is negative", ErrInvalidRequest, req.Hits)
	}
	return alg, nil
}

// burst returns req's bucket capacity: Burst, defaulting to Limit.
func burst(req Request) int64 {
	if req.Burst == 0 {
		return req.Limit
	}
	return req.Burst
}
