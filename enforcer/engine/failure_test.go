package engine_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/sluicehq/sluice/enforcer/breaker"
	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/enforcer/limiter"
	"github.com/sluicehq/sluice/internal/testenv"
)

// deadEngine returns an engine whose Redis refuses connections, with opts.
func deadEngine(t *testing.T, opts ...engine.Option) *engine.Engine {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	client, err := limiter.NewClient("redis://" + addr + "/0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	eng := engine.New(limiter.NewRedis(client), "sluicetest:dead:", opts...)
	if err := eng.Apply(1, compile(t, apiYAML)); err != nil {
		t.Fatal(err)
	}
	return eng
}

func TestCheckFailLocal(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		nodes       int
		wantAllowed int
	}{
		{"one node gets the whole limit", 1, 5},
		{"two nodes get half each, rounded up", 2, 3},
		{"more nodes than the limit get 1 each", 9, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			eng := deadEngine(t)
			eng.SetNodeCount(tt.nodes)
			allowed := 0
			for i := range 8 {
				res := check(t, eng, req(entry("local", "x")))
				s := res.Statuses[0]
				if res.StoreErr == nil || !s.StoreFailed || !s.Local {
					t.Fatalf("request %d: %+v, want a local decision after a store error", i+1, s)
				}
				if res.Code == engine.OK {
					allowed++
					if s.Remaining != int64(tt.wantAllowed-allowed) {
						t.Errorf("request %d: remaining %d, want %d", i+1, s.Remaining, tt.wantAllowed-allowed)
					}
				} else if s.RetryAfter <= 0 {
					t.Errorf("request %d: rejected with retry-after %v", i+1, s.RetryAfter)
				}
			}
			if allowed != tt.wantAllowed {
				t.Errorf("allowed %d of 8 (5/min over %d nodes), want %d", allowed, tt.nodes, tt.wantAllowed)
			}
		})
	}
}

func TestCheckFailLocalNextToClosed(t *testing.T) {
	t.Parallel()
	eng := deadEngine(t)
	// A closed limit rejects: the local limit must not be charged.
	for range 3 {
		if res := check(t, eng, req(entry("local", "y"), entry("closed", "y"))); res.Code != engine.OverLimit {
			t.Fatalf("local+closed with store down: %v, want over_limit", res.Code)
		}
	}
	if res := check(t, eng, req(entry("local", "y"))); res.Statuses[0].Remaining != 4 {
		t.Errorf("local remaining %d after rejected requests, want 4 (untouched)", res.Statuses[0].Remaining)
	}
}

func TestCheckBreakerCutsOffTheStore(t *testing.T) {
	t.Parallel()
	b := breaker.New(breaker.Config{Failures: 3, Cooldown: time.Hour})
	eng := deadEngine(t, engine.WithBreaker(b))
	for i := range 3 {
		res := check(t, eng, req(entry("closed", "x")))
		if errors.Is(res.StoreErr, breaker.ErrOpen) {
			t.Fatalf("request %d was cut off before %d failures", i+1, 3)
		}
	}
	if b.State() != breaker.Open {
		t.Fatalf("breaker %v after 3 store failures, want open", b.State())
	}
	res := check(t, eng, req(entry("closed", "x"), entry("open", "x")))
	if !errors.Is(res.StoreErr, breaker.ErrOpen) {
		t.Errorf("StoreErr %v with the breaker open, want ErrOpen", res.StoreErr)
	}
	if res.Code != engine.OverLimit || res.Statuses[1].Code != engine.OK {
		t.Errorf("failure modes with the breaker open: %v (%v, %v), want closed → over_limit, open → ok", res.Code, res.Statuses[0].Code, res.Statuses[1].Code)
	}
}

func TestCheckInvalidStoreRequestsDoNotTripTheBreaker(t *testing.T) {
	t.Parallel()
	b := breaker.New(breaker.Config{Failures: 1, Cooldown: time.Hour})
	client, err := limiter.NewClient(testenv.RedisURL(t), limiter.WithTimeout(2*time.Second), limiter.WithDialTimeout(2*time.Second)) // a loaded machine must not fail open
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	eng := engine.New(limiter.NewRedis(client), testenv.KeyPrefix(t), engine.WithBreaker(b))
	if err := eng.Apply(1, compile(t, `domain: api
descriptors:
  - key: u
    rate_limit: {unit: minute, requests_per_unit: 5}
`)); err != nil {
		t.Fatal(err)
	}
	// A caller that gave up is not the store's fault.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	eng.Check(ctx, req(entry("u", "x")))
	if b.State() != breaker.Closed {
		t.Errorf("breaker %v after a cancelled check, want closed", b.State())
	}
}

