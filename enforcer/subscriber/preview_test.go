package subscriber_test

import (
	"encoding/json"
	"testing"

	"github.com/sluicehq/sluice/enforcer/subscriber"
	"github.com/sluicehq/sluice/rules/wire"
)

// TestEncodeStatsPreview: the impact preview's spans travel with the stats
// while they fit; a report too big with them goes without them (after the
// top values), never over the limit and never with fewer rules first.
func TestEncodeStatsPreview(t *testing.T) {
	t.Parallel()
	full := make(wire.Histogram, 0, 400)
	for b := int64(1); b <= 400; b++ {
		lo, _ := wire.BucketBounds(int(b))
		full = append(full, wire.HistBucket{b, 1, lo})
	}
	_, sum := full.Entries()
	spans := func(n int) []wire.RulePreview {
		ps := make([]wire.RulePreview, n)
		for i := range ps {
			ps[i] = wire.RulePreview{Domain: "api", Rule: "r", T: 60, SpanS: 60, Requests: sum, Second: full, Peak: full, Span: full}
		}
		return ps
	}
	rules := []wire.RuleStats{{Domain: "api", Rule: "r", Allowed: 1}}
	for _, tt := range []struct {
		name      string
		spans     int
		wantSpans int
	}{
		{"fits", 3, 3},
		{"too big", 200, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			data, err := subscriber.EncodeStats(wire.Stats{Type: wire.TypeStats, IntervalMS: 1000, Rules: rules, Preview: spans(tt.spans)})
			if err != nil {
				t.Fatal(err)
			}
			if len(data) > wire.MaxNodeMessageBytes {
				t.Fatalf("%d bytes, over the %d limit", len(data), wire.MaxNodeMessageBytes)
			}
			var got wire.Stats
			if err := json.Unmarshal(data, &got); err != nil {
				t.Fatal(err)
			}
			if err := got.Validate(); err != nil {
				t.Fatalf("console would refuse it: %v", err)
			}
			if len(got.Preview) != tt.wantSpans || len(got.Rules) != 1 {
				t.Errorf("%d spans and %d rules, want %d and 1", len(got.Preview), len(got.Rules), tt.wantSpans)
			}
		})
	}
}
