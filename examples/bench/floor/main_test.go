package main

import (
	"context"
	"regexp"
	"strconv"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/enforcer/limiter"
	"github.com/sluicehq/sluice/internal/testenv"
)

func check(key string) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: "bench", HitsAddend: 1, Descriptors: []*commonv3.RateLimitDescriptor{
		{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "key", Value: key}}},
	}}
}

// TestFloorRedisTakes checks that floor -redis really asks Redis for every
// check: each check is one script call there, and with Redis gone a check
// gets an error instead of the fixed answer.
func TestFloorRedisTakes(t *testing.T) {
	rs := testenv.StartRedis(t)
	client, err := limiter.NewClient(rs.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	svc := service{store: limiter.NewBatcher(limiter.NewRedis(client), limiter.BatchOptions{})}
	ctx := context.Background()
	for _, k := range []string{"k0", "k1", "k0"} {
		resp, err := svc.ShouldRateLimit(ctx, check(k))
		if err != nil {
			t.Fatal(err)
		}
		if resp != answer {
			t.Fatalf("answer %v", resp)
		}
	}
	// The buckets expire at once (one hit of 10^8 a second refills in
	// nanoseconds), so count the script calls that succeeded instead.
	if n := scriptCalls(t, rs.CLI("INFO", "commandstats")); n != 3 {
		t.Fatalf("%d script calls for 3 checks", n)
	}
	rs.Stop()
	if _, err := svc.ShouldRateLimit(ctx, check("k2")); err == nil {
		t.Fatal("a check with Redis stopped was answered")
	}
}

// TestFloorWithoutRedis answers without a store.
func TestFloorWithoutRedis(t *testing.T) {
	resp, err := service{}.ShouldRateLimit(context.Background(), check("k0"))
	if err != nil || resp != answer {
		t.Fatalf("%v, %v", resp, err)
	}
}

// scriptCalls sums the successful EVAL and EVALSHA calls in INFO
// commandstats.
func scriptCalls(t *testing.T, info string) int {
	t.Helper()
	n := 0
	for _, m := range regexp.MustCompile(`cmdstat_eval(?:sha)?:calls=(\d+),.*failed_calls=(\d+)`).FindAllStringSubmatch(info, -1) {
		calls, _ := strconv.Atoi(m[1])
		failed, _ := strconv.Atoi(m[2])
		n += calls - failed
	}
	return n
}
