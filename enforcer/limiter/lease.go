package limiter

import (
	"context"
	_ "embed" // lease.lua
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/rules"
)

// Leases: a node may take part of a limit's remaining quota in one script
// call and then admit requests against it without asking Redis. The units
// are consumed in Redis when granted, so a lease never lets the fleet admit
// more than the limit; the node gives back what it did not use (Return).
// The policy (when to lease, how much, for how long) is the caller's; see
// package engine. Redis.Lease and Redis.Return are the mechanism.

//go:embed lease.lua
var leaseLua string

var leaseScript = redis.NewScript(assemble(leaseLua))

// ErrNoLease reports a Request whose algorithm cannot be leased:
// sliding_window_log (its state is one entry per admitted request and its
// window slides continuously, so units taken now would not count where they
// are spent) and a shaping leaky_bucket (each request needs its own delay).
var ErrNoLease = errors.New("limiter: this limit cannot be leased")

// Leasable reports whether Lease accepts req's algorithm and settings.
func Leasable(req Request) bool {
	switch req.Algorithm {
	case "", rules.TokenBucket, rules.FixedWindow, rules.SlidingWindowCounter:
		return true
	case rules.LeakyBucket:
		return req.MaxDelay == 0
	}
	return false
}

// Grant is a lease Redis granted: Units consumed from the limit up front.
type Grant struct {
	// Units is what was granted; 0 when Redis declined (too little left).
	Units int64
	// Remaining is the limit's remaining after the grant (before it when
	// declined); ResetAfter is the limit's time to a full reset then.
	Remaining  int64
	ResetAfter time.Duration
	// WindowLeft is, for a window algorithm, the time from the grant to the
	// end of the window the units were counted in: a lease must not be
	// spent after it. 0 for a bucket, whose tokens belong to no window.
	WindowLeft time.Duration
	// epoch and stop (µs of Redis TIME) name that window for Return.
	epoch, stop int64
}

// SameWindow reports whether g and o count in the same window (always, for
// a bucket).
func (g Grant) SameWindow(o Grant) bool { return g.epoch == o.epoch && g.stop == o.stop }

// Lease takes a lease for req's limit (its Hits are ignored): at most want
// units and at most floor(remaining / (2·nodes)), and nothing when the
// remaining is below minRemaining. The granted units are consumed at once.
func (r *Redis) Lease(ctx context.Context, req Request, want, nodes, minRemaining int64) (Grant, error) {
	if !Leasable(req) {
		return Grant{}, fmt.Errorf("%w: algorithm %q", ErrNoLease, req.Algorithm)
	}
	s, err := specOf(req)
	if err != nil {
		return Grant{}, err
	}
	if want < 1 || nodes < 1 {
		return Grant{}, fmt.Errorf("%w: lease of %d units for %d nodes", ErrInvalidRequest, want, nodes)
	}
	reply, err := r.runLease(ctx, s, "g", want, nodes, max(minRemaining, 0))
	if err != nil {
		return Grant{}, err
	}
	v, ok := reply.([]any)
	if !ok || len(v) != 6 {
		return Grant{}, fmt.Errorf("%w: lease reply %T", errMalformedReply, reply)
	}
	var n [6]int64
	for i := range n {
		if n[i], ok = v[i].(int64); !ok {
			return Grant{}, fmt.Errorf("%w: lease value %d is %T", errMalformedReply, i, v[i])
		}
	}
	return Grant{
		Units:      min(max(n[0], 0), want),
		Remaining:  min(max(n[1], 0), s.capacity),
		ResetAfter: micros(n[2]),
		WindowLeft: micros(n[4]),
		epoch:      n[3],
		stop:       n[5],
	}, nil
}

// Return gives units of grant g for req's limit back: they count as never
// taken, if the window they were counted in is still current (a bucket
// takes them back unless it has refilled meanwhile). It returns the units
// Redis took back.
func (r *Redis) Return(ctx context.Context, req Request, g Grant, units int64) (int64, error) {
	if units <= 0 {
		return 0, nil
	}
	if !Leasable(req) {
		return 0, fmt.Errorf("%w: algorithm %q", ErrNoLease, req.Algorithm)
	}
	s, err := specOf(req)
	if err != nil {
		return 0, err
	}
	reply, err := r.runLease(ctx, s, "r", units, g.epoch, g.stop)
	if err != nil {
		return 0, err
	}
	n, ok := reply.(int64)
	if !ok {
		return 0, fmt.Errorf("%w: return reply %T", errMalformedReply, reply)
	}
	return n, nil
}

func (r *Redis) runLease(ctx context.Context, s spec, op string, a, b, c int64) (any, error) {
	now := ""
	if r.now != nil {
		now = strconv.FormatInt(r.now(), 10)
	}
	keys := []string{s.key}
	args := []any{now, s.code, s.limit, s.period, s.capacity, s.calendar, op, a, b, c}
	cmd := leaseScript.EvalSha(ctx, r.client, keys, args...)
	if isNoScript(cmd.Err()) {
		cmd = leaseScript.Eval(ctx, r.client, keys, args...)
	}
	reply, err := cmd.Result()
	if err != nil {
		return nil, fmt.Errorf("run lease script: %w", err)
	}
	return reply, nil
}
