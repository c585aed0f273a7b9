package subscriber

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/rules/wire"
)

// TestQuotaBatchesStayWithinTheMessageBound: usage with long domain and
// rule names goes out in batches of at most wire.MaxNodeMessageBytes and
// wire.MaxQuotaUsage entries, in order of seq, each entry exactly once, a
// batch pending until its ack.
func TestQuotaBatchesStayWithinTheMessageBound(t *testing.T) {
	t.Parallel()
	const total = 5000
	var all []wire.QuotaUsage
	long := strings.Repeat("r", 1000)
	for i := range total {
		all = append(all, wire.QuotaUsage{Domain: long, Rule: long, Unit: "month", Value: "v" + strconv.Itoa(i), Start: 1796083200, Hits: 1, Limit: 5})
	}
	source := func(limit int) ([]wire.QuotaUsage, int64, bool) {
		n := min(limit, len(all))
		out := all[:n]
		all = all[n:]
		return out, 0, len(all) > 0
	}
	s, err := New(Config{ConsoleURL: "http://127.0.0.1:1", QuotaSource: source}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for seq := int64(1); ; seq++ {
		s.quota.mu.Lock()
		if s.quota.pending == nil && !s.nextQuota() {
			s.quota.mu.Unlock()
			break
		}
		q, data := s.quota.pending, s.quota.data
		s.quota.mu.Unlock()
		if q.Seq != seq || len(data) > wire.MaxNodeMessageBytes || len(q.Usage) > wire.MaxQuotaUsage {
			t.Fatalf("batch %d: seq %d, %d bytes, %d entries", seq, q.Seq, len(data), len(q.Usage))
		}
		var back wire.Quota
		if err := json.Unmarshal(data, &back); err != nil || back.Validate() != nil {
			t.Fatalf("batch %d does not decode and validate: %v %v", seq, err, back.Validate())
		}
		for _, u := range q.Usage {
			if seen[u.Value] {
				t.Fatalf("%s sent twice", u.Value)
			}
			seen[u.Value] = true
		}
		s.quotaAcked(&wire.QuotaAck{Epoch: q.Epoch, Seq: q.Seq + 1}) // not this batch's ack
		if s.quota.pending == nil {
			t.Fatal("a wrong ack cleared the pending batch")
		}
		s.quotaAcked(&wire.QuotaAck{Epoch: q.Epoch, Seq: q.Seq})
	}
	if len(seen) != total {
		t.Errorf("%d entries sent, want %d", len(seen), total)
	}
}
