package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/enforcer/node"
	"github.com/sluicehq/sluice/internal/consoletest"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
)

// pvDomain has one limit per algorithm the test replays, each per second;
// limit is their requests_per_unit.
func pvDomain(limit int) string {
	return fmt.Sprintf(`domain: pv
descriptors:
  - key: fixed
    algorithm: fixed_window
    rate_limit: {unit: second, requests_per_unit: %[1]d, name: fixed}
  - key: sliding
    algorithm: sliding_window_log
    rate_limit: {unit: second, requests_per_unit: %[1]d, name: sliding}
  - key: bucket
    algorithm: token_bucket
    rate_limit: {unit: second, requests_per_unit: %[1]d, name: bucket}
`, limit)
}

// pvTraffic is each value's requests in one burst, for every rule: a few
// heavy values and a tail of light ones.
var pvTraffic = map[string]int{"v1": 40, "v2": 30, "v3": 20, "v4": 10, "t1": 3, "t2": 3, "t3": 2, "t4": 1}

// pvBursts is how many bursts each phase sends, one every other second (so
// that neither a sliding window nor a bucket carries one burst into the
// next: every burst meets a full limit).
const pvBursts = 2

// TestPreviewPredictsLimited runs known per-value traffic through a real
// node (Redis, the stats stream, a real console and Postgres) under a high
// limit, previews a lowered one, publishes it, runs the same traffic again
// and compares: what the preview predicted is what the lowered limit then
// rejects, within 10%, for fixed and sliding windows; token buckets are
// marked as estimates.
func TestPreviewPredictsLimited(t *testing.T) {
	// Not parallel: the lowered limit's count is timing-sensitive under other tests' load.
	if testing.Short() {
		t.Skip("bursts over several preview spans")
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	log := slog.New(slog.DiscardHandler)

	base := consoletest.Start(t, ctx, &wg, backend.Config{DatabaseURL: testenv.PostgresURL(t), AdminPassword: "preview-password"}, log)
	admin := consoletest.Login(t, base, "admin", "preview-password")
	var tok struct {
		Token string `json:"token"`
	}
	admin.MustDo(t, "POST", "/api/v1/tokens", map[string]string{"name": "pv-node", "role": "node"}, 201, &tok)
	var pub struct {
		Version int64 `json:"version"`
	}
	admin.MustDo(t, "PUT", "/api/v1/domains/pv", map[string]any{"yaml": pvDomain(100), "message": "high", "base_version": 0}, 200, &pub)

	n, err := node.New(node.Config{ConsoleURL: base, NodeToken: tok.Token, NodeID: "pv-0", RedisURL: testenv.RedisURL(t),
		KeyPrefix: testenv.KeyPrefix(t), Log: log, StoreTimeout: 2 * time.Second}) // a loaded machine must not fail open
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	// Spans of two seconds, one burst each, so they end within the test.
	n.Engine.SetPreviewSpan(2 * time.Second)
	wg.Add(1)
	go func() { defer wg.Done(); n.Run(ctx) }()
	pvWait(t, "the node to apply the rules", func() bool { return n.Engine.Version() == pub.Version })

	before := runBursts(t, n.Engine)
	for rule, limited := range before {
		if limited != 0 {
			t.Fatalf("%s limited %d under the high limit, want 0", rule, limited)
		}
	}
	perBurst := 0
	for _, c := range pvTraffic {
		perBurst += c
	}

	// Every span of the first phase reaches the console.
	lowered := pvDomain(15)
	var prev previewBody
	pvWait(t, "the preview to hold every burst", func() bool {
		admin.MustDo(t, "POST", "/api/v1/preview", map[string]string{"domain": "pv", "yaml": lowered}, 200, &prev)
		for _, l := range prev.Limits {
			if l.Totals.Requests < int64(pvBursts*perBurst) {
				return false
			}
		}
		return len(prev.Limits) == 3
	})

	pub.Version = 0
	var cur struct {
		Version int64 `json:"version"`
	}
	admin.MustDo(t, "GET", "/api/v1/domains/pv", nil, 200, &cur)
	admin.MustDo(t, "PUT", "/api/v1/domains/pv", map[string]any{"yaml": lowered, "message": "lower", "base_version": cur.Version}, 200, &pub)
	pvWait(t, "the node to apply the lowered limits", func() bool { return n.Engine.Version() == pub.Version })
	after := runBursts(t, n.Engine)

	for _, l := range prev.Limits {
		if !l.Previewable || l.Change != "limit_changed" {
			t.Errorf("%s: previewable %v change %q (%s), want a previewable changed limit", l.Name, l.Previewable, l.Change, l.Reason)
			continue
		}
		if l.Totals.Limited != 0 {
			t.Errorf("%s: preview says %d actually limited, want 0", l.Name, l.Totals.Limited)
		}
		if got, want := l.Estimate, l.Name == "bucket"; got != want || (got && l.EstimateReason == "") {
			t.Errorf("%s: estimate = %v (%q), want %v with a reason", l.Name, got, l.EstimateReason, want)
		}
		predicted, actual := l.Totals.WouldLimit, after[l.Name]
		t.Logf("%s: predicted %d [%d, %d], actually limited %d; values %d", l.Name, predicted, l.Totals.WouldLimitLow, l.Totals.WouldLimitHigh, actual, l.Totals.ValuesMax)
		if actual == 0 || abs(predicted-actual)*10 > actual {
			t.Errorf("%s: predicted %d would be limited, %d were: not within 10%%", l.Name, predicted, actual)
		}
		if l.Totals.WouldLimitLow > predicted || predicted > l.Totals.WouldLimitHigh {
			t.Errorf("%s: estimate %d outside its bounds [%d, %d]", l.Name, predicted, l.Totals.WouldLimitLow, l.Totals.WouldLimitHigh)
		}
		// v1, v2 and v3 are over 15 in every burst.
		if l.Totals.ValuesMax != 3 {
			t.Errorf("%s: %d distinct values would be limited in a span, want 3", l.Name, l.Totals.ValuesMax)
		}
		if len(l.Points) < pvBursts {
			t.Errorf("%s: %d points, want at least %d", l.Name, len(l.Points), pvBursts)
		}
	}

	// A new limit, and a limit of a unit the spans cannot answer, say so
	// instead of inventing figures.
	draft := strings.Replace(lowered, "unit: second, requests_per_unit: 15, name: fixed", "unit: hour, requests_per_unit: 15, name: fixed", 1) +
		"  - key: fresh\n    rate_limit: {unit: second, requests_per_unit: 1}\n"
	var other previewBody
	admin.MustDo(t, "POST", "/api/v1/preview", map[string]string{"domain": "pv", "yaml": draft}, 200, &other)
	if len(other.Limits) != 2 {
		t.Fatalf("%d limits previewed, want the new one and the hourly one", len(other.Limits))
	}
	for _, l := range other.Limits {
		if l.Previewable || len(l.Points) != 0 || l.Totals.WouldLimit != 0 {
			t.Errorf("%s: previewable %v, %d points, would limit %d; want not previewable and no figures", l.Name, l.Previewable, len(l.Points), l.Totals.WouldLimit)
		}
		want := map[string]string{"fresh": "no rule counts this descriptor", "fixed": "a limit per hour needs per-value counts over a whole hour"}[l.Name]
		if want == "" || !strings.Contains(l.Reason, want) {
			t.Errorf("%s: reason %q, want it to say %q", l.Name, l.Reason, want)
		}
	}
}

// runBursts sends pvBursts bursts of pvTraffic to every rule (the rules
// at once), each at the start of an even second, and returns what each
// rule rejected.
func runBursts(t *testing.T, eng *engine.Engine) map[string]int64 {
	t.Helper()
	rulesSent := []string{"fixed", "sliding", "bucket"}
	counts := make([]int64, len(rulesSent))
	for range pvBursts {
		now := time.Now()
		next := now.Truncate(2 * time.Second).Add(2*time.Second + 50*time.Millisecond)
		time.Sleep(next.Sub(now))
		var wg sync.WaitGroup
		errs := make(chan error, len(rulesSent))
		for i, rule := range rulesSent {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for v, c := range pvTraffic {
					for range c {
						res, err := eng.Check(context.Background(), engine.Request{Domain: "pv",
							Descriptors: []engine.Descriptor{{Entries: []rules.Entry{{Key: rule, Value: v}}}}})
						switch {
						case err != nil:
							errs <- err
							return
						case res.StoreErr != nil:
							errs <- fmt.Errorf("store error: %w", res.StoreErr)
							return
						case res.Code == engine.OverLimit:
							counts[i]++
						}
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		// A burst must end before the next one's window (sliding, bucket)
		// could still hold it.
		if d := time.Since(next); d > time.Second {
			t.Fatalf("a burst took %s, more than a second", d)
		}
	}
	limited := map[string]int64{}
	for i, rule := range rulesSent {
		limited[rule] = counts[i]
	}
	return limited
}

type previewBody struct {
	Limits []struct {
		Name           string `json:"name"`
		Change         string `json:"change"`
		Previewable    bool   `json:"previewable"`
		Reason         string `json:"reason"`
		Estimate       bool   `json:"estimate"`
		EstimateReason string `json:"estimate_reason"`
		Points         []struct {
			T          int64 `json:"t"`
			WouldLimit int64 `json:"would_limit"`
		} `json:"points"`
		Totals struct {
			Requests       int64 `json:"requests"`
			Limited        int64 `json:"limited"`
			WouldLimit     int64 `json:"would_limit"`
			WouldLimitLow  int64 `json:"would_limit_low"`
			WouldLimitHigh int64 `json:"would_limit_high"`
			ValuesMax      int64 `json:"values_max"`
		} `json:"totals"`
	} `json:"limits"`
}

func abs(n int64) int64 {
	if n < 0 {
		return -n
	}
	return n
}

func pvWait(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestPreviewBadInput: a draft that would not publish gets the publish's
// answer, the same status and body.
func TestPreviewBadInput(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for _, tc := range []struct{ name, yaml string }{
		{"syntax", "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: second\n"},
		{"unknown unit", "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 5}\n"},
		{"other domain", "domain: other\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n"},
		{"empty", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			y, _ := json.Marshal(tc.yaml)
			pubStatus, pubBody := f.call(t, "PUT", "/api/v1/domains/api", "editor", `{"yaml":`+string(y)+`,"message":"m","base_version":0}`)
			status, body := f.call(t, "POST", "/api/v1/preview", "editor", `{"domain":"api","yaml":`+string(y)+`}`)
			if pubStatus != 422 || status != pubStatus || body != pubBody {
				t.Errorf("preview = %d %s\npublish = %d %s\nwant the same 422", status, body, pubStatus, pubBody)
			}
		})
	}
	for _, tc := range []struct{ name, body string }{
		{"bad domain name", `{"domain":"a b","yaml":"domain: a b\n"}`},
		{"unknown field", `{"domain":"api","yaml":"","message":"m"}`},
		{"not json", `{"domain":`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if status, body := f.call(t, "POST", "/api/v1/preview", "editor", tc.body); status != 400 {
				t.Errorf("preview = %d %s, want 400", status, body)
			}
		})
	}
}
