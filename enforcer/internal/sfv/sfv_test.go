package sfv_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sluicehq/sluice/enforcer/internal/sfv"
)

func TestParseList(t *testing.T) {
	tests := []struct {
		name  string
		lines []string
		want  []sfv.Item
		bad   bool
	}{
		{name: "rate limit", lines: []string{`"per-key";r=0;t=30`}, want: []sfv.Item{
			{Value: "per-key", Params: []sfv.Param{{"r", int64(0)}, {"t", int64(30)}}},
		}},
		{name: "two members over two lines", lines: []string{`"a";q=10;w=1`, `"b\"\\";q=1000;w=60`}, want: []sfv.Item{
			{Value: "a", Params: []sfv.Param{{"q", int64(10)}, {"w", int64(1)}}},
			{Value: `b"\`, Params: []sfv.Param{{"q", int64(1000)}, {"w", int64(60)}}},
		}},
		{name: "all bare types", lines: []string{`tok/1;x, -7, 1.5, ?0, :aGk=:, (1 "x");p`}, want: []sfv.Item{
			{Value: sfv.Token("tok/1"), Params: []sfv.Param{{"x", true}}},
			{Value: int64(-7)},
			{Value: 1.5},
			{Value: false},
			{Value: []byte("hi")},
			{Value: []sfv.Item{{Value: int64(1)}, {Value: "x"}}, Params: []sfv.Param{{"p", true}}},
		}},
		{name: "empty", lines: []string{""}, want: nil},
		{name: "trailing comma", lines: []string{`"a",`}, bad: true},
		{name: "unquoted name with space", lines: []string{`per key`}, bad: true},
		{name: "uppercase param", lines: []string{`"a";Q=1`}, bad: true},
		{name: "unterminated", lines: []string{`"a`}, bad: true},
		{name: "bad escape", lines: []string{`"a\n"`}, bad: true},
		{name: "non-ascii", lines: []string{"\"ä\""}, bad: true},
		{name: "integer too long", lines: []string{`1234567890123456`}, bad: true},
		{name: "decimal too precise", lines: []string{`1.2345`}, bad: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := sfv.ParseList(tt.lines...)
			if tt.bad {
				if err == nil {
					t.Fatalf("parsed %v, want a syntax error", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func FuzzParseList(f *testing.F) {
	for _, s := range []string{`"per-key";r=0;t=30`, `a, (b c);d=?1, :AA==:`, `-1.5;x="y"`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sfv.ParseList(s) // must not panic
	})
}
