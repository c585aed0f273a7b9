package limiter

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
)

// testClient returns a client for the test Redis. Behaviour tests use a
// generous timeout so a loaded machine cannot turn them into timeout tests.
func testClient(t testing.TB) redis.UniversalClient {
	t.Helper()
	c, err := NewClient(testenv.RedisURL(t), WithTimeout(2*time.Second), WithDialTimeout(2*time.Second))
	if err != nil {
		t.Fatalf("NewClient: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// testPrefix returns this test's key prefix and deletes every key under it
// when the test ends (slow test limits would otherwise linger for hours).
func testPrefix(t testing.TB, c redis.UniversalClient) string {
	t.Helper()
	prefix := testenv.KeyPrefix(t)
	t.Cleanup(func() {
		ctx := context.Background()
		iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			c.Del(ctx, iter.Val())
		}
		if err := iter.Err(); err != nil {
			t.Logf("clean up keys %s*: %v", prefix, err)
		}
	})
	return prefix
}

func newTestRedis(t testing.TB) (*Redis, redis.UniversalClient, string) {
	t.Helper()
	c := testClient(t)
	return NewRedis(c), c, testPrefix(t, c)
}

func take(t testing.TB, r *Redis, reqs ...Request) []Decision {
	t.Helper()
	ds, err := r.Take(context.Background(), reqs)
	if err != nil {
		t.Fatalf("Take: %v", err)
	}
	if len(ds) != len(reqs) {
		t.Fatalf("Take returned %d decisions for %d requests", len(ds), len(reqs))
	}
	return ds
}

func take1(t testing.TB, r *Redis, req Request) Decision {
	t.Helper()
	return take(t, r, req)[0]
}

func testKey(prefix, value string) string {
	return Key(prefix, "test", []rules.Entry{{Key: "k", Value: value}})
}

func TestTakeBurstThenReject(t *testing.T) {
	t.Parallel()
	r, _, prefix := newTestRedis(t)
	// 5 per minute, burst 5: a token comes back every 12 s.
	req := Request{Key: testKey(prefix, "burst"), Limit: 5, Period: time.Minute, Burst: 5, Hits: 1}
	start := time.Now()
	for i := range 5 {
		d := take1(t, r, req)
		if !d.Allowed {
			t.Fatalf("take %d: not allowed: %+v", i+1, d)
		}
		if got, want := d.Remaining, int64(4-i); got != want {
			t.Errorf("take %d: Remaining = %d, want %d", i+1, got, want)
		}
		if d.Limit != 5 {
			t.Errorf("take %d: Limit = %d, want 5", i+1, d.Limit)
		}
		if d.RetryAfter != 0 {
			t.Errorf("take %d: RetryAfter = %v, want 0", i+1, d.RetryAfter)
		}
		// Each token takes 12 s to come back.
		if want := time.Duration(i+1) * 12 * time.Second; d.ResetAfter > want || d.ResetAfter < want-time.Since(start)-time.Second {
			t.Errorf("take %d: ResetAfter = %v, want about %v", i+1, d.ResetAfter, want)
		}
	}
	d := take1(t, r, req)
	elapsed := time.Since(start)
	if d.Allowed {
		t.Fatalf("take 6: allowed, want rejected: %+v", d)
	}
	if d.Remaining != 0 {
		t.Errorf("take 6: Remaining = %d, want 0", d.Remaining)
	}
	// The first token returns 12 s after the first take.
	if d.RetryAfter > 12*time.Second || d.RetryAfter < 12*time.Second-elapsed-time.Millisecond {
		t.Errorf("take 6: RetryAfter = %v, want within %v of 12s", d.RetryAfter, elapsed)
	}
	if d.ResetAfter > time.Minute || d.ResetAfter < time.Minute-elapsed-time.Millisecond {
		t.Errorf("take 6: ResetAfter = %v, want about 1m", d.ResetAfter)
	}
}

func TestTakeRefill(t *testing.T) {
	t.Parallel()
	r, _, prefix := newTestRedis(t)
	now := int64(t0)
	r.now = func() int64 { return now }
	// 10 per second: a token every 100 ms.
	req := Request{Key: testKey(prefix, "refill"), Limit: 10, Period: time.Second, Burst: 3, Hits: 1}
	for i := range 3 {
		if d := take1(t, r, req); !d.Allowed {
			t.Fatalf("take %d: not allowed", i+1)
		}
	}
	d := take1(t, r, req)
	if d.Allowed {
		t.Fatal("take 4: allowed, want rejected")
	}
	if d.RetryAfter != 100*time.Millisecond {
		t.Fatalf("RetryAfter = %v, want 100ms", d.RetryAfter)
	}
	now += d.RetryAfter.Microseconds()
	d = take1(t, r, req)
	if !d.Allowed {
		t.Fatalf("after waiting RetryAfter: not allowed: %+v", d)
	}
	if d.Remaining != 0 {
		t.Errorf("after refill of one token: Remaining = %d, want 0", d.Remaining)
	}

	// A full refill: 300 ms later the bucket holds its burst again.
	now += 300_000
	d = take1(t, r, Request{Key: req.Key, Limit: 10, Period: time.Second, Burst: 3})
	if !d.Allowed || d.Remaining != 3 || d.ResetAfter != 0 {
		t.Errorf("after full refill: %+v, want allowed, Remaining 3, ResetAfter 0", d)
	}
}

func TestTakeHits(t *testing.T) {
	t.Parallel()
	r, _, prefix := newTestRedis(t)
	base := Request{Key: testKey(prefix, "hits"), Limit: 10, Period: time.Hour, Burst: 10}
	steps := []struct {
		hits          int64
		wantAllowed   bool
		wantRemaining int64
	}{
		{3, true, 7},
		{5, true, 2},
		{3, false, 2}, // rejected: nothing consumed
		{2, true, 0},
		{1, false, 0},
	}
	for i, s := range steps {
		req := base
		req.Hits = s.hits
		d := take1(t, r, req)
		if d.Allowed != s.wantAllowed || d.Remaining != s.wantRemaining {
			t.Errorf("step %d (hits %d): got Allowed=%v Remaining=%d, want %v %d",
				i, s.hits, d.Allowed, d.Remaining, s.wantAllowed, s.wantRemaining)
		}
	}
}

func TestTakeHitsOverBurst(t *testing.T) {
	t.Parallel()
	r, c, prefix := newTestRedis(t)
	// 10 per minute, burst 5: a drained bucket refills in 30 s.
	req := Request{Key: testKey(prefix, "over"), Limit: 10, Period: time.Minute, Burst: 5, Hits: 6}
	for _, hits := range []int64{6, 1 << 40} {
		req.Hits = hits
		d := take1(t, r, req)
		if d.Allowed {
			t.Fatalf("hits %d > burst 5: allowed", hits)
		}
		if d.RetryAfter != 30*time.Second {
			t.Errorf("hits %d: RetryAfter = %v, want the full refill time 30s", hits, d.RetryAfter)
		}
		if d.Remaining != 5 {
			t.Errorf("hits %d: Remaining = %d, want 5 (nothing consumed)", hits, d.Remaining)
		}
	}
	if n := c.Exists(context.Background(), stateKey(req)).Val(); n != 0 {
		t.Errorf("rejected request wrote state: EXISTS = %d", n)
	}
}

// stateKey returns the Redis key req's algorithm keeps its state under.
func stateKey(req Request) string {
	alg := req.Algorithm
	if alg == "" {
		alg = rules.TokenBucket
	}
	return req.Key + algorithms[alg].suffix
}

func TestTakePeek(t *testing.T) {
	t.Parallel()
	r, c, prefix := newTestRedis(t)
	ctx := context.Background()
	take := Request{Key: testKey(prefix, "peek"), Limit: 4, Period: time.Hour, Burst: 4, Hits: 1}
	peek := take
	peek.Hits = 0

	d := take1(t, r, peek)
	if !d.Allowed || d.Remaining != 4 || d.ResetAfter != 0 {
		t.Errorf("peek fresh: %+v, want allowed, Remaining 4, ResetAfter 0", d)
	}
	if n := c.Exists(ctx, stateKey(peek)).Val(); n != 0 {
		t.Errorf("peek created state: EXISTS = %d", n)
	}

	take1(t, r, take)
	for i := range 3 {
		if d := take1(t, r, peek); !d.Allowed || d.Remaining != 3 {
			t.Errorf("peek %d after one take: %+v, want allowed, Remaining 3", i, d)
		}
	}
	for range 3 {
		take1(t, r, take)
	}
	// A peek at an empty bucket is allowed: it asks for nothing.
	d = take1(t, r, peek)
	if !d.Allowed || d.Remaining != 0 {
		t.Errorf("peek at empty bucket: %+v, want allowed (0 hits), Remaining 0", d)
	}
	if d := take1(t, r, take); d.Allowed || d.RetryAfter <= 0 {
		t.Errorf("take at empty bucket: %+v, want rejected with RetryAfter > 0", d)
	}
}

func TestTakeAllOrNothing(t *testing.T) {
	t.Parallel()
	r, _, prefix := newTestRedis(t)
	mk := func(name string, burst int64) Request {
		return Request{Key: testKey(prefix, name), Limit: 1, Period: time.Hour, Burst: burst, Hits: 1}
	}
	a, b, c := mk("a", 5), mk("b", 1), mk("c", 5)
	take1(t, r, b) // exhaust b

	ds := take(t, r, a, b, c)
	if ds[1].Allowed {
		t.Fatalf("b: allowed, want rejected: %+v", ds[1])
	}
	if ds[1].RetryAfter <= 59*time.Minute {
		t.Errorf("b: RetryAfter = %v, want about 1h", ds[1].RetryAfter)
	}
	for _, i := range []int{0, 2} {
		// a and c would admit the request on their own, but nothing is consumed.
		if !ds[i].Allowed || ds[i].Remaining != 5 || ds[i].ResetAfter != 0 {
			t.Errorf("decision %d: %+v, want allowed with Remaining 5 and ResetAfter 0 (untouched)", i, ds[i])
		}
	}
	for _, req := range []Request{a, c} {
		peek := req
		peek.Hits = 0
		if d := take1(t, r, peek); d.Remaining != 5 {
			t.Errorf("%s after rejected batch: Remaining = %d, want 5", req.Key, d.Remaining)
		}
	}

	// Without the exhausted limit the batch goes through and consumes from both.
	ds = take(t, r, a, c)
	for i, d := range ds {
		if !d.Allowed || d.Remaining != 4 {
			t.Errorf("decision %d: %+v, want allowed with Remaining 4", i, d)
		}
	}
}

func TestTakeDuplicateKey(t *testing.T) {
	t.Parallel()
	r, _, prefix := newTestRedis(t)
	one := Request{Key: testKey(prefix, "dup1"), Limit: 1, Period: time.Hour, Burst: 1, Hits: 1}
	ds := take(t, r, one, one)
	if ds[0].Allowed == ds[1].Allowed || ds[1].Allowed {
		t.Errorf("same key twice with burst 1: %+v, want first allowed, second rejected", ds)
	}
	if d := take1(t, r, one); !d.Allowed {
		t.Errorf("after rejected duplicate batch: %+v, want the token still there", d)
	}

	two := Request{Key: testKey(prefix, "dup2"), Limit: 1, Period: time.Hour, Burst: 2, Hits: 1}
	ds = take(t, r, two, two)
	if !ds[0].Allowed || !ds[1].Allowed || ds[0].Remaining != 1 || ds[1].Remaining != 0 {
		t.Errorf("same key twice with burst 2: %+v, want both allowed, Remaining 1 then 0", ds)
	}
	if d := take1(t, r, two); d.Allowed {
		t.Errorf("after consuming 2 of 2: %+v, want rejected", d)
	}
}

func TestTakeTTL(t *testing.T) {
	t.Parallel()
	r, c, prefix := newTestRedis(t)
	ctx := context.Background()

	// 10 per minute: each token is back after 6 s, so 3 hits expire in 18 s.
	req := Request{Key: testKey(prefix, "ttl"), Limit: 10, Period: time.Minute, Burst: 10, Hits: 3}
	d := take1(t, r, req)
	ttl, err := c.PTTL(ctx, stateKey(req)).Result()
	if err != nil {
		t.Fatalf("PTTL: %v", err)
	}
	if ttl <= 17*time.Second || ttl > 18*time.Second {
		t.Errorf("TTL = %v, want about 18s", ttl)
	}
	if diff := ttl - d.ResetAfter; diff > time.Millisecond || diff < -time.Second {
		t.Errorf("TTL %v does not match ResetAfter %v", ttl, d.ResetAfter)
	}

	// An idle key vanishes once its bucket is full again.
	fast := Request{Key: testKey(prefix, "vanish"), Limit: 10, Period: time.Second, Burst: 1, Hits: 1}
	take1(t, r, fast)
	if n := c.Exists(ctx, stateKey(fast)).Val(); n != 1 {
		t.Fatalf("state key missing right after take: EXISTS = %d", n)
	}
	time.Sleep(250 * time.Millisecond)
	if n := c.Exists(ctx, stateKey(fast)).Val(); n != 0 {
		t.Errorf("state key still there 250ms after a 100ms refill: EXISTS = %d", n)
	}
}

func TestTakeAfterScriptFlush(t *testing.T) {
	t.Parallel()
	_, r, c := privateRedis(t)
	prefix := "flush:"
	req := Request{Key: testKey(prefix, "noscript"), Limit: 10, Period: time.Hour, Burst: 10, Hits: 1}
	if d := take1(t, r, req); d.Remaining != 9 {
		t.Fatalf("first take: %+v", d)
	}
	// Drops every cached script.
	if err := c.ScriptFlush(context.Background()).Err(); err != nil {
		t.Fatalf("SCRIPT FLUSH: %v", err)
	}
	if d := take1(t, r, req); !d.Allowed || d.Remaining != 8 {
		t.Errorf("take after SCRIPT FLUSH: %+v, want allowed with Remaining 8", d)
	}
	if d := take1(t, r, req); !d.Allowed || d.Remaining != 7 {
		t.Errorf("second take after SCRIPT FLUSH: %+v, want allowed with Remaining 7", d)
	}
}

func TestTakeConcurrent(t *testing.T) {
	t.Parallel()
	const (
		clients = 3
		burst   = 100
	)
	url := testenv.RedisURL(t)
	var engines []*Redis
	var cleanupClient redis.UniversalClient
	for range clients {
		c, err := NewClient(url, WithTimeout(5*time.Second), WithDialTimeout(5*time.Second))
		if err != nil {
			t.Fatalf("NewClient: %v", err)
		}
		t.Cleanup(func() { c.Close() })
		engines = append(engines, NewRedis(c))
		cleanupClient = c
	}
	prefix := testPrefix(t, cleanupClient)
	for _, alg := range []rules.Algorithm{rules.TokenBucket, rules.FixedWindow} {
		// Token bucket: one token per hour, no refill while the test runs.
		req := Request{Key: testKey(prefix, "hot"+string(alg)), Algorithm: alg, Limit: 1, Period: time.Hour, Burst: burst, Hits: 1}
		if alg == rules.FixedWindow {
			req.Limit, req.Period = burst, noBoundary
		}
		t.Run(string(alg), func(t *testing.T) { concurrentTakes(t, engines, req) })
	}
}

// noBoundary is a window period whose current window (multiples since the
// epoch) runs until 2070: no boundary falls inside a test.
const noBoundary = 100 * 365 * 24 * time.Hour

func concurrentTakes(t *testing.T, engines []*Redis, req Request) {
	const (
		goroutines = 64
		perG       = 4
		burst      = 100
	)
	clients := len(engines)

	var allowed, rejected atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, clients*goroutines)
	start := make(chan struct{})
	for _, e := range engines {
		for range goroutines {
			wg.Go(func() {
				<-start
				for range perG {
					ds, err := e.Take(context.Background(), []Request{req})
					if err != nil {
						errs <- err
						return
					}
					if ds[0].Allowed {
						allowed.Add(1)
					} else {
						rejected.Add(1)
					}
				}
			})
		}
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("Take: %v", err)
	}
	if got := allowed.Load(); got != burst {
		t.Errorf("allowed %d of %d concurrent takes, want exactly %d", got, clients*goroutines*perG, burst)
	}
	if got, want := rejected.Load(), int64(clients*goroutines*perG-burst); got != want {
		t.Errorf("rejected %d, want %d", got, want)
	}
}

func TestTakeInvalid(t *testing.T) {
	t.Parallel()
	// Validation happens before any Redis call, so a client that cannot
	// connect is enough.
	c, err := NewClient("redis://127.0.0.1:1/0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := NewRedis(c)
	ok := Request{Key: "k", Limit: 1, Period: time.Second, Burst: 1, Hits: 1}
	tests := []struct {
		name   string
		change func(*Request)
		want   error
	}{
		{"empty key", func(r *Request) { r.Key = "" }, ErrInvalidRequest},
		{"zero limit", func(r *Request) { r.Limit = 0 }, ErrInvalidRequest},
		{"negative limit", func(r *Request) { r.Limit = -1 }, ErrInvalidRequest},
		{"zero period", func(r *Request) { r.Period = 0 }, ErrInvalidRequest},
		{"sub-microsecond period", func(r *Request) { r.Period = time.Nanosecond }, ErrInvalidRequest},
		{"negative burst", func(r *Request) { r.Burst = -1 }, ErrInvalidRequest},
		{"negative hits", func(r *Request) { r.Hits = -1 }, ErrInvalidRequest},
		{"unknown algorithm", func(r *Request) { r.Algorithm = "magic" }, ErrUnsupportedAlgorithm},
		{"huge limit", func(r *Request) { r.Limit = 1<<53 + 1 }, ErrInvalidRequest},
		{"negative max delay", func(r *Request) { r.MaxDelay = -1 }, ErrInvalidRequest},
		{"calendar with an hour", func(r *Request) { r.Algorithm, r.Calendar, r.Period = rules.FixedWindow, true, time.Hour }, ErrInvalidRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bad := ok
			tt.change(&bad)
			_, err := r.Take(context.Background(), []Request{ok, bad})
			if !errors.Is(err, tt.want) {
				t.Errorf("Take: got error %v, want %v", err, tt.want)
			}
		})
	}

	ds, err := r.Take(context.Background(), nil)
	if err != nil || len(ds) != 0 {
		t.Errorf("Take(nil) = %v, %v; want no decisions, no error", ds, err)
	}
}

func TestTakeDefaultBurst(t *testing.T) {
	t.Parallel()
	r, _, prefix := newTestRedis(t)
	req := Request{Key: testKey(prefix, "default"), Limit: 3, Period: time.Hour, Hits: 1}
	d := take1(t, r, req)
	if d.Limit != 3 || d.Remaining != 2 {
		t.Errorf("Burst 0: %+v, want Limit 3 (= Limit), Remaining 2", d)
	}
}

func TestTakeDefaultClient(t *testing.T) {
	t.Parallel()
	// The request-path defaults (50 ms timeouts) against a live Redis.
	c, err := NewClient(testenv.RedisURL(t))
	if err != nil {
		t.Fatalf("NewClient: %v", err)
	}
	t.Cleanup(func() { c.Close() }) // after testPrefix's cleanup
	prefix := testPrefix(t, c)
	if err := Ping(context.Background(), c); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	d := take1(t, NewRedis(c), Request{Key: testKey(prefix, "x"), Limit: 2, Period: time.Second, Hits: 1})
	if !d.Allowed || d.Remaining != 1 {
		t.Errorf("Take: %+v, want allowed, Remaining 1", d)
	}
}

func TestDecodeMalformed(t *testing.T) {
	t.Parallel()
	call := func() []*takeCall { return []*takeCall{{specs: []spec{{limit: 1, capacity: 1}}}} }
	i := func(v int64) any { return v }
	tests := []struct {
		name  string
		reply any
	}{
		{"not an array", int64(1)},
		{"too short", []any{i(1), i(0), i(0), i(0)}},
		{"too long", []any{i(1), i(0), i(0), i(0), i(0), i(0)}},
		{"string value", []any{i(1), "0", i(0), i(0), i(0)}},
		{"bad flag", []any{i(2), i(0), i(0), i(0), i(0)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := decode(tt.reply, call(), 1, false); !errors.Is(err, errMalformedReply) {
				t.Errorf("decode: got %v, want errMalformedReply", err)
			}
		})
	}
	for _, tt := range []struct {
		name  string
		reply any
	}{
		{"time missing", []any{i(1), i(0), i(0), i(0), i(0)}},
		{"time not an integer", []any{i(1), i(0), i(0), i(0), i(0), "1"}},
		{"time not positive", []any{i(1), i(0), i(0), i(0), i(0), i(0)}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if err := decode(tt.reply, call(), 1, true); !errors.Is(err, errMalformedReply) {
				t.Errorf("decode: got %v, want errMalformedReply", err)
			}
		})
	}
	calls := call()
	if err := decode([]any{i(0), i(3), i(1 << 62), i(-5), i(-1), i(7)}, calls, 1, true); err != nil {
		t.Fatalf("decode: %v", err)
	}
	if calls[0].now != 7 {
		t.Errorf("now = %d, want 7", calls[0].now)
	}
	d := calls[0].ds[0]
	if d.ResetAfter != maxMicros*time.Microsecond || d.RetryAfter != 0 || d.Delay != 0 || d.Remaining != 1 {
		t.Errorf("out-of-range values not clamped: %+v", d)
	}
}

