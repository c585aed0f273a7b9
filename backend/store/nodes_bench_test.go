package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/internal/testenv"
)

// BenchmarkNodesAcks writes the registry rows of 10,000 connected nodes
// that each acked a new version, as the hub does after a publish, with
// SaveNodes (save) or UpdateNodes (update), and reports the CPU Postgres
// spent per row (when it runs on this machine) beside the time per op (all
// 10,000 rows).
func BenchmarkNodesAcks(b *testing.B) {
	st, err := store.Open(context.Background(), testenv.PostgresURL(b))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	ctx := context.Background()
	const n = 10000
	since := time.Now().UTC()
	nodes := make([]store.Node, n)
	for i := range nodes {
		nodes[i] = store.Node{ID: fmt.Sprintf("bench-save-%05d", i), Status: store.NodeConnected,
			Labels: map[string]string{"zone": "a", "pool": "web"}, Build: "bench", Address: "10.0.0.1:5000",
			Protocol: 1, ConnectedSince: &since, LastSeen: since, Console: "bench", Session: fmt.Sprintf("s%d", i),
			Rates: &store.NodeRates{At: since, Decisions: 1000, Allowed: 900, Limited: 100}}
	}
	if err := st.SaveNodes(ctx, nodes, staleAfter); err != nil {
		b.Fatal(err)
	}
	version := int64(0)
	for _, path := range []struct {
		name  string
		write func() error
	}{
		{"save", func() error { return st.SaveNodes(ctx, nodes, staleAfter) }},
		{"update", func() error {
			rest, err := st.UpdateNodes(ctx, nodes)
			if err == nil && len(rest) > 0 {
				err = fmt.Errorf("%d rows not updated", len(rest))
			}
			return err
		}},
	} {
		b.Run(path.name, func(b *testing.B) {
			p0 := testenv.PostgresCPU()
			for range b.N {
				version++
				now := time.Now().UTC()
				for j := range nodes {
					nodes[j].AppliedVersion, nodes[j].LastSeen = version, now
				}
				if err := path.write(); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64((testenv.PostgresCPU()-p0).Microseconds())/float64(b.N*n), "postgres-cpu-µs/row")
		})
	}
}
