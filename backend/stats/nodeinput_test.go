package stats

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/rules/wire"
)

// FuzzIngestCleaned: a stats report that wire.Stats.Clean leaves (as the
// hub does with every node's report) is never refused by Ingest, whatever
// the node sent: no row of it can make the aggregator refuse the others.
func FuzzIngestCleaned(f *testing.F) {
	for _, s := range []string{
		`{"type":"stats","interval_ms":1000,"rules":[{"domain":"api","rule":"k","allowed":200,"limited":13,"top_limited":[{"value":"\u0000evil","count":13}]}]}`,
		`{"type":"stats","interval_ms":1000,"rules":[{"domain":"api","rule":"k","limited":2,"top_limited":[{"value":"\udfff","count":2},{"value":"\udfff","count":1}]},{"domain":"api","rule":"override","limited":1}]}`,
		`{"type":"stats","interval_ms":1000,"rules":[{"domain":"api","rule":"made-up","allowed":1},{"domain":"api","rule":"k","allowed":1},{"domain":"api","rule":"k","allowed":1}]}`,
		`{"type":"stats","interval_ms":1000,"preview":[{"domain":"api","rule":"k","t":1000,"span_s":60,"requests":3,"limited":1,"sec":[[1,3,3]]}]}`,
	} {
		f.Add([]byte(s))
	}
	domains := []wire.DomainConfig{{Name: "api", YAML: "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n"}}
	set, err := wire.Compile(&wire.Snapshot{Version: 1, Checksum: wire.Checksum(domains), Domains: domains})
	if err != nil {
		f.Fatal(err)
	}
	cat := wire.NewCatalog(set)
	a := New(Config{})
	a.AddDomains("api")
	f.Fuzz(func(t *testing.T, data []byte) {
		msg, err := wire.Decode(data)
		m, ok := msg.(*wire.Stats)
		if err != nil || !ok {
			return
		}
		if _, err := m.Clean(cat); err != nil {
			return
		}
		var re *RefusedError
		if err := a.Ingest(m, time.Now()); errors.As(err, &re) {
			t.Fatalf("cleaned report refused: %v", err)
		}
	})
}

// TestSeriesOfGoneRulesGo: a rule no node reports any more (its rule was
// removed, or its node stopped) holds no memory once its window is empty:
// the per-rule table only holds rules with counts in the last 15 minutes.
func TestSeriesOfGoneRulesGo(t *testing.T) {
	t.Parallel()
	st := newStore(t)
	t0 := time.Now().Truncate(time.Minute)
	clk := &fakeClock{t: t0}
	a := newAggregator(t, st, "a", clk)
	if err := a.Ingest(report(wire.RuleStats{Domain: "api", Rule: "gone", Limited: 1}, wire.RuleStats{Domain: "api", Rule: "kept", Allowed: 1}), t0); err != nil {
		t.Fatal(err)
	}
	later := t0.Add((WindowSeconds - 10) * time.Second)
	clk.set(later)
	if err := a.Ingest(report(wire.RuleStats{Domain: "api", Rule: "kept", Allowed: 1}), later); err != nil {
		t.Fatal(err)
	}
	clk.set(t0.Add((WindowSeconds + 1) * time.Second))
	a.prune(context.Background())
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.series[store.RuleKey{Domain: "api", Rule: "gone"}]; ok || len(a.series) != 1 {
		t.Errorf("series after the window: %d (gone held: %v), want only the rule still reported", len(a.series), ok)
	}
}
