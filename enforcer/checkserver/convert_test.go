package checkserver

import (
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// TestToRequestEntries checks that every descriptor keeps its own entries,
// in order, whether they share one allocation with it (one descriptor of a
// few entries) or not.
func TestToRequestEntries(t *testing.T) {
	t.Parallel()
	desc := func(n, from int) *commonv3.RateLimitDescriptor {
		d := &commonv3.RateLimitDescriptor{}
		for i := range n {
			d.Entries = append(d.Entries, &commonv3.RateLimitDescriptor_Entry{Key: "k" + string(rune('a'+from+i)), Value: "v" + string(rune('a'+from+i))})
		}
		return d
	}
	for _, shape := range [][]int{{0}, {1}, {3}, {4}, {5}, {1, 1}, {3, 2, 0}} {
		msg := &rlsv3.RateLimitRequest{Domain: "d"}
		from := 0
		for _, n := range shape {
			msg.Descriptors = append(msg.Descriptors, desc(n, from))
			from += n
		}
		req, err := toRequest(msg)
		if err != nil {
			t.Fatal(err)
		}
		if len(req.Descriptors) != len(shape) {
			t.Fatalf("%v: %d descriptors", shape, len(req.Descriptors))
		}
		for i, d := range req.Descriptors {
			want := msg.Descriptors[i].Entries
			if len(d.Entries) != len(want) || cap(d.Entries) != len(want) {
				t.Fatalf("%v: descriptor %d has %d entries (cap %d), want %d", shape, i, len(d.Entries), cap(d.Entries), len(want))
			}
			for j, e := range d.Entries {
				if e.Key != want[j].Key || e.Value != want[j].Value {
					t.Fatalf("%v: descriptor %d entry %d is %v, want %v", shape, i, j, e, want[j])
				}
			}
		}
	}
}
