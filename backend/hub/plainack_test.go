package hub

import (
	"encoding/json"
	"math"
	"testing"

	"github.com/sluicehq/sluice/rules/wire"
)

// TestPlainAckAgreesWithDecode: the read loop's ack shortcut takes every
// ack as nodes encode it, and whatever it takes wire.Decode reads as the
// same ack; anything else it leaves to wire.Decode.
func TestPlainAckAgreesWithDecode(t *testing.T) {
	var inputs []string
	for _, v := range []int64{0, 1, 9, 10, 42, 1 << 31, 999999999999999999, math.MaxInt64, -1} {
		data, err := json.Marshal(wire.Ack{Type: wire.TypeAck, Version: v})
		if err != nil {
			t.Fatal(err)
		}
		inputs = append(inputs, string(data))
	}
	inputs = append(inputs,
		`{"type":"ack","version":07}`,
		`{"type":"ack","version":}`,
		`{"type":"ack","version":1.5}`,
		`{"type":"ack","version":1e3}`,
		`{"type":"ack","version":"3"}`,
		`{"type":"ack","version":3} `,
		`{"type":"ack","version":3}}`,
		`{"type":"ack", "version":3}`,
		`{"version":3,"type":"ack"}`,
		`{"type":"nack","version":3,"error":"x"}`,
		`{"type":"ack","version":3`,
		``,
	)
	for _, in := range inputs {
		v, ok := plainAck([]byte(in))
		msg, err := wire.Decode([]byte(in))
		ack, isAck := msg.(*wire.Ack)
		switch {
		case ok && (err != nil || !isAck || ack.Version != v):
			t.Errorf("plainAck(%s) = %d, but wire.Decode gives %#v, %v", in, v, msg, err)
		case !ok && isAck && err == nil && in == mustMarshalAck(ack.Version) && ack.Version >= 0 && ack.Version < 1e18:
			t.Errorf("plainAck(%s) refused an ack as nodes encode it", in)
		}
	}
}

func mustMarshalAck(v int64) string {
	data, _ := json.Marshal(wire.Ack{Type: wire.TypeAck, Version: v})
	return string(data)
}
