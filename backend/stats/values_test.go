package stats

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/rules/wire"
)

// valuesOf is the named values of a report's rule and their sum.
func valuesOf(counts map[string]int64) ([]wire.ValueCount, int64) {
	var vs []wire.ValueCount
	sum := int64(0)
	for v, n := range counts {
		vs = append(vs, wire.ValueCount{Value: v, Count: n})
		sum += n
	}
	return vs, sum
}

// pointOf returns value's point of rule in minute m of h.
func pointOf(h ValueHistory, rule string, m time.Time) (ValuePoint, bool) {
	for _, r := range h.Rules {
		if r.Rule != rule {
			continue
		}
		for _, p := range r.Points {
			if p.T == m.Unix() {
				return p, true
			}
		}
	}
	return ValuePoint{}, false
}

func TestValueHistory(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := newStore(t)
	t0 := time.Now().Truncate(time.Minute).Add(-3 * time.Minute)
	clk := &fakeClock{t: t0}
	a, b := newAggregator(t, st, "a", clk), newAggregator(t, st, "b", clk)

	// per-key, on replica a alone: 1,500 distinct values over ten
	// reports; value i is limited i%7+1 times in each report, so the
	// values at the bottom of the minute are beyond ValuesPerMinute.
	// per-ip: "hot" limited on both replicas, every request named.
	// per-user: b's node left 3 limited requests unnamed.
	want := map[string]int64{}
	for s := range 10 {
		at := t0.Add(time.Duration(s)*time.Second + 100*time.Millisecond)
		clk.set(at)
		counts := map[string]int64{}
		for i := range 1500 {
			if i%10 == s { // each value in one report of the ten
				v := fmt.Sprintf("customer-%04d", i)
				counts[v] = int64(i%7 + 1)
				want[v] += int64(i%7 + 1)
			}
		}
		vs, sum := valuesOf(counts)
		if err := a.Ingest(report(
			wire.RuleStats{Domain: "api", Rule: "per-key", Limited: sum, Values: vs},
			wire.RuleStats{Domain: "api", Rule: "per-ip", Limited: 5, Values: []wire.ValueCount{{Value: "hot", Count: 5}}},
		), at); err != nil {
			t.Fatal(err)
		}
		if err := b.Ingest(report(
			wire.RuleStats{Domain: "api", Rule: "per-ip", Limited: 7, Values: []wire.ValueCount{{Value: "hot", Count: 7}}},
			wire.RuleStats{Domain: "api", Rule: "per-user", Limited: 10, Values: []wire.ValueCount{{Value: "u1", Count: 7}}},
		), at); err != nil {
			t.Fatal(err)
		}
	}
	clk.set(t0.Add(time.Minute + rollupDelay + time.Second))
	for _, x := range []*Aggregator{a, b} {
		if err := x.flush(ctx, false); err != nil {
			t.Fatal(err)
		}
	}

	history := func(value string) ValueHistory {
		t.Helper()
		h, err := b.ValueHistory(ctx, "api", value, t0.Add(-time.Hour), clk.now())
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	// The most limited values of per-key are exact; the least are beyond
	// the 1,000 written and show as lower bounds.
	exact, beyond := 0, 0
	for v, n := range want {
		p, ok := pointOf(history(v), "per-key", t0)
		switch {
		case !ok:
			t.Fatalf("%s: no point in the minute", v)
		case p.Complete && p.Limited == n:
			exact++
		case p.Complete:
			t.Fatalf("%s: %d complete, want %d", v, p.Limited, n)
		case p.Limited != 0:
			t.Fatalf("%s: %d, a lower bound; a value beyond the bound is not written at all", v, p.Limited)
		default:
			beyond++
		}
	}
	if exact != ValuesPerMinute || beyond != len(want)-ValuesPerMinute {
		t.Errorf("%d exact and %d beyond, want %d and %d", exact, beyond, ValuesPerMinute, len(want)-ValuesPerMinute)
	}
	h := history("hot")
	if p, _ := pointOf(h, "per-ip", t0); p != (ValuePoint{T: t0.Unix(), Limited: 120, Complete: true}) {
		t.Errorf("hot under per-ip = %+v, want 120 complete (both replicas)", p)
	}
	for _, r := range h.Rules {
		if r.Rule == "per-key" && r.Complete {
			t.Errorf("hot under per-key is complete; it may be among the unwritten values")
		}
	}
	if p, _ := pointOf(history("u1"), "per-user", t0); p.Limited != 70 || p.Complete {
		t.Errorf("u1 under per-user = %+v, want 70, a lower bound (30 unnamed)", p)
	}
	if h := history("nobody"); len(h.Rules) != 2 || h.Rules[0].Rule != "per-key" || h.Rules[1].Rule != "per-user" ||
		h.Rules[0].Complete || h.Rules[1].Complete || h.Rules[0].Points[0].Limited != 0 {
		t.Errorf("an unknown value = %+v, want the lossy rules per-key and per-user, 0 and incomplete", h.Rules)
	}
}

// TestValueSketchEvicts: a rule limiting more distinct values in a minute
// than a sketch holds keeps the values it tracked from their first
// request exact, and a value that came in later a lower bound.
func TestValueSketchEvicts(t *testing.T) {
	t.Parallel()
	var s valueSketch
	s.add("first", 100, true)
	for i := range sketchValues + 500 {
		s.add(fmt.Sprintf("v%d", i), 1, true)
	}
	s.add("late", 50, true)
	s.add("late", 50, true)
	limited := int64(100 + sketchValues + 500 + 100)
	w := s.write(0, store.RuleKey{Domain: "api", Rule: "r"}, limited)
	if len(w.Values) != ValuesPerMinute || w.Untracked <= 0 {
		t.Fatalf("%d values, untracked %d: want %d and some untracked", len(w.Values), w.Untracked, ValuesPerMinute)
	}
	byValue := map[string]store.ValueLimited{}
	for _, v := range w.Values {
		byValue[v.Value] = v
	}
	if v := byValue["first"]; v.Limited != 100 || !v.Sure {
		t.Errorf("first = %+v, want 100, sure", v)
	}
	if v := byValue["late"]; v.Limited > 100 || v.Limited < 99 || v.Sure {
		t.Errorf("late = %+v, want a lower bound of 100, not sure", v)
	}
}

// BenchmarkValueSketch reports what one rule-minute's sketch holds when
// full (sketchValues values of 16 bytes) in bytes, and what writing it
// costs.
func BenchmarkValueSketch(b *testing.B) {
	var bytes float64
	for b.Loop() {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		s := new(valueSketch)
		for i := range sketchValues {
			s.add(fmt.Sprintf("customer-%07d", i), int64(i%9+1), true)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		bytes = float64(after.HeapAlloc) - float64(before.HeapAlloc)
		_ = s.write(0, store.RuleKey{Domain: "api", Rule: "r"}, 1<<40)
	}
	b.ReportMetric(bytes, "B/rule-minute")
	b.ReportMetric(bytes/sketchValues, "B/value")
}

// BenchmarkIngestValues is what naming values costs the console: one op is
// one report of one rule naming 1,000 values (of 3,000 seen in the
// minute), ingested whole; compare with the same report without values.
func BenchmarkIngestValues(b *testing.B) {
	st := newStore(b)
	for _, named := range []bool{true, false} {
		name := "values=1000"
		if !named {
			name = "values=0"
		}
		b.Run(name, func(b *testing.B) {
			a := New(Config{Store: st})
			now := time.Now()
			a.now = func() time.Time { return now }
			a.domains["api"] = true
			reports := make([]*wire.Stats, 3)
			for i := range reports {
				r := wire.RuleStats{Domain: "api", Rule: "per-key", Limited: 2000}
				if named {
					for j := range 1000 {
						r.Values = append(r.Values, wire.ValueCount{Value: fmt.Sprintf("customer-%07d", i*1000+j), Count: 2})
					}
				}
				reports[i] = report(r)
			}
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if err := a.Ingest(reports[i%3], now); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestValueSketchBounds: over random skewed streams with more distinct
// values than a sketch holds, every written figure is at most the truth,
// a sure one is the truth, the untracked count is what the written ones
// leave out, and a value limited more than 1/sketchValues of the minute's
// requests is written.
func TestValueSketchBounds(t *testing.T) {
	t.Parallel()
	for seed := range 10 {
		rng := rand.New(rand.NewPCG(uint64(seed), 7))
		zipf := rand.NewZipf(rng, 1.1, 2, 3*sketchValues)
		var s valueSketch
		truth := map[string]int64{}
		total := int64(0)
		for range 40000 {
			v := fmt.Sprintf("v%d", zipf.Uint64())
			w := int64(1 + rng.IntN(3))
			s.add(v, w, true)
			truth[v] += w
			total += w
		}
		w := s.write(0, store.RuleKey{Domain: "api", Rule: "r"}, total)
		kept := int64(0)
		written := map[string]bool{}
		for _, v := range w.Values {
			written[v.Value] = true
			kept += v.Limited
			switch {
			case v.Limited > truth[v.Value] || v.Limited <= 0:
				t.Fatalf("seed %d: %q written %d, truth %d", seed, v.Value, v.Limited, truth[v.Value])
			case v.Sure && v.Limited != truth[v.Value]:
				t.Fatalf("seed %d: %q sure at %d, truth %d", seed, v.Value, v.Limited, truth[v.Value])
			}
		}
		if w.Untracked != total-kept {
			t.Fatalf("seed %d: untracked %d, want %d", seed, w.Untracked, total-kept)
		}
		// The ValuesPerMinute heaviest are far above total/sketchValues
		// here; each of those must be written.
		for v, n := range truth {
			if n > total/sketchValues*4 && !written[v] {
				t.Errorf("seed %d: %q limited %d of %d times, not written", seed, v, n, total)
			}
		}
	}
}
