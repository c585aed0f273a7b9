package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
)

type ctlOverride struct {
	ID        int64  `json:"id"`
	Domain    string `json:"domain"`
	Status    string `json:"status"`
	Version   int64  `json:"version"`
	RateLimit struct {
		Unit            string `json:"unit"`
		RequestsPerUnit int    `json:"requests_per_unit"`
	} `json:"rate_limit"`
}

func (c *ctlConsole) overrides(t *testing.T, args ...string) []ctlOverride {
	t.Helper()
	out, _ := c.mustCtl(t, 0, append([]string{"overrides", "list", "-o", "json"}, args...)...)
	var list struct {
		Overrides []ctlOverride `json:"overrides"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("overrides list -o json: %v\n%s", err, out)
	}
	return list.Overrides
}

// TestCtlOverrides: sluice ctl creates, lists and ends overrides, and the
// GitOps commands neither see nor fight them: export writes the staff's
// YAML, diff finds no drift, apply publishes over them and keeps them.
func TestCtlOverrides(t *testing.T) {
	t.Parallel()
	c := startCtlConsole(t)
	c.publish(t, "api", ctlYAML("api", 100), 0)
	dir := filepath.Join(t.TempDir(), "rules")
	c.mustCtl(t, 0, "rules", "export", dir)

	out, _ := c.mustCtl(t, 0, "overrides", "create", "api", "api_key=k1", "--rate", "8/hour", "--for", "48h", "-m", "ticket 42")
	if !strings.Contains(out, "created override 1 in version 2") {
		t.Fatalf("create said %q", out)
	}
	list := c.overrides(t, "--domain", "api")
	if len(list) != 1 || list[0].Status != "active" || list[0].RateLimit.RequestsPerUnit != 8 || list[0].RateLimit.Unit != "hour" {
		t.Fatalf("overrides: %+v", list)
	}
	out, _ = c.mustCtl(t, 0, "overrides", "list")
	if !strings.Contains(out, "api_key=k1") || !strings.Contains(out, "8/hour") || !strings.Contains(out, "active") {
		t.Errorf("overrides list:\n%s", out)
	}

	// GitOps: no drift, and an edit applies over the override and keeps it.
	if out, _ := c.mustCtl(t, 0, "rules", "diff", dir); out != "" {
		t.Errorf("diff with an override active printed %q", out)
	}
	writeRule(t, filepath.Join(dir, "api.yaml"), ctlYAML("api", 200))
	out, _ = c.mustCtl(t, 0, "rules", "apply", dir, "-m", "more for everyone")
	if !strings.Contains(out, "version 3") {
		t.Errorf("apply said %q", out)
	}
	if list := c.overrides(t, "--status", "active"); len(list) != 1 {
		t.Errorf("after apply: %+v", list)
	}
	c.mustCtl(t, 0, "rules", "export", dir)
	if got := readRule(t, filepath.Join(dir, "api.yaml")); got != ctlYAML("api", 200) {
		t.Errorf("exported YAML with an override active = %q, want the staff's YAML", got)
	}

	_, errOut := c.mustCtl(t, 1, "overrides", "create", "api", "user=u1", "--rate", "8/hour", "--for", "1h", "-m", "m")
	if !strings.Contains(errOut, "match no limit") {
		t.Errorf("override matching no limit: %q", errOut)
	}
	_, errOut = c.mustCtl(t, 1, "overrides", "create", "api", "api_key=k2", "--rate", "8/fortnight", "--for", "1h", "-m", "m")
	if !strings.Contains(errOut, "--rate") {
		t.Errorf("bad rate: %q", errOut)
	}

	out, _ = c.mustCtl(t, 0, "overrides", "end", "1", "-m", "launch done", "-o", "json")
	var pub struct {
		Version int64 `json:"version"`
	}
	if err := json.Unmarshal([]byte(out), &pub); err != nil || pub.Version != 4 {
		t.Errorf("end -o json = %q", out)
	}
	if list := c.overrides(t, "--status", "ended"); len(list) != 1 || list[0].ID != 1 {
		t.Errorf("ended overrides: %+v", list)
	}
	if _, errOut := c.mustCtl(t, 1, "overrides", "end", "1", "-m", "again"); !strings.Contains(errOut, "already ended") {
		t.Errorf("ending twice: %q", errOut)
	}
}
