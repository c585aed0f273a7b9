package engine_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/enforcer/limiter"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/rules/wire"
)

const quotaYAML = `domain: bill
descriptors:
  - key: key
    rate_limit: {unit: month, requests_per_unit: 5, name: monthly}
    algorithm: fixed_window
    calendar: true
  - key: day_key
    rate_limit: {unit: day, requests_per_unit: 3, name: daily}
    algorithm: fixed_window
    calendar: true
  - key: burst
    rate_limit: {unit: second, requests_per_unit: 1, name: per-second}
  - key: token
    rate_limit: {unit: month, requests_per_unit: 5, name: token-month}
`

// clock is a settable time shared by the injected Redis time and the
// engine's quota clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) set(t time.Time) { c.mu.Lock(); c.t = t; c.mu.Unlock() }

// quotaEngine returns an engine on the real test Redis whose Redis time is
// c and whose node clock is c plus skew.
func quotaEngine(t *testing.T, c *clock, skew time.Duration) *engine.Engine {
	t.Helper()
	client, err := limiter.NewClient(testenv.RedisURL(t), limiter.WithTimeout(2*time.Second), limiter.WithDialTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	r := limiter.NewRedis(client)
	r.SetClock(c.now)
	eng := engine.New(r, testenv.KeyPrefix(t), engine.WithQuotaClock(func() time.Time { return c.now().Add(skew) }))
	if err := eng.Apply(1, compile(t, quotaYAML)); err != nil {
		t.Fatal(err)
	}
	return eng
}

// usageKey names one usage entry in the tests: rule, value and period start.
func usageKey(rule, value string, start time.Time) string {
	return rule + "|" + value + "|" + start.UTC().Format(time.RFC3339)
}

// billReq is req in domain bill.
func billReq(descriptors ...[]rules.Entry) engine.Request {
	r := req(descriptors...)
	r.Domain = "bill"
	return r
}

func takeAll(eng *engine.Engine) map[string]int64 {
	got := map[string]int64{}
	for {
		usage, _, more := eng.TakeQuota(3)
		for _, u := range usage {
			got[usageKey(u.Rule, u.Value, time.Unix(u.Start, 0))] += u.Hits
		}
		if !more {
			return got
		}
	}
}

// TestQuotaAcrossMonthBoundary runs traffic on both sides of a month's end
// at injected Redis times, with the node's clock off by hours: the usage
// the engine records per value and period is what it admitted there.
func TestQuotaAcrossMonthBoundary(t *testing.T) {
	t.Parallel()
	for _, skew := range []time.Duration{0, -5 * time.Hour, 11 * time.Hour} {
		t.Run(fmt.Sprintf("node clock %+v", skew), func(t *testing.T) {
			c := &clock{t: time.Date(2026, 11, 30, 23, 59, 50, 0, time.UTC)}
			eng := quotaEngine(t, c, skew)
			admitted := map[string]int64{}
			hit := func(n int, key string, extra ...[]rules.Entry) {
				for range n {
					r := check(t, eng, billReq(append([][]rules.Entry{entry("key", key)}, extra...)...))
					if r.Code == engine.OK {
						start, _ := rules.Month.Window(c.now())
						admitted[usageKey("monthly", key, start)]++
					}
				}
			}
			nov, dec := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC), time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
			hit(7, "k1") // 5 admitted
			hit(2, "k2")
			c.set(time.Date(2026, 11, 30, 23, 59, 59, 999_999_000, time.UTC))
			hit(1, "k2")
			c.set(dec.Add(time.Microsecond))
			hit(4, "k1") // a new month: 4 admitted
			hit(9, "k2")
			// Rejected by another limit: counts nothing anywhere.
			r := check(t, eng, billReq(entry("key", "k3"), entry("burst", "b")))
			r = check(t, eng, billReq(entry("key", "k3"), entry("burst", "b")))
			if r.Code != engine.OverLimit {
				t.Fatalf("second burst check: %v, want over limit", r.Code)
			}
			admitted[usageKey("monthly", "k3", dec)]++ // the first one

			want := map[string]int64{
				usageKey("monthly", "k1", nov): 5, usageKey("monthly", "k2", nov): 3,
				usageKey("monthly", "k1", dec): 4, usageKey("monthly", "k2", dec): 5, usageKey("monthly", "k3", dec): 1,
			}
			for k, n := range want {
				if admitted[k] != n {
					t.Fatalf("admitted %s: %d, test expects %d", k, admitted[k], n)
				}
			}
			got := takeAll(eng)
			if fmt.Sprint(got) != fmt.Sprint(admitted) {
				t.Errorf("usage recorded:\n got %v\nwant %v", got, admitted)
			}
			if again := takeAll(eng); len(again) != 0 {
				t.Errorf("usage taken twice: %v", again)
			}
		})
	}
}

