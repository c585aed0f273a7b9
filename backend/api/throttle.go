package api

import (
	"context"
	"time"

	"github.com/sluicehq/sluice/enforcer/limiter"
)

// Throttle decides a batch of limiter requests all or nothing, in process:
// the console uses it to slow down password guessing. limiter.Local, the
// enforcer's in-process limiter, satisfies it.
type Throttle interface {
	Take(ctx context.Context, reqs []limiter.Request) ([]limiter.Decision, error)
}

// maxThrottleKeys bounds the memory of the sign-in throttle, so a flood of
// distinct usernames cannot exhaust it.
const maxThrottleKeys = 100_000

// newThrottle is the console's sign-in throttle: Sluice's own in-process
// limiter. now replaces the wall clock in tests; nil in production.
func newThrottle(now func() time.Time) Throttle {
	return limiter.NewLocal(limiter.LocalOptions{MaxKeys: maxThrottleKeys, Now: now})
}
