package wire

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestQuotaValidate(t *testing.T) {
	good := func() *Quota {
		return &Quota{Type: TypeQuota, Epoch: "e1", Seq: 1, Usage: []QuotaUsage{
			{Domain: "bill", Rule: "monthly", Unit: "month", Value: "alice", Start: 1796083200, Hits: 3, Limit: 10}}}
	}
	if err := good().Validate(); err != nil {
		t.Fatalf("good batch: %v", err)
	}
	tests := []struct {
		name string
		edit func(q *Quota)
		want string
	}{
		{"no epoch", func(q *Quota) { q.Epoch = "" }, "epoch"},
		{"long epoch", func(q *Quota) { q.Epoch = strings.Repeat("e", MaxQuotaEpochBytes+1) }, "epoch"},
		{"seq 0", func(q *Quota) { q.Seq = 0 }, "seq"},
		{"too many entries", func(q *Quota) { q.Usage = make([]QuotaUsage, MaxQuotaUsage+1) }, "usage entries"},
		{"negative dropped", func(q *Quota) { q.Dropped = -1 }, "dropped"},
		{"no rule", func(q *Quota) { q.Usage[0].Rule = "" }, "domain and rule"},
		{"long value", func(q *Quota) { q.Usage[0].Value = strings.Repeat("v", MaxQuotaValueBytes+1) }, "value is over"},
		{"NUL value", func(q *Quota) { q.Usage[0].Value = "a\x00b" }, "UTF-8 without NUL"},
		{"invalid UTF-8", func(q *Quota) { q.Usage[0].Domain = "\xff" }, "UTF-8 without NUL"},
		{"unit minute", func(q *Quota) { q.Usage[0].Unit = "minute" }, `unit "minute"`},
		{"zero hits", func(q *Quota) { q.Usage[0].Hits = 0 }, "hits must be positive"},
		{"negative limit", func(q *Quota) { q.Usage[0].Limit = -1 }, "limit non-negative"},
		{"start past 9999", func(q *Quota) { q.Usage[0].Start = 1 << 40 }, "out of range"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := good()
			tt.edit(q)
			if err := q.Validate(); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Validate = %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

func TestDecodeQuotaMessages(t *testing.T) {
	for _, msg := range []any{
		Quota{Type: TypeQuota, Epoch: "e", Seq: 2, Usage: []QuotaUsage{{Domain: "d", Rule: "r", Unit: "day", Value: "v", Start: 86400, Hits: 1}}},
		QuotaAck{Type: TypeQuotaAck, Epoch: "e", Seq: 2},
	} {
		data, err := json.Marshal(msg)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Decode(data)
		if err != nil {
			t.Fatalf("Decode %s: %v", data, err)
		}
		switch m := got.(type) {
		case *Quota:
			if m.Seq != 2 || len(m.Usage) != 1 || m.Usage[0].Unit != "day" {
				t.Errorf("decoded %+v", m)
			}
		case *QuotaAck:
			if m.Seq != 2 || m.Epoch != "e" {
				t.Errorf("decoded %+v", m)
			}
		default:
			t.Errorf("Decode %s = %T", data, got)
		}
	}
	if _, err := Decode([]byte(`{"type":"quota_nack"}`)); !errors.Is(err, ErrUnknownType) {
		t.Errorf("unknown type: %v", err)
	}
}