// TestQuotaOnlyCalendarLimits: a token bucket with unit month is a rate,
// not a quota, and records nothing; a day quota's period is the UTC day;
// hits_addend counts as sent and a peek (0) not at all.
func TestQuotaOnlyCalendarLimits(t *testing.T) {
	t.Parallel()
	c := &clock{t: time.Date(2026, 12, 6, 23, 0, 0, 0, time.UTC)}
	eng := quotaEngine(t, c, 0)
	check(t, eng, billReq(entry("token", "t1")))
	zero, two := uint64(0), uint64(2)
	r := billReq(entry("day_key", "d1"))
	r.Descriptors[0].Hits = &two
	check(t, eng, r)
	r.Descriptors[0].Hits = &zero
	check(t, eng, r)
	got := takeAll(eng)
	want := map[string]int64{usageKey("daily", "d1", time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)): 2}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("usage: got %v, want %v", got, want)
	}
}

// TestQuotaLongValuesAndBound: values over wire.MaxQuotaValueBytes stay
// distinct and within the bound; past engine.QuotaMaxEntries entries, new
// ones are dropped and counted, QuotaFull having been signalled.
func TestQuotaLongValuesAndBound(t *testing.T) {
	t.Parallel()
	eng := engine.New(limiter.NewLocal(limiter.LocalOptions{}), "")
	if err := eng.Apply(1, compile(t, strings.ReplaceAll(quotaYAML, "requests_per_unit: 5, name: monthly", "requests_per_unit: 1000, name: monthly"))); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	long := strings.Repeat("é", 300)
	for _, v := range []string{long + "a", long + "b"} {
		if _, err := eng.Check(ctx, billReq(entry("key", v))); err != nil {
			t.Fatal(err)
		}
	}
	usage, _, _ := eng.TakeQuota(0)
	if len(usage) != 2 || usage[0].Value == usage[1].Value {
		t.Fatalf("two long values: got %d entries %+v", len(usage), usage)
	}
	for _, u := range usage {
		if len(u.Value) > wire.MaxQuotaValueBytes || !strings.HasPrefix(u.Value, "éé") {
			t.Errorf("long value recorded as %q (%d bytes)", u.Value, len(u.Value))
		}
	}

	for i := range engine.QuotaMaxEntries + 10 {
		if _, err := eng.Check(ctx, billReq(entry("key", fmt.Sprint("v", i)))); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-eng.QuotaFull():
	default:
		t.Error("QuotaFull not signalled past QuotaSoftEntries")
	}
	usage, dropped, more := eng.TakeQuota(0)
	if len(usage) != engine.QuotaMaxEntries || dropped != 10 || more {
		t.Errorf("past the bound: %d entries, %d dropped, more %v; want %d, 10, false", len(usage), dropped, more, engine.QuotaMaxEntries)
	}
}

// TestQuotaAndStatsNameValuesAlike: a descriptor of several entries, longer
// than wire.MaxValueBytes, has one name in quota usage and in the top
// limited values, and two such descriptors that differ only past the bound
// stay distinct in both.
func TestQuotaAndStatsNameValuesAlike(t *testing.T) {
	t.Parallel()
	eng := engine.New(limiter.NewLocal(limiter.LocalOptions{}), "")
	const yaml = `domain: bill
descriptors:
  - key: account
    descriptors:
      - key: user
        rate_limit: {unit: month, requests_per_unit: 1, name: monthly}
        algorithm: fixed_window
        calendar: true
`
	if err := eng.Apply(1, compile(t, yaml)); err != nil {
		t.Fatal(err)
	}
	account := strings.Repeat("a", wire.MaxValueBytes)
	for _, user := range []string{"u1", "u2"} {
		r := billReq([]rules.Entry{{Key: "account", Value: account}, {Key: "user", Value: user}})
		for range 2 { // the first admitted, the second limited
			check(t, eng, r)
		}
	}
	usage, _, _ := eng.TakeQuota(0)
	quota := map[string]bool{}
	for _, u := range usage {
		quota[u.Value] = true
	}
	limited := map[string]bool{}
	for _, r := range eng.TakeStats() {
		for _, v := range r.TopLimited {
			limited[v.Value] = true
		}
	}
	if len(quota) != 2 || fmt.Sprint(quota) != fmt.Sprint(limited) {
		t.Errorf("quota usage values %v, top limited values %v; want the same two", quota, limited)
	}
}
