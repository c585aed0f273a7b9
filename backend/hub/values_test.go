package hub_test

// A value's 429 history end to end: a real enforcer engine and subscriber
// checking against Redis and reporting over the websocket, a real console
// writing the per-value rollups to Postgres, and another console serving
// them.

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend/stats"
	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/enforcer/limiter"
	enforcernode "github.com/sluicehq/sluice/enforcer/node"
	"github.com/sluicehq/sluice/enforcer/subscriber"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
)

type valueHistory struct {
	Rules []struct {
		Rule   string `json:"rule"`
		Points []struct {
			T        int64 `json:"t"`
			Limited  int64 `json:"limited"`
			Complete bool  `json:"complete"`
		} `json:"points"`
		Complete bool `json:"complete"`
	} `json:"rules"`
}

func TestValueHistoryFromANode(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.publish("api", "domain: api\ndescriptors:\n  - key: customer\n    rate_limit: {unit: hour, requests_per_unit: 1, name: per-customer}\n")
	c := e.startConsole()

	eng := startRealNode(t, e, c, "n1")

	// All the traffic in one minute: wait for a fresh one when this one
	// is nearly over.
	if left := time.Until(time.Now().Truncate(time.Minute).Add(time.Minute)); left < 25*time.Second {
		time.Sleep(left + 100*time.Millisecond)
	}
	minute := time.Now().Truncate(time.Minute)

	// 1,000 customers limited 2 to 6 times each (one request admitted
	// first), and 200 more limited once: those are beyond the 1,000 most
	// limited of the minute.
	const heavy, light = stats.ValuesPerMinute, 200
	want := make(map[string]int64, heavy+light)
	for i := range heavy + light {
		n := int64(1)
		if i < heavy {
			n = int64(2 + i%5)
		}
		want[fmt.Sprintf("cust-%04d", i)] = n
	}
	var total int64
	var wg sync.WaitGroup
	values := make(chan string)
	for range 8 {
		wg.Go(func() {
			for v := range values {
				for range want[v] + 1 {
					if _, err := eng.Check(context.Background(), engine.Request{Domain: "api",
						Descriptors: []engine.Descriptor{{Entries: []rules.Entry{{Key: "customer", Value: v}}}}}); err != nil {
						t.Error(err)
					}
				}
			}
		})
	}
	for v, n := range want {
		values <- v
		total += n
	}
	close(values)
	wg.Wait()
	if !time.Now().Truncate(time.Minute).Equal(minute) {
		t.Fatal("the traffic spilled into the next minute; the machine is too slow for this test")
	}

	// Every 429 reached the console; stopping it writes the minute.
	waitFor(t, "the console counts every 429", func() bool {
		var body struct {
			Rules []struct {
				Limited int64 `json:"limited"`
			} `json:"rules"`
		}
		e.getJSON(c.url+"/api/v1/stats/totals?domain=api&from="+url.QueryEscape(minute.Format(time.RFC3339)), &body)
		return len(body.Rules) == 1 && body.Rules[0].Limited == total
	})
	c.stop()
	c2 := e.startConsole()

	exact, lower := 0, 0
	for v, n := range want {
		var h valueHistory
		e.getJSON(c2.url+"/api/v1/stats/values?domain=api&value="+url.QueryEscape(v), &h)
		if len(h.Rules) != 1 || h.Rules[0].Rule != "per-customer" || len(h.Rules[0].Points) != 1 || h.Rules[0].Points[0].T != minute.Unix() {
			t.Fatalf("%s: %+v, want one point of per-customer in minute %d", v, h, minute.Unix())
		}
		p := h.Rules[0].Points[0]
		switch {
		case n > 1 && (p.Limited != n || !p.Complete || !h.Rules[0].Complete):
			t.Errorf("%s: %+v, want exactly %d, complete", v, p, n)
		case n > 1:
			exact++
		case p.Complete || h.Rules[0].Complete || p.Limited > n:
			t.Errorf("%s (beyond the 1,000 most limited): %+v, want a lower bound of %d, complete false", v, p, n)
		default:
			lower++
		}
	}
	if exact != heavy || lower != light {
		t.Errorf("%d exact and %d lower bounds, want %d and %d", exact, lower, heavy, light)
	}

	var recent struct {
		Values []struct {
			Value   string `json:"value"`
			Limited int64  `json:"limited"`
		} `json:"values"`
	}
	e.getJSON(c2.url+"/api/v1/stats/values/recent?domain=api&prefix=cust-099&limit=100", &recent)
	if len(recent.Values) != 10 || recent.Values[0].Limited != want[recent.Values[0].Value] {
		t.Errorf("recent values with prefix cust-099: %+v, want the 10 of them with their counts", recent.Values)
	}
}

// startRealNode runs node id as an enforcer does, until the test ends: a
// real engine checking against Redis and a subscriber reporting its stats
// to console c every 200 ms. It returns once the node applied the rules.
func startRealNode(t *testing.T, e *env, c *console, id string) *engine.Engine {
	t.Helper()
	client, err := limiter.NewClient(testenv.RedisURL(t), limiter.WithTimeout(2*time.Second), limiter.WithDialTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	eng := enforcernode.NewEngine(limiter.NewRedis(client), testenv.KeyPrefix(t), slog.New(slog.DiscardHandler))
	sub, err := subscriber.New(subscriber.Config{ConsoleURL: c.url, NodeToken: e.nodeToken(id), NodeID: id,
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 200 * time.Millisecond,
		StatsSource: eng.TakeStats, StatsInterval: 200 * time.Millisecond}, eng, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	subDone := make(chan struct{})
	go func() { defer close(subDone); sub.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-subDone })
	waitFor(t, "the node applies the rules", func() bool { return eng.Version() > 0 })
	return eng
}
