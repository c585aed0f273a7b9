package stats

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/crypto/bcrypt"

	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules/wire"
)

// fakeClock is a time source the test moves.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

// newStore returns a store on a fresh database with domains "api" and
// "web" published.
func newStore(t testing.TB) *store.Store {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, testenv.PostgresURL(t), store.PasswordCost(bcrypt.MinCost)) // the dummy hash at test speed
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	for _, d := range []string{"api", "web"} {
		yaml := fmt.Sprintf("domain: %s\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n", d)
		if _, err := st.Publish(ctx, store.Change{Domain: d, YAML: yaml, Message: "m", Actor: store.Actor{Name: "test"}}); err != nil {
			t.Fatal(err)
		}
	}
	return st
}

// newAggregator returns an aggregator on st whose clock is clk, with the
// settings and domains loaded.
func newAggregator(t *testing.T, st *store.Store, replica string, clk *fakeClock) *Aggregator {
	t.Helper()
	a := New(Config{Store: st, Replica: replica})
	a.now = clk.now
	if err := a.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	return a
}

func report(rules ...wire.RuleStats) *wire.Stats {
	return &wire.Stats{Type: wire.TypeStats, IntervalMS: 1000, Rules: rules}
}

func TestReplicasAnswerForTheFleet(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := newStore(t)
	t0 := time.Now().Truncate(time.Minute).Add(-2 * time.Minute)
	clk := &fakeClock{t: t0}
	a, b := newAggregator(t, st, "a", clk), newAggregator(t, st, "b", clk)

	// Each replica's node reports over 70 s; both replicas exchange.
	var sent store.Counts
	perSecond := make(map[int64]store.Counts)
	for s := range 70 {
		at := t0.Add(time.Duration(s)*time.Second + 300*time.Millisecond)
		clk.set(at)
		ra := wire.RuleStats{Domain: "api", Rule: "per-key", Allowed: int64(s), Limited: 2, ShadowLimited: 1,
			TopLimited: []wire.ValueCount{{Value: "hot", Count: 2}}}
		rb := wire.RuleStats{Domain: "api", Rule: "per-key", Allowed: 3, Limited: int64(s % 4), StoreErrors: 1,
			TopLimited: []wire.ValueCount{{Value: "hot", Count: int64(s % 4)}}}
		if err := a.Ingest(report(ra), at); err != nil {
			t.Fatal(err)
		}
		if err := b.Ingest(report(rb), at); err != nil {
			t.Fatal(err)
		}
		c := store.Counts{Allowed: ra.Allowed + rb.Allowed, Limited: ra.Limited + rb.Limited, ShadowLimited: 1, StoreErrors: 1}
		sent.Add(c)
		perSecond[at.Unix()] = c
		clk.set(at.Add(time.Second))
		for _, x := range []*Aggregator{a, b} {
			if err := x.exchange(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	// One more round: the last second is closed only now.
	for _, x := range []*Aggregator{a, b} {
		if err := x.exchange(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, x := range []*Aggregator{a, b} {
		got, err := x.Totals(ctx, Query{Domain: "api", From: t0, To: clk.now().Add(time.Second)})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 || got[0].Counts != sent {
			t.Errorf("replica %s totals = %+v, want %+v", x.replica, got, sent)
		}
		v, err := x.Live(ctx, "api", false)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range v.Rules[0].Points {
			if p.Counts != perSecond[p.T] {
				t.Fatalf("replica %s second %d = %+v, want %+v", x.replica, p.T, p.Counts, perSecond[p.T])
			}
		}
		if top := v.Rules[0].TopLimited; len(top) != 1 || top[0].Value != "hot" {
			t.Errorf("replica %s top = %+v, want hot", x.replica, top)
		}
	}

	// Rollups: the first minute closed rollupDelay after it ended, and both
	// replicas wrote their part of it; it equals the sum of its seconds.
	for _, x := range []*Aggregator{a, b} {
		if err := x.flush(ctx, false); err != nil {
			t.Fatal(err)
		}
	}
	var minute store.Counts
	for t, c := range perSecond {
		if t < t0.Add(time.Minute).Unix() {
			minute.Add(c)
		}
	}
	rows, err := st.MinuteTotals(ctx, store.StatsQuery{Domain: "api", From: t0, To: t0.Add(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].Counts != minute {
		t.Errorf("rollup of the first minute = %+v, want %+v", rows, minute)
	}
	// A replica that starts now loads the window from the frames.
	c := newAggregator(t, st, "c", clk) // Load reads the frames
	got, err := c.Totals(ctx, Query{Domain: "api", From: t0, To: clk.now().Add(time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Counts != sent {
		t.Errorf("new replica totals = %+v, want %+v", got, sent)
	}
}

// TestLateFrameCountedOnce: a frame written late (a replica that could not
// write for minutes) counts an old second but is listed as new; it must be
// read once, not again once its second is old.
func TestLateFrameCountedOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := newStore(t)
	clk := &fakeClock{t: time.Now()}
	b := newAggregator(t, st, "b", clk)
	old := clk.now().Add(-5 * time.Minute).Unix()
	if err := st.WriteFrames(ctx, "a", []store.Frame{{T: old, Rules: []store.FrameRule{{Domain: "api", Rule: "r", L: 7}}}}); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := b.exchange(ctx); err != nil {
			t.Fatal(err)
		}
	}
	got, err := b.Totals(ctx, Query{Domain: "api", From: clk.now().Add(-10 * time.Minute), To: clk.now()})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Limited != 7 {
		t.Errorf("totals = %+v, want the late frame's 7 limited once", got)
	}
}

func TestBadReportsRefusedAndCounted(t *testing.T) {
	t.Parallel()
	st := newStore(t)
	clk := &fakeClock{t: time.Now()}
	a := newAggregator(t, st, "a", clk)
	many := make([]wire.RuleStats, wire.MaxStatsRules+1)
	for i := range many {
		many[i] = wire.RuleStats{Domain: "api", Rule: fmt.Sprint(i)}
	}
	tests := []struct {
		name   string
		rules  []wire.RuleStats
		reason string
	}{
		{"negative count", []wire.RuleStats{{Domain: "api", Rule: "r", Allowed: -1}}, "invalid"},
		{"huge count", []wire.RuleStats{{Domain: "api", Rule: "r", Limited: MaxCount + 1}}, "invalid"},
		{"too many rules", many, "invalid"},
		{"too many values", []wire.RuleStats{{Domain: "api", Rule: "r", Limited: 20, TopLimited: make([]wire.ValueCount, wire.MaxTopValues+1)}}, "invalid"},
		{"value counted over limited", []wire.RuleStats{{Domain: "api", Rule: "r", Limited: 1, TopLimited: []wire.ValueCount{{Value: "v", Count: 2}}}}, "invalid"},
		{"unknown domain", []wire.RuleStats{{Domain: "api", Rule: "r", Allowed: 1}, {Domain: "nope", Rule: "r", Allowed: 1}}, "unknown_domain"},
		{"empty rule", []wire.RuleStats{{Domain: "api", Allowed: 1}}, "invalid"},
		{"NUL in a rule", []wire.RuleStats{{Domain: "api", Rule: "a\x00b", Allowed: 1}}, "invalid"},
		{"invalid UTF-8 value", []wire.RuleStats{{Domain: "api", Rule: "r", Limited: 1, TopLimited: []wire.ValueCount{{Value: "\xff", Count: 1}}}}, "invalid"},
		{"long rule", []wire.RuleStats{{Domain: "api", Rule: strings.Repeat("r", MaxNameBytes+1)}}, "invalid"},
		{"rule twice", []wire.RuleStats{{Domain: "api", Rule: "r", Allowed: 1}, {Domain: "api", Rule: "r", Allowed: 1}}, "invalid"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := testutil.ToFloat64(a.refused.WithLabelValues(tt.reason))
			if err := a.Ingest(report(tt.rules...), clk.now()); err == nil {
				t.Fatal("report accepted")
			}
			if got := testutil.ToFloat64(a.refused.WithLabelValues(tt.reason)) - before; got != 1 {
				t.Errorf("refused{reason=%q} rose by %v, want 1", tt.reason, got)
			}
		})
	}
	got, err := a.Totals(context.Background(), Query{From: clk.now().Add(-time.Minute), To: clk.now().Add(time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 0 {
		t.Errorf("refused reports were aggregated: %+v", got)
	}
	if err := a.Ingest(report(wire.RuleStats{Domain: "api", Rule: "r", Allowed: 1}), clk.now()); err != nil {
		t.Errorf("a good report after bad ones: %v", err)
	}
}

func TestMaskedValues(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := newStore(t)
	clk := &fakeClock{t: time.Now()}
	a := newAggregator(t, st, "a", clk)
	cfg, err := st.UpdateAlertConfig(ctx, store.AlertConfig{Domains: map[string]store.DomainStatsSettings{"api": {MaskValues: true}}}, store.Actor{Name: "test"})
	if err != nil {
		t.Fatal(err)
	}
	a.SetConfig(cfg)
	for _, d := range []string{"api", "web"} {
		r := wire.RuleStats{Domain: d, Rule: "r", Limited: 3, TopLimited: []wire.ValueCount{{Value: "10.0.0.1", Count: 3}}}
		if err := a.Ingest(report(r), clk.now().Add(-2*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	values := func(masked bool) map[string]string {
		v, err := a.Live(ctx, "", masked)
		if err != nil {
			t.Fatal(err)
		}
		out := make(map[string]string)
		for _, r := range v.Rules {
			out[r.Domain] = r.TopLimited[0].Value
		}
		return out
	}
	viewer, editor := values(true), values(false)
	if !strings.HasPrefix(viewer["api"], "masked:") || viewer["web"] != "10.0.0.1" {
		t.Errorf("viewer sees %v, want api masked and web plain", viewer)
	}
	if editor["api"] != "10.0.0.1" {
		t.Errorf("editor sees %v, want the values", editor)
	}
	// The mask is stable: another replica (same key in Postgres) shows the
	// same form.
	b := newAggregator(t, st, "b", clk)
	if got := mask(b.maskKey, "api", "10.0.0.1"); got != viewer["api"] {
		t.Errorf("replica b masks as %q, replica a as %q", got, viewer["api"])
	}
}

func TestSlowStreamDropped(t *testing.T) {
	t.Parallel()
	st := newStore(t)
	clk := &fakeClock{t: time.Now()}
	a := newAggregator(t, st, "a", clk)
	slow := a.Subscribe("", true)
	defer slow.Close()
	for i := range subscriptionQueue + 1 {
		if err := a.Ingest(report(wire.RuleStats{Domain: "api", Rule: "r", Allowed: 1}), clk.now()); err != nil {
			t.Fatal(err)
		}
		a.tick(clk.now().Unix())
		if i < subscriptionQueue {
			select {
			case <-slow.Dropped():
				t.Fatalf("dropped after %d messages", i+1)
			default:
			}
		}
	}
	select {
	case <-slow.Dropped():
	default:
		t.Fatal("a subscriber that reads nothing was not dropped")
	}
	if n := len(slow.Messages()); n != subscriptionQueue {
		t.Errorf("%d messages queued, want the bound %d", n, subscriptionQueue)
	}
}

func TestHistoryRanges(t *testing.T) {
	t.Parallel()
	now := time.Now()
	tests := []struct {
		name string
		q    Query
		want string // "" for valid
	}{
		{"an hour at a minute", Query{From: now.Add(-time.Hour), To: now, Step: 60}, ""},
		{"30 days at an hour", Query{From: now.Add(-30 * 24 * time.Hour), To: now, Step: 3600}, ""},
		{"inverted", Query{From: now, To: now.Add(-time.Hour), Step: 60}, "must be before"},
		{"empty", Query{From: now, To: now, Step: 60}, "must be before"},
		{"enormous", Query{From: now.Add(-400 * 24 * time.Hour), To: now, Step: 86400}, "over 31 days"},
		{"too many points", Query{From: now.Add(-30 * 24 * time.Hour), To: now, Step: 60}, "choose a larger step"},
		{"step not minutes", Query{From: now.Add(-time.Hour), To: now, Step: 90}, "multiple of 60"},
		{"rule without domain", Query{Rule: "r", From: now.Add(-time.Hour), To: now, Step: 60}, "needs a domain"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.q.CheckRange(true)
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("error %v, want one saying %q", err, tt.want)
			}
		})
	}
}

func TestDeliveriesRetried(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st := newStore(t)
	var (
		mu     sync.Mutex
		calls  int
		bodies []string
	)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		calls++
		bodies = append(bodies, string(b))
		if calls <= 2 {
			http.Error(w, "busy", http.StatusServiceUnavailable)
		}
	}))
	defer hook.Close()
	cfg, err := st.UpdateAlertConfig(ctx, store.AlertConfig{Webhooks: []store.Webhook{{URL: hook.URL + "/secret-path"}}}, store.Actor{Name: "test"})
	if err != nil {
		t.Fatal(err)
	}
	a := New(Config{Store: st, PublicURL: "https://console.example"})
	a.SetConfig(cfg)
	if n, err := a.TestAlert(ctx); err != nil || n != 1 {
		t.Fatalf("TestAlert = %d, %v", n, err)
	}
	go a.deliverLoop(ctx)
	deadline := time.Now().Add(15 * time.Second)
	for {
		ds, err := st.ListDeliveries(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(ds) == 1 && ds[0].Status == store.DeliveryDelivered {
			if ds[0].Attempts != 3 {
				t.Errorf("delivered after %d attempts, want 3 (two 503s, then 200)", ds[0].Attempts)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not delivered: %+v", ds)
		}
		time.Sleep(100 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(bodies[0], `"event":"alert.test"`) || !strings.Contains(bodies[0], `"text":"Test alert from Sluice`) ||
		!strings.Contains(bodies[0], `"url":"https://console.example/traffic"`) {
		t.Errorf("body = %s", bodies[0])
	}
}
