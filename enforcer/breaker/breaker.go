// Package breaker is the circuit breaker the enforcer puts around its
// counter store, so that an outage costs checks no latency.
//
// A Breaker starts closed: every call goes through. After Failures
// consecutive failed calls, with no call succeeding for Quiet, it opens:
// calls are refused at once (ErrOpen) and the caller answers from its
// failure mode without waiting on the store. The Quiet condition tells an
// outage from overload: on a busy node a stall (CPU starvation, a GC pause)
// can make every call in flight time out together, which looks like many
// consecutive failures, but calls keep succeeding around it; during an
// outage nothing succeeds. Failures that prove an outage by themselves
// (Config.Hard: a refused connection) skip the Quiet condition.
// After Cooldown it turns half-open: the next call is let through as a probe
// while every other call is still refused; the probe's success closes the
// breaker, its failure opens it for another Cooldown. So while the store is
// down, one call per Cooldown pays the store's timeout, and the breaker closes
// at most one Cooldown (plus one probe) after the store is back.
//
// The breaker is allocation-free on the hot path: Allow and Record use
// atomics except on state changes.
package breaker

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of New for zero Config fields.
const (
	DefaultFailures = 5
	DefaultQuiet    = 100 * time.Millisecond
	DefaultCooldown = 200 * time.Millisecond
)

// ErrOpen is returned by Allow while the breaker refuses calls.
var ErrOpen = errors.New("circuit breaker open: counter store unavailable")

// State is a breaker's state.
type State int32

// States. The numbers are what the sluice_enforcer_breaker_state metric
// reports.
const (
	Closed   State = 0
	Open     State = 1
	HalfOpen State = 2
)

// String returns "closed", "open" or "half_open".
func (s State) String() string {
	switch s {
	case Closed:
		return "closed"
	case Open:
		return "open"
	case HalfOpen:
		return "half_open"
	}
	return "unknown"
}

// Config configures a Breaker.
type Config struct {
	// Failures is the number of consecutive failed calls that open the
	// breaker (DefaultFailures when zero).
	Failures int
	// Quiet is how long no call may have succeeded before failures open
	// the breaker (DefaultQuiet when zero; negative: no such condition).
	Quiet time.Duration
	// Hard, when set, reports failures that prove the store is down (a
	// refused or reset connection, as opposed to a timeout): Failures
	// consecutive failures ending in one open the breaker without waiting
	// for Quiet.
	Hard func(error) bool
	// Cooldown is how long the breaker stays open before it lets a probe
	// through (DefaultCooldown when zero).
	Cooldown time.Duration
	// Now is the clock; time.Now when nil. Tests inject one.
	Now func() time.Time
	// OnChange, if set, is called (outside the breaker's lock, on the
	// caller's goroutine) after each state change.
	OnChange func(from, to State)
}

// Breaker is a circuit breaker. It is safe for concurrent use.
type Breaker struct {
	failures int64
	quiet    time.Duration
	hard     func(error) bool
	cooldown time.Duration
	now      func() time.Time
	onChange func(from, to State)

	state       atomic.Int32
	consecutive atomic.Int64
	trips       atomic.Int64
	lastOK      atomic.Int64 // unix ns of the last success; 0: none yet

	mu       sync.Mutex
	openedAt time.Time // when it last opened; guarded by mu
	probing  bool      // a half-open probe is in flight; guarded by mu
}

// New returns a closed Breaker.
func New(cfg Config) *Breaker {
	b := &Breaker{
		failures: int64(cfg.Failures),
		quiet:    cfg.Quiet,
		hard:     cfg.Hard,
		cooldown: cfg.Cooldown,
		now:      cfg.Now,
		onChange: cfg.OnChange,
	}
	if b.failures <= 0 {
		b.failures = DefaultFailures
	}
	if b.quiet == 0 {
		b.quiet = DefaultQuiet
	}
	if b.cooldown <= 0 {
		b.cooldown = DefaultCooldown
	}
	if b.now == nil {
		b.now = time.Now
	}
	return b
}

