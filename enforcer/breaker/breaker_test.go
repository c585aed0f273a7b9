package breaker_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/enforcer/breaker"
)

var errDown = errors.New("connection refused")

// clock is a manual clock for the breaker's timing.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newBreaker(t *testing.T) (*breaker.Breaker, *clock, *[]string) {
	t.Helper()
	c := &clock{t: time.Unix(1000, 0)}
	var changes []string
	b := breaker.New(breaker.Config{
		Failures: 3,
		Quiet:    100 * time.Millisecond,
		Cooldown: time.Second,
		Now:      c.now,
		OnChange: func(from, to breaker.State) { changes = append(changes, from.String()+">"+to.String()) },
	})
	return b, c, &changes
}

// call makes one call through b that fails with err (nil: succeeds) and
// returns what Allow said.
func call(b *breaker.Breaker, err error) error {
	if aerr := b.Allow(); aerr != nil {
		return aerr
	}
	b.Record(err)
	return nil
}

func TestTripsAfterConsecutiveFailures(t *testing.T) {
	b, c, changes := newBreaker(t)
	c.advance(time.Second)
	// Failures interrupted by a success never trip it.
	for _, err := range []error{errDown, errDown, nil, errDown, errDown} {
		if got := call(b, err); got != nil {
			t.Fatalf("closed breaker refused a call: %v", got)
		}
	}
	if b.State() != breaker.Closed {
		t.Fatalf("state %v after 2 consecutive failures, want closed", b.State())
	}
	// The success above was just now: a 3rd failure is overload, not an
	// outage, until Quiet has passed without a success.
	if got := call(b, errDown); got != nil {
		t.Fatalf("3rd failure refused: %v", got)
	}
	if b.State() != breaker.Closed {
		t.Fatalf("state %v with a success %v ago, want closed", b.State(), time.Duration(0))
	}
	c.advance(99 * time.Millisecond)
	call(b, errDown)
	if b.State() != breaker.Closed {
		t.Fatalf("state %v 99ms after a success, want closed", b.State())
	}
	c.advance(time.Millisecond)
	if got := call(b, errDown); got != nil {
		t.Fatalf("3rd failure refused: %v", got)
	}
	if b.State() != breaker.Open {
		t.Fatalf("state %v after consecutive failures and 100ms without a success, want open", b.State())
	}
	if got := call(b, nil); !errors.Is(got, breaker.ErrOpen) {
		t.Errorf("open breaker: Allow = %v, want ErrOpen", got)
	}
	if b.Trips() != 1 {
		t.Errorf("trips %d, want 1", b.Trips())
	}
	if got, want := *changes, []string{"closed>open"}; len(got) != 1 || got[0] != want[0] {
		t.Errorf("changes %v, want %v", got, want)
	}
}

func TestHalfOpenProbe(t *testing.T) {
	tests := []struct {
		name      string
		probeErr  error
		wantState breaker.State
		changes   []string
	}{
		{"probe succeeds: closes", nil, breaker.Closed, []string{"closed>open", "open>half_open", "half_open>closed"}},
		{"probe fails: reopens", errDown, breaker.Open, []string{"closed>open", "open>half_open", "half_open>open"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, c, changes := newBreaker(t)
			for range 3 {
				call(b, errDown)
			}
			c.advance(999 * time.Millisecond)
			if err := b.Allow(); !errors.Is(err, breaker.ErrOpen) {
				t.Fatalf("before the cooldown: Allow = %v, want ErrOpen", err)
			}
			c.advance(time.Millisecond)
			if err := b.Allow(); err != nil {
				t.Fatalf("after the cooldown: Allow = %v, want the probe let through", err)
			}
			if b.State() != breaker.HalfOpen {
				t.Fatalf("state %v while probing, want half_open", b.State())
			}
			// Only one probe at a time.
			if err := b.Allow(); !errors.Is(err, breaker.ErrOpen) {
				t.Fatalf("second call while probing: Allow = %v, want ErrOpen", err)
			}
			b.Record(tt.probeErr)
			if b.State() != tt.wantState {
				t.Fatalf("state %v after the probe, want %v", b.State(), tt.wantState)
			}
			if len(*changes) != len(tt.changes) {
				t.Fatalf("changes %v, want %v", *changes, tt.changes)
			}
			for i := range tt.changes {
				if (*changes)[i] != tt.changes[i] {
					t.Errorf("changes %v, want %v", *changes, tt.changes)
				}
			}
			if tt.wantState == breaker.Open {
				// A failed probe starts a whole new cooldown.
				c.advance(999 * time.Millisecond)
				if err := b.Allow(); !errors.Is(err, breaker.ErrOpen) {
					t.Errorf("within the new cooldown: Allow = %v, want ErrOpen", err)
				}
				c.advance(time.Millisecond)
				if err := b.Allow(); err != nil {
					t.Errorf("after the new cooldown: Allow = %v, want a probe", err)
				}
			} else if err := call(b, nil); err != nil {
				t.Errorf("closed again: %v", err)
			}
		})
	}
}

