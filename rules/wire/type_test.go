package wire

import "testing"

// FuzzPlainType checks that the decoder-free reading of a message's type
// agrees with the decoder whenever it answers.
func FuzzPlainType(f *testing.F) {
	for _, s := range []string{
		`{"type":"stats","interval_ms":1000}`, `{"type":"quota_ack"}`, `{"type":"ack"`,
		`{"type":"a\"b"}`, `{"type":"a\u0041"}`, `{"type":"A"}`, `{"type": "ack"}`, `{"type":""}`,
		`{"type":"ack`, `{"type":7}`, `{"x":1,"type":"ack"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		typ, ok := plainType(data)
		if !ok {
			return
		}
		want, err := decodedType(data)
		if err != nil || want != typ {
			t.Fatalf("plainType(%q) = %q; the decoder says %q, %v", data, typ, want, err)
		}
	})
}
