package engine

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/enforcer/limiter"
	"github.com/sluicehq/sluice/rules"
)

func TestMemoryStore(t *testing.T) {
	now := time.Unix(1000, 0)
	m := NewMemoryStore()
	m.now = func() time.Time { return now }
	ctx := context.Background()
	perSec := func(key string, hits int64) limiter.Request {
		return limiter.Request{Key: key, Limit: 10, Period: time.Second, Burst: 10, Hits: hits}
	}
	take := func(reqs ...limiter.Request) []limiter.Decision {
		t.Helper()
		ds, err := m.Take(ctx, reqs)
		if err != nil {
			t.Fatal(err)
		}
		return ds
	}

	if d := take(perSec("a", 10))[0]; !d.Allowed || d.Remaining != 0 || d.ResetAfter != time.Second {
		t.Fatalf("whole burst: %+v, want allowed, 0 remaining, full in 1s", d)
	}
	d := take(perSec("a", 1))[0]
	if d.Allowed || d.RetryAfter != 100*time.Millisecond {
		t.Fatalf("empty bucket: %+v, want rejected, retry in 100ms", d)
	}
	// All-or-nothing: b has room, a does not; b is not charged.
	ds := take(perSec("b", 5), perSec("a", 1))
	if !ds[0].Allowed || ds[1].Allowed {
		t.Fatalf("mixed batch: %+v, want b allowed on its own, a rejected", ds)
	}
	if d := take(perSec("b", 0))[0]; d.Remaining != 10 {
		t.Errorf("b after a rejected batch: remaining %d, want 10 (untouched)", d.Remaining)
	}
	// Refill: 250ms brings back 2 tokens.
	now = now.Add(250 * time.Millisecond)
	if d := take(perSec("a", 0))[0]; !d.Allowed || d.Remaining != 2 {
		t.Errorf("after 250ms: %+v, want 2 remaining", d)
	}
	// More hits than the bucket holds never fit: retry after a full refill.
	if d := take(perSec("c", 11))[0]; d.Allowed || d.RetryAfter != time.Second {
		t.Errorf("hits over capacity: %+v, want rejected, retry 1s", d)
	}
	// Full buckets are forgotten.
	now = now.Add(2 * time.Second)
	take(perSec("d", 1))
	if n := m.Len(); n != 1 {
		t.Errorf("%d keys kept after every other bucket refilled, want 1", n)
	}
	if _, err := m.Take(ctx, []limiter.Request{{Key: "x", Limit: 0, Period: time.Second}}); err == nil {
		t.Error("zero limit accepted")
	}
}

func TestMemoryStoreBounded(t *testing.T) {
	m := NewMemoryStore()
	m.maxKeys = 100
	for i := range 1000 {
		if _, err := m.Take(context.Background(), []limiter.Request{{Key: string(rune('a'+i%26)) + strings.Repeat("x", i), Limit: 1, Period: time.Hour, Hits: 1}}); err != nil {
			t.Fatal(err)
		}
	}
	if n := m.Len(); n > 100 {
		t.Errorf("%d keys held, bound is 100", n)
	}
}

func TestShardKey(t *testing.T) {
	key := limiter.Key("p:", "api", []rules.Entry{{Key: "tenant", Value: "t1"}})
	if !strings.HasSuffix(key, "}") {
		t.Fatalf("limiter.Key %q no longer ends with its hash tag; shardKey needs updating", key)
	}
	seen := map[string]bool{key: true}
	for i := range uint64(4) {
		k := shardKey(key, i)
		if seen[k] || !strings.HasSuffix(k, "}") || strings.Count(k, "{") != 1 {
			t.Errorf("shard %d key %q: want a distinct key with the shard inside the hash tag", i, k)
		}
		seen[k] = true
	}
	// No descriptor can produce a shard key: '#' in values is escaped.
	evil := limiter.Key("p:", "api", []rules.Entry{{Key: "tenant", Value: "t1:#0"}})
	if evil == shardKey(key, 0) {
		t.Errorf("descriptor value collides with a shard key: %q", evil)
	}
}
