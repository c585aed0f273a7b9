package stats

import (
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/sluicehq/sluice/backend/store"
)

// run feeds values (one a second) to a detector with the default settings
// and returns the events as "start@t" and "end@t".
func run(values []float64) []string {
	d := &detector{warmup: int(DefaultSpikeWarmup.Seconds()), rules: make(map[store.RuleKey]*ruleState)}
	k := store.RuleKey{Domain: "api", Rule: "r"}
	var out []string
	for t, v := range values {
		if ev := d.observe(k, v, defaultSpike, int64(t)); ev != nil {
			kind := "end"
			if ev.start {
				kind = "start"
			}
			out = append(out, kind+"@"+strconv.FormatInt(ev.t, 10))
		}
	}
	return out
}

// noisy returns n seconds of 429s around mean, ±jitter (uniform, seeded).
func noisy(r *rand.Rand, n int, mean, jitter float64) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = max(0, mean+jitter*(2*r.Float64()-1))
	}
	return out
}

func TestSpikeDetection(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	steady := func(n int, mean float64) []float64 { return noisy(r, n, mean, mean/2) }
	cat := func(parts ...[]float64) []float64 {
		var out []float64
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	tests := []struct {
		name   string
		values []float64
		want   string
	}{
		{"steady limiting never fires", steady(1800, 20), ""},
		{"steady limiting from a cold start", cat(make([]float64, 5), steady(1800, 40)), ""},
		{"under the floor never fires", cat(steady(120, 0.5), steady(60, 4)), ""},
		{"a 10x step fires once and ends", cat(steady(120, 10), steady(20, 100), steady(120, 10)), "start@120 end@140"},
		{"a one-second blip does not fire", cat(steady(120, 10), []float64{500}, steady(60, 10)), ""},
		{"a step from nothing fires", cat(make([]float64, 120), steady(10, 50), make([]float64, 60)), "start@120 end@130"},
		{"two steps, two spikes", cat(steady(120, 10), steady(10, 200), steady(60, 10), steady(10, 200), steady(30, 10)), "start@120 end@130 start@190 end@200"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ""
			for i, e := range run(tt.values) {
				if i > 0 {
					got += " "
				}
				got += e
			}
			if got != tt.want {
				t.Errorf("events = %q, want %q", got, tt.want)
			}
		})
	}
}