// TestScriptArguments calls the script directly: the per-Take arguments of
// take.lua's header decide as documented (a repeated argument, a Take of
// several requests), and a malformed one fails the call instead of being
// misread.
func TestScriptArguments(t *testing.T) {
	t.Parallel()
	c := testClient(t)
	prefix := testPrefix(t, c)
	ctx := context.Background()
	key := prefix + "args:tb"
	// One token bucket limit: 2 per second, burst 2, at a fixed time.
	head := []any{t0, 1, "tb", 2, 1_000_000, 2, 0, 0}
	run := func(keys []string, takes ...any) ([]any, error) {
		v, err := takeScript.Run(ctx, c, keys, append(append([]any{}, head...), takes...)...).Result()
		if err != nil {
			return nil, err
		}
		return v.([]any), nil
	}
	i := func(v ...int64) []any {
		out := make([]any, len(v))
		for j, x := range v {
			out[j] = x
		}
		return out
	}
	// Three Takes of one hit: the third is over the burst (retry 0.5 s).
	got, err := run([]string{key, key, key}, "t1:1", "t1:1", "t1:1")
	if err != nil {
		t.Fatal(err)
	}
	// A fixed time ("N") comes back after the decisions.
	want := i(1, 1, 500_000, 0, 0, 1, 0, 1_000_000, 0, 0, 0, 0, 1_000_000, 500_000, 0, t0)
	if !slices.Equal(got, want) {
		t.Errorf("three Takes: got %v, want %v", got, want)
	}
	// A check of two requests, a peek and 2 hits: nothing is free, so the
	// Take is rejected and reports the state it found.
	got, err = run([]string{key, key}, "c2", "1:0", "1:2")
	if err != nil {
		t.Fatal(err)
	}
	want = i(1, 0, 1_000_000, 0, 0, 0, 0, 1_000_000, 1_000_000, 0, t0)
	if !slices.Equal(got, want) {
		t.Errorf("check of two requests: got %v, want %v", got, want)
	}
	// A refund of one hit, then of two requests (a peek, which reports the
	// bucket as it finds it, and a hit): the bucket is full again.
	got, err = run([]string{key}, "r1:1")
	if err != nil {
		t.Fatal(err)
	}
	want = i(1, 1, 500_000, 0, 0, t0)
	if !slices.Equal(got, want) {
		t.Errorf("refund of one hit: got %v, want %v", got, want)
	}
	got, err = run([]string{key, key}, "r2", "1:0", "1:1")
	if err != nil {
		t.Fatal(err)
	}
	want = i(1, 1, 500_000, 0, 0, 1, 2, 0, 0, 0, t0)
	if !slices.Equal(got, want) {
		t.Errorf("refund of two requests: got %v, want %v", got, want)
	}
	// The clocks: "" and "?" read TIME ("" reports nothing), "~N" keeps N
	// within 100 ms of TIME.
	clockRun := func(clock string) []any {
		t.Helper()
		v, err := takeScript.Run(ctx, c, []string{key}, clock, 1, "tb", 2, 1_000_000, 2, 0, 0, "c1:1").Result()
		if err != nil {
			t.Fatalf("clock %q: %v", clock, err)
		}
		return v.([]any)
	}
	if got := clockRun(""); len(got) != 5 {
		t.Errorf(`clock "": %d values, want 5`, len(got))
	}
	tm, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	own := tm.UnixMicro()
	for _, tt := range []struct {
		clock    string
		lo, high int64 // bounds of the time used
	}{
		{"?", own, own + 5_000_000},
		{"~" + strconv.FormatInt(own+20_000, 10), own + 20_000, own + 20_000},
		{"~1", own - 100_000, own + 5_000_000 - 100_000},
		{"~" + strconv.FormatInt(own+time.Hour.Microseconds(), 10), own + 100_000, own + 5_000_000 + 100_000},
	} {
		got := clockRun(tt.clock)
		if len(got) != 6 {
			t.Errorf("clock %q: %d values, want 6", tt.clock, len(got))
			continue
		}
		if now := got[5].(int64); now < tt.lo || now > tt.high {
			t.Errorf("clock %q: time used %d, want in [%d, %d]", tt.clock, now, tt.lo, tt.high)
		}
	}
	for _, bad := range [][]any{{"t1:x"}, {"x1:1"}, {"t:1"}, {"t1:"}, {"t2", "1:1", "x"}, {"t2", "1:1"}} {
		if got, err := run([]string{key, key}, bad...); err == nil {
			t.Errorf("arguments %q: got %v, want an error", bad, got)
		}
	}
}
