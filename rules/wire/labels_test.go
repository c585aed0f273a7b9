package wire_test

import (
	"strings"
	"testing"

	"github.com/sluicehq/sluice/rules/wire"
)

func TestParseLabels(t *testing.T) {
	got, err := wire.ParseLabels(" canary = true ,zone=eu-1,team/x=a.b_c ")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got["canary"] != "true" || got["zone"] != "eu-1" || got["team/x"] != "a.b_c" {
		t.Errorf("got %v", got)
	}
	if got, err := wire.ParseLabels(""); got != nil || err != nil {
		t.Errorf("empty: %v, %v", got, err)
	}
	for _, tc := range []struct{ in, want string }{
		{"canary", "not key=value"},
		{"=true", "not key=value"},
		{"a=1,a=2", "given twice"},
		{"a=1,,b=2", "not key=value"},
		{"bad key=1", `label key "bad key"`},
		{"-k=1", `label key "-k"`},
		{strings.Repeat("k", 64) + "=1", "label key"},
		{"k=", "values are 1-63"},
		{"k=a b", "values are 1-63"},
		{"k=" + strings.Repeat("v", 64), "values are 1-63"},
		{"k=\x00", "values are 1-63"},
		{"k=é", "values are 1-63"},
	} {
		if _, err := wire.ParseLabels(tc.in); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseLabels(%q) = %v, want an error containing %q", tc.in, err, tc.want)
		}
	}
	big := map[string]string{}
	for i := range wire.MaxLabels + 1 {
		big["k"+strings.Repeat("x", i)] = "v"
	}
	if err := wire.CheckLabels(big); err == nil || !strings.Contains(err.Error(), "at most") {
		t.Errorf("too many labels: %v", err)
	}
}

func TestMatchLabels(t *testing.T) {
	node := map[string]string{"canary": "true", "zone": "a"}
	for _, tc := range []struct {
		selector map[string]string
		want     bool
	}{
		{map[string]string{"canary": "true"}, true},
		{map[string]string{"canary": "true", "zone": "a"}, true},
		{map[string]string{"canary": "true", "zone": "b"}, false},
		{map[string]string{"canary": "TRUE"}, false},
		{map[string]string{"region": "x"}, false},
		{nil, false}, // an empty selector selects nothing
	} {
		if got := wire.MatchLabels(tc.selector, node); got != tc.want {
			t.Errorf("MatchLabels(%v) = %v, want %v", tc.selector, got, tc.want)
		}
	}
	if wire.MatchLabels(map[string]string{"canary": "true"}, nil) {
		t.Error("a node without labels matched")
	}
}
