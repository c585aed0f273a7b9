package wire_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/sluicehq/sluice/rules/wire"
)

func TestDecode(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    any    // type of the decoded message
		wantErr string // "" = no error
		unknown bool   // error wraps ErrUnknownType
	}{
		{name: "hello", in: `{"type":"hello","protocol":1,"node_id":"n1","applied_version":3}`, want: &wire.Hello{}},
		{name: "snapshot", in: `{"type":"snapshot","version":2,"checksum":"x","domains":[{"name":"a","yaml":"y"}]}`, want: &wire.Snapshot{}},
		{name: "ack", in: `{"type":"ack","version":2}`, want: &wire.Ack{}},
		{name: "nack", in: `{"type":"nack","version":2,"error":"bad"}`, want: &wire.Nack{}},
		{name: "stats", in: `{"type":"stats","interval_ms":1000,"rules":[{"domain":"d","rule":"r","allowed":1}]}`, want: &wire.Stats{}},
		{name: "extra fields ignored", in: `{"type":"ack","version":2,"future":true}`, want: &wire.Ack{}},
		{name: "unknown type", in: `{"type":"gossip"}`, wantErr: "unknown message type", unknown: true},
		{name: "no type", in: `{"version":2}`, wantErr: "unknown message type", unknown: true},
		{name: "not json", in: `hello`, wantErr: "decode message"},
		{name: "not an object", in: `[1,2]`, wantErr: "decode message"},
		{name: "wrong field type", in: `{"type":"ack","version":"two"}`, wantErr: "decode ack message"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := wire.Decode([]byte(tt.in))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Decode(%s) error %v, want %q", tt.in, err, tt.wantErr)
				}
				if errors.Is(err, wire.ErrUnknownType) != tt.unknown {
					t.Errorf("errors.Is(ErrUnknownType) = %v, want %v", !tt.unknown, tt.unknown)
				}
				return
			}
			if err != nil {
				t.Fatalf("Decode(%s): %v", tt.in, err)
			}
			if gotT, wantT := kind(got), kind(tt.want); gotT != wantT {
				t.Errorf("Decode(%s) = %s, want %s", tt.in, gotT, wantT)
			}
		})
	}
}

func kind(v any) string {
	switch v.(type) {
	case *wire.Hello:
		return "hello"
	case *wire.Snapshot:
		return "snapshot"
	case *wire.Ack:
		return "ack"
	case *wire.Nack:
		return "nack"
	case *wire.Stats:
		return "stats"
	}
	return "other"
}

func TestCheckProtocol(t *testing.T) {
	if err := wire.CheckProtocol(wire.ProtocolVersion); err != nil {
		t.Errorf("CheckProtocol(current): %v", err)
	}
	for _, v := range []int{0, wire.ProtocolVersion + 1, -1} {
		err := wire.CheckProtocol(v)
		if err == nil || !strings.Contains(err.Error(), "unsupported protocol version") {
			t.Errorf("CheckProtocol(%d) = %v, want unsupported protocol version", v, err)
		}
	}
}

