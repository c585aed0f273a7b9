package store_test

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/rules/wire"
)

// TestRecordQuotaSaturates: usage sums stop at bigint's largest value
// instead of overflowing it, so that no batch, however large its hits, makes
// the row unwritable for every later batch of every node (the console also
// refuses hits above a quota's limit; this is the store's own bound).
func TestRecordQuotaSaturates(t *testing.T) {
	t.Parallel()
	st, _ := open(t)
	ctx := context.Background()
	start := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	batch := func(hits ...int64) *wire.Quota {
		q := &wire.Quota{Type: wire.TypeQuota, Epoch: "e", Seq: 1}
		for _, h := range hits {
			q.Usage = append(q.Usage, wire.QuotaUsage{Domain: "bill", Rule: "monthly", Unit: "month", Value: "alice",
				Start: start.Unix(), Hits: h, Limit: 100})
		}
		return q
	}
	used := func() int64 {
		t.Helper()
		rows, err := st.ListQuotaUsage(ctx, store.QuotaFilter{Domain: "bill", Unit: rules.Month, Start: start, Limit: 10})
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) != 1 {
			t.Fatalf("%d rows, want 1", len(rows))
		}
		return rows[0].Used
	}
	for i, q := range []*wire.Quota{
		batch(math.MaxInt64 - 10),
		batch(math.MaxInt64),                // over bigint once added
		batch(5),                            // a later batch still applies
		batch(math.MaxInt64, math.MaxInt64), // merged within one batch
	} {
		// A node each: every batch is the first of its node.
		if _, err := st.RecordQuota(ctx, fmt.Sprintf("n%d", i), q); err != nil {
			t.Fatalf("batch %d: %v", i, err)
		}
		if i > 0 {
			if got := used(); got != math.MaxInt64 {
				t.Fatalf("after batch %d used %d, want %d", i, got, int64(math.MaxInt64))
			}
		}
	}
}
