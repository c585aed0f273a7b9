package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

type ctlOverride struct {
	ID      int64  `json:"id"`
	Domain  string `json:"domain"`
	Status  string `json:"status"`
	Version int64  `json:"version"`
	Urgent  bool   `json:"urgent"`
	// Set by the console: -o json prints the whole answer.
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at"`
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
	if list[0].CreatedAt.IsZero() {
		t.Errorf("overrides list -o json lacks created_at: %+v", list[0])
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

	// --until is an RFC 3339 time, read before anything is asked of the
	// console; its offset is kept.
	_, errOut = c.mustCtl(t, 1, "overrides", "create", "api", "api_key=k3", "--rate", "8/hour", "--until", "tomorrow", "-m", "m")
	if !strings.Contains(errOut, `--until "tomorrow": want an RFC 3339 time`) {
		t.Errorf("bad --until: %q", errOut)
	}
	until := time.Now().Add(72 * time.Hour).In(time.FixedZone("", 3600)).Truncate(time.Second)
	out, _ = c.mustCtl(t, 0, "overrides", "create", "api", "api_key=k3", "--rate", "8/hour", "--until", until.Format(time.RFC3339), "-m", "ticket 43")
	if want := "created override 2 in version 5, until " + until.Format(time.RFC3339); !strings.Contains(out, want) {
		t.Errorf("create --until said %q, want %q", out, want)
	}
	if list := c.overrides(t, "--status", "active"); len(list) != 1 || list[0].ID != 2 || !list[0].ExpiresAt.Equal(until) {
		t.Errorf("override until %s: %+v", until, list)
	}

	// With approval required the answer is the proposed change request;
	// --urgent publishes at once.
	c.admin.MustDo(t, "PUT", "/api/v1/settings", map[string]any{"require_approval": true}, 200, nil)
	out, _ = c.mustCtl(t, 0, "overrides", "create", "api", "api_key=k4", "--rate", "8/hour", "--for", "1h", "-m", "ticket 44", "-o", "json")
	var proposed map[string]json.RawMessage
	if err := json.Unmarshal([]byte(out), &proposed); err != nil || len(proposed) != 1 || proposed["change"] == nil {
		t.Errorf("create -o json with approval required = %s, want only the change", out)
	}
	out, _ = c.mustCtl(t, 0, "overrides", "create", "api", "api_key=k4", "--rate", "8/hour", "--for", "1h", "-m", "ticket 44")
	if !strings.Contains(out, "approval required: proposed change request") {
		t.Errorf("create with approval required said %q", out)
	}
	out, _ = c.mustCtl(t, 0, "overrides", "create", "api", "api_key=k5", "--rate", "8/hour", "--for", "1h", "-m", "ticket 45", "--urgent", "-o", "json")
	var created struct {
		ID, Version int64
	}
	if err := json.Unmarshal([]byte(out), &created); err != nil || created.ID != 3 || created.Version != 6 {
		t.Errorf("create --urgent -o json = %s", out)
	}
	if list := c.overrides(t, "--status", "active"); len(list) != 2 || list[0].ID != 3 || !list[0].Urgent {
		t.Errorf("after an urgent override: %+v", list)
	}
}
