package engine

import (
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/rules"
)

// BenchmarkQuotaCount is what recording a quota's admitted hit costs a
// check: the period estimate and the map update, for 1,000 values of one
// monthly quota, 8 parallel callers on one recorder.
func BenchmarkQuotaCount(b *testing.B) {
	l := &rules.Limit{Domain: "bill", Name: "monthly", Unit: rules.Month, RequestsPerUnit: 1000, Algorithm: rules.FixedWindow,
		Calendar: true, Shards: 1, Path: []rules.Level{{Key: "key"}}}
	reqs := make([]Request, 1000)
	for i := range reqs {
		reqs[i] = Request{Domain: "bill", Descriptors: []Descriptor{{Entries: []rules.Entry{{Key: "key", Value: "v" + strconv.Itoa(i)}}}}}
	}
	res := Result{Code: OK, Statuses: []Status{{Code: OK, Limit: l, Remaining: 10, ResetAfter: 200 * time.Hour}}}
	q := &quotas{full: make(chan struct{}, 1)}
	var n atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(8)
	b.RunParallel(func(pb *testing.PB) {
		r := res
		for pb.Next() {
			q.count(&reqs[int(n.Add(1))%len(reqs)], &r)
		}
	})
	if want := min(b.N, len(reqs)); len(q.m) != want {
		b.Fatalf("%d entries, want %d", len(q.m), want)
	}
}
