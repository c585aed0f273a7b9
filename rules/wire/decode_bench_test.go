package wire_test

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/sluicehq/sluice/rules/wire"
)

// BenchmarkDecodeStats decodes a stats report of 100 rules, each with a
// top limited value and a limited value: what a busy node sends the
// console every second.
func BenchmarkDecodeStats(b *testing.B) {
	s := wire.Stats{Type: wire.TypeStats, IntervalMS: 1000}
	for i := range 100 {
		top := []wire.ValueCount{{Value: fmt.Sprintf("user-%d", i), Count: 100}}
		s.Rules = append(s.Rules, wire.RuleStats{Domain: "api", Rule: fmt.Sprintf("k%d", i), Allowed: 900, Limited: 100,
			TopLimited: top, Values: top})
	}
	data, err := json.Marshal(s)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := wire.Decode(data); err != nil {
			b.Fatal(err)
		}
	}
}
