package engine

import (
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/rules"
)

// BenchmarkPreviewRecord is what the impact preview's recorder adds to
// each counted limit of a check (stats.count calls it under its lock):
// 1,000 values of one rule, one entry each, or four entries, or one value
// of 1 KiB (hashed only up to previewIDBytes).
func BenchmarkPreviewRecord(b *testing.B) {
	for _, tc := range []struct {
		name    string
		entries func(i int) []rules.Entry
	}{
		{"1entry", func(i int) []rules.Entry { return []rules.Entry{{Key: "api_key", Value: "key-" + strconv.Itoa(i)}} }},
		{"4entries", func(i int) []rules.Entry {
			return []rules.Entry{{Key: "a", Value: "x"}, {Key: "b", Value: "y"}, {Key: "c", Value: "z"}, {Key: "api_key", Value: "key-" + strconv.Itoa(i)}}
		}},
		{"1KiBvalue", func(i int) []rules.Entry {
			v := make([]byte, 1024)
			for j := range v {
				v[j] = 'v'
			}
			return []rules.Entry{{Key: "api_key", Value: strconv.Itoa(i) + string(v)}}
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			values := make([][]rules.Entry, 1000)
			for i := range values {
				values[i] = tc.entries(i)
			}
			var st stats
			key := [2]string{"api", "per-key"}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				now := time.Now().Unix()
				st.mu.Lock()
				st.pv.recordEntries(key, now, values[i%len(values)], i%10 == 0)
				st.mu.Unlock()
				i++
			}
		})
	}
}