func TestHelloValidate(t *testing.T) {
	long := strings.Repeat("x", 300)
	many := map[string]string{}
	for i := range wire.MaxLabels + 1 {
		many[strings.Repeat("k", i+1)] = "v"
	}
	tests := []struct {
		name    string
		hello   wire.Hello
		wantErr string
	}{
		{"ok", wire.Hello{NodeID: "n1", AppliedVersion: 3, Labels: map[string]string{"zone": "a"}, Build: "v1"}, ""},
		{"no node id", wire.Hello{}, "node_id is required"},
		{"long node id", wire.Hello{NodeID: long}, "node_id is over"},
		{"negative version", wire.Hello{NodeID: "n", AppliedVersion: -1}, "negative"},
		{"too many labels", wire.Hello{NodeID: "n", Labels: many}, "labels"},
		{"empty label key", wire.Hello{NodeID: "n", Labels: map[string]string{"": "v"}}, "label"},
		{"long label value", wire.Hello{NodeID: "n", Labels: map[string]string{"k": long}}, "label"},
		{"long build", wire.Hello{NodeID: "n", Build: long}, "build"},
		{"NUL in node id", wire.Hello{NodeID: "n\x00"}, "node_id must be valid UTF-8 without NUL"},
		{"invalid UTF-8 in node id", wire.Hello{NodeID: "n\xff"}, "node_id must be valid UTF-8"},
		{"NUL in label key", wire.Hello{NodeID: "n", Labels: map[string]string{"k\x00": "v"}}, "without NUL"},
		{"NUL in label value", wire.Hello{NodeID: "n", Labels: map[string]string{"k": "\x00"}}, "without NUL"},
		{"invalid UTF-8 in label value", wire.Hello{NodeID: "n", Labels: map[string]string{"k": "\xc3"}}, "valid UTF-8"},
		{"NUL in build", wire.Hello{NodeID: "n", Build: "v1\x00"}, "build must be valid UTF-8 without NUL"},
		{"region", wire.Hello{NodeID: "n", Region: "eu-west.1_a"}, ""},
		{"region with a space", wire.Hello{NodeID: "n", Region: "eu west"}, "only letters, digits"},
		{"long region", wire.Hello{NodeID: "n", Region: strings.Repeat("r", wire.MaxRegionBytes+1)}, "region is over 64 bytes"},
		{"non-ASCII is fine", wire.Hello{NodeID: "nœud-1", Labels: map[string]string{"zone": "zürich"}, Build: "v1 ✓"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.hello.Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Validate = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

func TestStatsValidate(t *testing.T) {
	tests := []struct {
		name    string
		stats   wire.Stats
		wantErr string
	}{
		{"ok", wire.Stats{IntervalMS: 1000, Rules: []wire.RuleStats{{Domain: "d", Rule: "r", Allowed: 3,
			TopLimited: []wire.ValueCount{{Value: "k1", Count: 2}}}}}, ""},
		{"empty", wire.Stats{IntervalMS: 1000}, ""},
		{"zero interval", wire.Stats{}, "interval_ms"},
		{"negative count", wire.Stats{IntervalMS: 1000, Rules: []wire.RuleStats{{Limited: -1}}}, "negative"},
		{"too many top values", wire.Stats{IntervalMS: 1000, Rules: []wire.RuleStats{{TopLimited: make([]wire.ValueCount, wire.MaxTopValues+1)}}}, "top values"},
		{"too many rules", wire.Stats{IntervalMS: 1000, Rules: make([]wire.RuleStats, wire.MaxStatsRules+1)}, "rules"},
		{"values within limited", wire.Stats{IntervalMS: 1000, Rules: []wire.RuleStats{{Limited: 5,
			Values: []wire.ValueCount{{Value: "a", Count: 3}, {Value: "b", Count: 2}}}}}, ""},
		{"values over limited", wire.Stats{IntervalMS: 1000, Rules: []wire.RuleStats{{Limited: 5,
			Values: []wire.ValueCount{{Value: "a", Count: 3}, {Value: "b", Count: 3}}}}}, "add up to more than limited"},
		{"a value counted zero", wire.Stats{IntervalMS: 1000, Rules: []wire.RuleStats{{Limited: 5,
			Values: []wire.ValueCount{{Value: "a", Count: 0}}}}}, "not within 1..limited"},
		{"a huge value count", wire.Stats{IntervalMS: 1000, Rules: []wire.RuleStats{{Limited: 1 << 62,
			Values: []wire.ValueCount{{Value: "a", Count: 1 << 62}, {Value: "b", Count: 1 << 62}}}}}, "add up to more than limited"},
		{"too many values", wire.Stats{IntervalMS: 1000, Rules: []wire.RuleStats{{Values: make([]wire.ValueCount, wire.MaxValues+1)}}}, "values"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.stats.Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Validate = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

func TestChecksum(t *testing.T) {
	a := wire.DomainConfig{Name: "a", YAML: "domain: a\n"}
	b := wire.DomainConfig{Name: "b", YAML: "domain: b\n"}
	if wire.Checksum([]wire.DomainConfig{a, b}) != wire.Checksum([]wire.DomainConfig{b, a}) {
		t.Error("checksum depends on domain order")
	}
	// Length prefixes keep the boundary between name and YAML unambiguous.
	x := wire.DomainConfig{Name: "ab", YAML: "c"}
	y := wire.DomainConfig{Name: "a", YAML: "bc"}
	if wire.Checksum([]wire.DomainConfig{x}) == wire.Checksum([]wire.DomainConfig{y}) {
		t.Error("checksum confuses name and yaml boundaries")
	}
	if wire.Checksum(nil) == wire.Checksum([]wire.DomainConfig{a}) {
		t.Error("empty ruleset has the checksum of a non-empty one")
	}
}

func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`{"type":"hello","protocol":1,"node_id":"n1","applied_version":3,"labels":{"a":"b"}}`,
		`{"type":"snapshot","version":2,"checksum":"x","domains":[{"name":"a","yaml":"y"}],"node_count":3}`,
		`{"type":"ack","version":2}`,
		`{"type":"nack","version":2,"error":"bad"}`,
		`{"type":"stats","interval_ms":1000,"rules":[{"domain":"d","rule":"r","top_limited":[{"value":"v","count":1}]}]}`,
		`{"type":"stats","interval_ms":1000,"rules":[{"domain":"d","rule":"r","limited":3,"values":[{"value":"v","count":2},{"value":"w","count":1}]}]}`,
		`{"type":"quota","epoch":"e","seq":1,"usage":[{"domain":"d","rule":"r","unit":"month","value":"v","start":0,"hits":1,"limit":5}]}`,
		`{"type":"quota_ack","epoch":"e","seq":1}`,
		`{"type":7}`, `null`, `{}`,
		// Numbers, escapes and members a decoder could get wrong.
		`{"type":"ack","version":1e2}`, `{"type":"ack","version":1.5}`, `{"type":"ack","version":-0}`,
		`{"type":"ack","version":99999999999999999999}`, `{"type":"ack","version":"1"}`,
		`{"type":"ack","version":null}`, `{"type":"ack","VERSION":2,"version":3}`,
		`{"type":"ack","x":{"a":[1,{"b":null}],"c":"\ud83d\ude00"}}`, "{\"type\":\"nack\",\"error\":\"\xff\"}",
		`{"type":"nack","error":"\ud800x"}`, `{"type":"ack"} {}`, ` {"type":"ack"} `,
		`{"type":"stats","interval_ms":1000,"rules":null}`, `{"type":"stats","rules":[null]}`,
		`{"type":"hello","labels":{"a":"b","a":"c"}}`, `{"type":"hello","labels":[]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		msg, err := wire.Decode(data)
		if err != nil {
			if msg != nil {
				t.Fatalf("Decode returned %T with error %v", msg, err)
			}
			return
		}
		switch m := msg.(type) {
		case *wire.Hello:
			_ = m.Validate()
		case *wire.Stats:
			_ = m.Validate()
		case *wire.Quota:
			_ = m.Validate()
		case *wire.Snapshot, *wire.Ack, *wire.Nack, *wire.QuotaAck:
		default:
			t.Fatalf("Decode returned %T", msg)
		}
		// What decodes re-encodes and decodes to the same type.
		again, err := json.Marshal(msg)
		if err != nil {
			t.Fatalf("re-encode %T: %v", msg, err)
		}
		if _, err := wire.Decode(again); err != nil {
			t.Fatalf("decode re-encoded %s: %v", again, err)
		}
	})
}

func TestCleanText(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"plain", "plain"},
		{"non-ASCII ✓", "non-ASCII ✓"},
		{"a\x00b", "a\uFFFDb"},
		{"bad \xff\xfe byte", "bad \uFFFD byte"},
	} {
		if got := wire.CleanText(tt.in); got != tt.want {
			t.Errorf("CleanText(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestCutKeepsUTF8(t *testing.T) {
	s := strings.Repeat("é", 300) // 600 bytes; byte 511 is mid-character
	for _, n := range []int{0, 1, 510, 511, 512} {
		got := wire.Cut(s, n)
		if !utf8.ValidString(got) || len(got) > n || len(got) < n-1 {
			t.Errorf("Cut to %d bytes = %d bytes, valid UTF-8 %t", n, len(got), utf8.ValidString(got))
		}
	}
	if got := wire.Cut("short", 511); got != "short" {
		t.Errorf("Cut(short) = %q", got)
	}
}