// State returns the current state. An open breaker whose cooldown is over
// still reports Open until a call arrives to probe.
func (b *Breaker) State() State { return State(b.state.Load()) }

// Trips returns how many times the breaker has opened since New.
func (b *Breaker) Trips() int64 { return b.trips.Load() }

// Allow asks to make one call. It returns nil when the call may go ahead,
// and the caller must then report its outcome with Record; it returns
// ErrOpen when the call must not be made (and then nothing is recorded).
func (b *Breaker) Allow() error {
	if State(b.state.Load()) == Closed {
		return nil
	}
	b.mu.Lock()
	switch State(b.state.Load()) {
	case Closed:
		b.mu.Unlock()
		return nil
	case Open:
		if b.now().Sub(b.openedAt) < b.cooldown {
			b.mu.Unlock()
			return ErrOpen
		}
		b.probing = true
		b.state.Store(int32(HalfOpen))
		b.mu.Unlock()
		b.changed(Open, HalfOpen)
		return nil
	default: // HalfOpen
		if b.probing {
			b.mu.Unlock()
			return ErrOpen
		}
		b.probing = true
		b.mu.Unlock()
		return nil
	}
}

// Record reports the outcome of a call that Allow let through: err nil for
// success. Only failures of the store itself should be recorded as errors;
// a request the store refused as invalid, or a call the caller gave up on,
// is a success as far as the store's health goes.
func (b *Breaker) Record(err error) {
	if err == nil {
		if b.quiet > 0 {
			b.lastOK.Store(b.now().UnixNano())
		}
		if State(b.state.Load()) == Closed {
			if b.consecutive.Load() != 0 {
				b.consecutive.Store(0)
			}
			return
		}
		b.mu.Lock()
		from := State(b.state.Load())
		b.probing = false
		b.consecutive.Store(0)
		b.state.Store(int32(Closed))
		b.mu.Unlock()
		if from != Closed {
			b.changed(from, Closed)
		}
		return
	}

	switch State(b.state.Load()) {
	case Closed:
		if b.consecutive.Add(1) < b.failures {
			return
		}
		if b.quiet > 0 && (b.hard == nil || !b.hard(err)) {
			if last := b.lastOK.Load(); last != 0 && b.now().UnixNano()-last < int64(b.quiet) {
				return // calls still succeed: overload, not an outage
			}
		}
		b.mu.Lock()
		if State(b.state.Load()) != Closed {
			b.mu.Unlock()
			return
		}
		b.open()
		b.mu.Unlock()
		b.changed(Closed, Open)
	case HalfOpen:
		b.mu.Lock()
		if State(b.state.Load()) != HalfOpen {
			b.mu.Unlock()
			return
		}
		b.open()
		b.mu.Unlock()
		b.changed(HalfOpen, Open)
	default:
		// A call let through before the breaker opened failed late;
		// the breaker is already open.
	}
}

// Release ends a call that Allow let through without a verdict on the
// store's health: nothing is counted, neither success nor failure. The
// enforcer's engine releases the failed calls of heavy requests (far more
// limits than a typical check), whose cost, not the store, may explain the
// failure, so one caller's heavy requests cannot open the breaker for
// everyone. If the call was the half-open probe, the next call probes.
func (b *Breaker) Release() {
	if State(b.state.Load()) != HalfOpen {
		return
	}
	b.mu.Lock()
	b.probing = false
	b.mu.Unlock()
}

// open moves to Open. Caller holds mu.
func (b *Breaker) open() {
	b.openedAt = b.now()
	b.probing = false
	b.consecutive.Store(0)
	b.state.Store(int32(Open))
	b.trips.Add(1)
}

func (b *Breaker) changed(from, to State) {
	if b.onChange != nil {
		b.onChange(from, to)
	}
}
