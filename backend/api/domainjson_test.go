package api

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/rules"
)

// TestDomainJSONDefaultAlgorithm checks that the structured form keeps a
// domain's default_algorithm and that the effective limits resolve it.
func TestDomainJSONDefaultAlgorithm(t *testing.T) {
	t.Parallel()
	d, err := rules.Parse("d.yaml", []byte(`domain: d
default_algorithm: fixed_window
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: b
    algorithm: token_bucket
    rate_limit: {unit: second, requests_per_unit: 5}
    metadata: {owner: {team: edge}, since: 2024-01-02}
`))
	if err != nil {
		t.Fatal(err)
	}
	out, err := json.Marshal(domainConfig(d))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), `"default_algorithm":"fixed_window"`) {
		t.Errorf("config = %s, want default_algorithm kept", out)
	}
	if !strings.Contains(string(out), `"metadata":{"owner":{"team":"edge"},"since":"2024-01-02T00:00:00Z"}`) {
		t.Errorf("config = %s, want b's metadata kept", out)
	}
	ls := limitsOf(d)
	if len(ls) != 2 || ls[0].Algorithm != "fixed_window" || ls[1].Algorithm != "token_bucket" {
		t.Errorf("limits = %+v, want a fixed_window, b token_bucket", ls)
	}
}