func TestLateResultsWhileOpen(t *testing.T) {
	b, _, _ := newBreaker(t) // no success yet: failures alone open it
	// Four calls are let through while closed; three fail and open it.
	for range 4 {
		if err := b.Allow(); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		b.Record(errDown)
	}
	if b.State() != breaker.Open {
		t.Fatalf("state %v, want open", b.State())
	}
	// The fourth fails late: still open, not tripped twice.
	b.Record(errDown)
	if b.State() != breaker.Open || b.Trips() != 1 {
		t.Errorf("state %v trips %d after a late failure, want open, 1", b.State(), b.Trips())
	}
	// A late success shows the store answers again: closed.
	b.Record(nil)
	if b.State() != breaker.Closed {
		t.Errorf("state %v after a late success, want closed", b.State())
	}
}

func TestConcurrentUse(t *testing.T) {
	b := breaker.New(breaker.Config{Failures: 5, Cooldown: time.Millisecond})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				var err error
				if (i+g)%3 == 0 {
					err = errDown
				}
				call(b, err)
			}
		}()
	}
	wg.Wait()
	if s := b.State(); s != breaker.Closed && s != breaker.Open && s != breaker.HalfOpen {
		t.Errorf("state %v", s)
	}
}

func TestHardFailuresSkipQuiet(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	errRefused := errors.New("connection refused")
	b := breaker.New(breaker.Config{
		Failures: 3,
		Quiet:    100 * time.Millisecond,
		Now:      c.now,
		Hard:     func(err error) bool { return errors.Is(err, errRefused) },
	})
	call(b, nil)
	for _, err := range []error{errDown, errDown, errDown} {
		call(b, err)
	}
	if b.State() != breaker.Closed {
		t.Fatalf("state %v after timeouts right after a success, want closed", b.State())
	}
	call(b, errRefused)
	if b.State() != breaker.Open {
		t.Fatalf("state %v after a refused connection ended the run of failures, want open", b.State())
	}
}

func TestReleaseCountsNothing(t *testing.T) {
	b, c, _ := newBreaker(t)
	c.advance(time.Second)
	// Released calls neither fail nor break a run of failures.
	for range 10 {
		if err := b.Allow(); err != nil {
			t.Fatal(err)
		}
		b.Release()
	}
	if b.State() != breaker.Closed {
		t.Fatalf("state %v after released calls, want closed", b.State())
	}
	for range 3 {
		call(b, errDown)
		if err := b.Allow(); err == nil {
			b.Release()
		}
	}
	if b.State() != breaker.Open {
		t.Fatalf("state %v after 3 failures among released calls, want open", b.State())
	}
	// A released probe frees the probe slot: the next call probes.
	c.advance(time.Second)
	if err := b.Allow(); err != nil {
		t.Fatalf("after the cooldown: Allow = %v, want a probe", err)
	}
	b.Release()
	if b.State() != breaker.HalfOpen {
		t.Fatalf("state %v after a released probe, want half_open", b.State())
	}
	if err := call(b, nil); err != nil {
		t.Fatalf("second probe: Allow = %v, want it let through", err)
	}
	if b.State() != breaker.Closed {
		t.Errorf("state %v after a successful probe, want closed", b.State())
	}
}