func TestCheckShards(t *testing.T) {
	t.Parallel()
	const limit, shards = 10, 4
	client, err := limiter.NewClient(testenv.RedisURL(t), limiter.WithTimeout(2*time.Second), limiter.WithDialTimeout(2*time.Second)) // a loaded machine must not fail open
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	eng := engine.New(limiter.NewRedis(client), testenv.KeyPrefix(t))
	if err := eng.Apply(1, compile(t, `domain: api
descriptors:
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 10, name: hot}
    shards: 4
`)); err != nil {
		t.Fatal(err)
	}
	allowed := 0
	for range 30 {
		res := check(t, eng, req(entry("tenant", "big")))
		if res.Code == engine.OK {
			allowed++
		}
		if s := res.Statuses[0]; s.Remaining > limit {
			t.Errorf("remaining %d above the limit %d", s.Remaining, limit)
		}
	}
	// Documented bound: at least the limit with even load, fewer than
	// limit + shards in all.
	if allowed < limit || allowed >= limit+shards {
		t.Errorf("allowed %d of 30 on %d shards of a %d limit, want [%d, %d)", allowed, shards, limit, limit, limit+shards)
	}
}

func TestCheckShaping(t *testing.T) {
	// Not parallel: it measures the shaping delays it asserts.
	client, err := limiter.NewClient(testenv.RedisURL(t), limiter.WithTimeout(2*time.Second), limiter.WithDialTimeout(2*time.Second)) // a loaded machine must not fail open
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	eng := engine.New(limiter.NewRedis(client), testenv.KeyPrefix(t))
	// 2 per second: one token every 500 ms; 2 s of queue is 4 requests.
	if err := eng.Apply(1, compile(t, `domain: api
descriptors:
  - key: q
    rate_limit: {unit: second, requests_per_unit: 2, name: shaped}
    on_limit: {action: delay, max_delay: 2s}
`)); err != nil {
		t.Fatal(err)
	}
	shaped := func() engine.Result {
		r := req(entry("q", "x"))
		r.Shape = true
		return check(t, eng, r)
	}
	// Without Shape a delay limit rejects like any other.
	plain := func() engine.Result { return check(t, eng, req(entry("q", "y"))) }
	for i, want := range []engine.Code{engine.OK, engine.OK, engine.OverLimit} {
		if got := plain().Code; got != want {
			t.Errorf("unshaped request %d: %v, want %v", i+1, got, want)
		}
	}

	for i := range 2 {
		if res := shaped(); res.Code != engine.OK || res.Delay != 0 {
			t.Fatalf("request %d within the burst: %v delay %v, want ok at once", i+1, res.Code, res.Delay)
		}
	}
	var last time.Duration
	for i := range 4 {
		res := shaped()
		if res.Code != engine.OK {
			t.Fatalf("queued request %d: %v, want ok with a delay", i+1, res.Code)
		}
		// Each queued request waits one more interval (less the few ms
		// the checks themselves take).
		want := time.Duration(i+1) * 500 * time.Millisecond
		if res.Delay > want || res.Delay < want-450*time.Millisecond || res.Delay <= last {
			t.Errorf("queued request %d: delay %v, want just under %v and growing", i+1, res.Delay, want)
		}
		if s := res.Statuses[0]; s.Remaining != 0 || s.ResetAfter > time.Second {
			t.Errorf("queued request %d: remaining %d reset %v, want 0 and at most the real bucket's 1s", i+1, s.Remaining, s.ResetAfter)
		}
		last = res.Delay
	}
	res := shaped()
	if res.Code != engine.OverLimit || res.Delay != 0 || res.Statuses[0].RetryAfter <= 0 {
		t.Errorf("request beyond max_delay: %v delay %v retry %v, want over_limit with a retry-after", res.Code, res.Delay, res.Statuses[0].RetryAfter)
	}
}

func TestStoreDown(t *testing.T) {
	t.Parallel()
	res := check(t, deadEngine(t), req(entry("open", "x")))
	if !engine.StoreDown(res.StoreErr) {
		t.Errorf("StoreDown(%v) = false for a refused connection", res.StoreErr)
	}
	for _, err := range []error{context.DeadlineExceeded, &net.OpError{Op: "read", Err: timeoutErr{}}, errors.New("ERR script error"), breaker.ErrOpen} {
		if engine.StoreDown(err) {
			t.Errorf("StoreDown(%v) = true, want false (not proof of an outage)", err)
		}
	}
}

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }
