package limiter_test

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/enforcer/limiter"
	"github.com/sluicehq/sluice/rules"
)

// An enforcer's wiring: Takes go through a Batcher; when Redis fails, limits
// with failure_mode local fall back to a Local limiter holding this node's
// share.
func Example() {
	client, err := limiter.NewClient("redis://127.0.0.1:6379/0")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close()
	store := limiter.NewBatcher(limiter.NewRedis(client), limiter.BatchOptions{})
	local := limiter.NewLocal(limiter.LocalOptions{})
	local.SetNodeCount(3) // from the console's snapshot

	key := func(kv ...string) string {
		return limiter.Key("sluice:", "api", []rules.Entry{{Key: kv[0], Value: kv[1]}})
	}
	reqs := []limiter.Request{
		// 1000 per minute per API key, bursts of 200.
		{Key: key("api_key", "k1"), Limit: 1000, Period: time.Minute, Burst: 200, Hits: 1},
		// A daily quota, reset at midnight UTC.
		{Key: key("plan", "free"), Algorithm: rules.FixedWindow, Limit: 10_000, Period: rules.Day.Period(), Calendar: true, Hits: 1},
		// Smooth to 10 per second, queueing up to 2 s.
		{Key: key("remote_address", "10.0.0.1"), Algorithm: rules.LeakyBucket, Limit: 10, Period: time.Second, MaxDelay: 2 * time.Second, Hits: 1},
	}
	ds, err := store.Take(context.Background(), reqs)
	if err != nil {
		ds, err = local.Take(context.Background(), reqs)
	}
	if err != nil {
		fmt.Println(err) // an invalid request
		return
	}
	var delay time.Duration
	for _, d := range ds {
		if !d.Allowed {
			fmt.Println("429, retry after", d.RetryAfter)
			return
		}
		delay = max(delay, d.Delay)
	}
	time.Sleep(delay) // a shaping limit's queue
	fmt.Println("allowed")
}
