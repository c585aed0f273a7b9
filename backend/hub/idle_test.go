package hub_test

// An idle node end to end: a real enforcer engine and subscriber checking
// against Redis, reporting to a real console, falling idle and resuming.

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/rules"
)

// TestIdleNodeStatsExactWhenTrafficResumes: a node that decided nothing for
// a while (and so sent no stats) shows zero rates, stays connected, and
// when its traffic resumes every decision of the first second is counted:
// the totals and the live series are exact.
func TestIdleNodeStatsExactWhenTrafficResumes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.publish("api", "domain: api\ndescriptors:\n  - key: customer\n    rate_limit: {unit: hour, requests_per_unit: 5, name: per-customer}\n")
	c := e.startConsole()

	eng := startRealNode(t, e, c, "n1")
	from := time.Now().Add(-time.Second).UTC().Format(time.RFC3339)

	check := func(value string, n int) {
		t.Helper()
		for range n {
			if _, err := eng.Check(context.Background(), engine.Request{Domain: "api",
				Descriptors: []engine.Descriptor{{Entries: []rules.Entry{{Key: "customer", Value: value}}}}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	type counts struct{ allowed, limited int64 }
	totals := func() counts {
		var body struct {
			Rules []struct {
				Allowed int64 `json:"allowed"`
				Limited int64 `json:"limited"`
			} `json:"rules"`
		}
		e.getJSON(c.url+"/api/v1/stats/totals?domain=api&from="+url.QueryEscape(from), &body)
		if len(body.Rules) != 1 {
			return counts{}
		}
		return counts{body.Rules[0].Allowed, body.Rules[0].Limited}
	}
	live := func() counts {
		var body struct {
			Rules []struct {
				Points []struct {
					Allowed int64 `json:"allowed"`
					Limited int64 `json:"limited"`
				} `json:"points"`
			} `json:"rules"`
		}
		e.getJSON(c.url+"/api/v1/stats/live?domain=api", &body)
		var sum counts
		for _, r := range body.Rules {
			for _, p := range r.Points {
				sum.allowed += p.Allowed
				sum.limited += p.Limited
			}
		}
		return sum
	}

	check("a", 8) // 5 allowed, 3 limited
	waitFor(t, "the first burst counted", func() bool { return totals() == counts{5, 3} })
	waitFor(t, "the node's rates read zero once it is idle", func() bool {
		n := e.nodes(c.url)["n1"]
		return n.Status == "connected" && n.Rates != nil && n.Rates.Decisions == 0
	})

	// Traffic resumes: its first interval is reported whole.
	check("b", 7) // 5 allowed, 2 limited
	waitFor(t, "the second burst counted", func() bool { return totals() == counts{10, 5} })
	if got := live(); got != (counts{10, 5}) {
		t.Errorf("live series sum to %+v, want {10 5}", got)
	}
	if n := e.nodes(c.url)["n1"]; n.Status != "connected" {
		t.Errorf("node status %q, want connected", n.Status)
	}
}
