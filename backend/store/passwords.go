package store

import (
	"context"
	"errors"
	"runtime"
	"time"
)

// ErrPasswordsBusy is a password check (or hash) refused because as many
// are running as the console allows and the queue behind them is full, or
// the wait for a turn ran out: the caller should try again shortly.
var ErrPasswordsBusy = errors.New("too many password checks at once")

// Each running password check may have this many waiting behind it, for
// at most passwordWait.
const (
	passwordQueuePerSlot = 8
	passwordWait         = 2 * time.Second
)

// DefaultPasswordChecks is how many bcrypt computations a console runs at
// once by default: half its CPUs (GOMAXPROCS), at least one. A bcrypt
// check costs tens of milliseconds of one CPU, so a sign-in flood spread
// over many addresses (which the per-address throttle lets through) would
// otherwise take every CPU from every other request.
func DefaultPasswordChecks() int { return max(1, runtime.GOMAXPROCS(0)/2) }

// passwordGate bounds the concurrent bcrypt work of a Store: n at once, a
// bounded queue behind them, a bounded wait in it.
type passwordGate struct {
	slots chan struct{}
	queue chan struct{}
	wait  time.Duration
}

func newPasswordGate(n int) *passwordGate {
	if n <= 0 {
		n = DefaultPasswordChecks()
	}
	return &passwordGate{slots: make(chan struct{}, n), queue: make(chan struct{}, passwordQueuePerSlot*n), wait: passwordWait}
}

// run runs fn once a slot is free, or returns ErrPasswordsBusy (the queue
// full, or no slot within the wait) or ctx's error without running it.
func (g *passwordGate) run(ctx context.Context, fn func()) error {
	select {
	case g.slots <- struct{}{}:
	default:
		select {
		case g.queue <- struct{}{}:
		default:
			return ErrPasswordsBusy
		}
		t := time.NewTimer(g.wait)
		defer t.Stop()
		select {
		case g.slots <- struct{}{}:
			<-g.queue
		case <-t.C:
			<-g.queue
			return ErrPasswordsBusy
		case <-ctx.Done():
			<-g.queue
			return ctx.Err()
		}
	}
	defer func() { <-g.slots }()
	fn()
	return nil
}

// SetPasswordChecks sets how many password checks and hashes (bcrypt) the
// store runs at once; n <= 0 means DefaultPasswordChecks. Call it before
// serving.
func (s *Store) SetPasswordChecks(n int) { s.passwords = newPasswordGate(n) }
