package engine_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/enforcer/limiter"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
)

const usageYAML = `domain: usage
default_algorithm: token_bucket
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 100, name: per-user}
    descriptors:
      - key: route
        rate_limit: {unit: hour, requests_per_unit: 10, name: per-route}
  - key: hot
    shards: 4
    rate_limit: {unit: hour, requests_per_unit: 40, name: hot}
  - key: free
    rate_limit: {unlimited: true}
`

func usageEngine(t *testing.T) *engine.Engine {
	t.Helper()
	client, err := limiter.NewClient(testenv.RedisURL(t), limiter.WithTimeout(2*time.Second), limiter.WithDialTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	eng := engine.New(limiter.NewRedis(client), testenv.KeyPrefix(t))
	if err := eng.Apply(1, compile(t, usageYAML)); err != nil {
		t.Fatal(err)
	}
	return eng
}

func bucketOf(t *testing.T, eng *engine.Engine, entries ...rules.Entry) engine.Bucket {
	t.Helper()
	b, err := eng.Bucket("usage", entries)
	if err != nil {
		t.Fatalf("Bucket(%v): %v", entries, err)
	}
	return b
}

// Reports count on the counters checks use, sharded ones included, into
// the stats, and no more than the limit could have admitted.
func TestReport(t *testing.T) {
	t.Parallel()
	eng := usageEngine(t)
	ctx := context.Background()
	nested := bucketOf(t, eng, rules.Entry{Key: "route", Value: "/a"}, rules.Entry{Key: "user", Value: "u1"})
	if nested.Limit == nil || nested.Limit.Name != "per-route" || nested.Entries[0].Key != "user" || nested.Capacity() != 10 {
		t.Fatalf("nested bucket: %+v", nested)
	}
	hot := bucketOf(t, eng, rules.Entry{Key: "hot", Value: "h"})
	free := bucketOf(t, eng, rules.Entry{Key: "free", Value: "f"})
	if free.Counted() || free.Limit == nil || !free.Limit.Unlimited {
		t.Fatalf("unlimited bucket: %+v", free)
	}
	states, err := eng.Report(ctx, []engine.Usage{
		{Bucket: nested, Allowed: 3, Denied: 2},
		{Bucket: hot, Allowed: 10},
		{Bucket: free, Allowed: 1000},
	})
	if err != nil {
		t.Fatal(err)
	}
	if states[0].Remaining != 7 || states[1].Remaining != 30 || states[2] != (limiter.State{}) {
		t.Fatalf("states %+v, want 7 of 10, 30 of 40 and none", states)
	}
	// A check of the same descriptor sees the reported usage.
	res := check(t, eng, engine.Request{Domain: "usage", Descriptors: []engine.Descriptor{{Entries: nested.Entries}}})
	if s := res.Statuses[0]; s.Remaining != 6 {
		t.Fatalf("check after the report: %d remaining, want 6", s.Remaining)
	}
	// Spread evenly: each of the 4 shards of 10 has 2.5 used; a check's
	// remaining is one shard's times the shards.
	if s := check(t, eng, engine.Request{Domain: "usage", Descriptors: []engine.Descriptor{{Entries: hot.Entries}}}).Statuses[0]; s.Remaining < 24 || s.Remaining > 32 {
		t.Fatalf("check of the sharded limit: %d remaining, want about 28", s.Remaining)
	}
	// A huge report counts at most the capacity (with elapsed 0): the
	// limit is empty, not centuries in debt.
	states, err = eng.Report(ctx, []engine.Usage{{Bucket: bucketOf(t, eng, rules.Entry{Key: "user", Value: "u2"}), Allowed: math.MaxUint64}})
	if err != nil || states[0].Remaining != 0 {
		t.Fatalf("huge report: %+v, %v", states, err)
	}
	var allowed, limited int64
	for _, rs := range eng.TakeStats() {
		if rs.Rule == "per-route" {
			allowed, limited = rs.Allowed, rs.Limited
		}
	}
	if allowed != 4 || limited != 2 { // 3 reported and the check's
		t.Fatalf("per-route stats: %d allowed, %d limited, want 4 and 2", allowed, limited)
	}
}

func TestBucketInvalid(t *testing.T) {
	t.Parallel()
	eng := usageEngine(t)
	for name, entries := range map[string][]rules.Entry{
		"none":        nil,
		"empty key":   {{Key: "", Value: "v"}},
		"empty value": {{Key: "user", Value: ""}},
		"twice":       {{Key: "user", Value: "a"}, {Key: "user", Value: "b"}},
		"long value":  {{Key: "user", Value: strings.Repeat("v", engine.MaxValueBytes+1)}},
	} {
		if _, err := eng.Bucket("usage", entries); !errors.Is(err, engine.ErrInvalidRequest) {
			t.Errorf("%s: %v, want ErrInvalidRequest", name, err)
		}
	}
	if _, err := eng.Bucket("", []rules.Entry{{Key: "user", Value: "u"}}); !errors.Is(err, engine.ErrInvalidRequest) {
		t.Errorf("no domain: %v", err)
	}
	if b, err := eng.Bucket("other", []rules.Entry{{Key: "user", Value: "u"}}); err != nil || b.Limit != nil || b.Counted() {
		t.Errorf("unknown domain: %+v, %v; want no limit", b, err)
	}
	if _, err := engine.New(nil, "").Bucket("usage", []rules.Entry{{Key: "user", Value: "u"}}); !errors.Is(err, engine.ErrNoRuleset) {
		t.Errorf("before a ruleset: %v", err)
	}
}
