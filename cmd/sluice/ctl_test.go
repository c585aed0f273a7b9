package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/enforcer"
	"github.com/sluicehq/sluice/enforcer/node"
	"github.com/sluicehq/sluice/internal/consoletest"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
)

// ctlConsole is a real console on a fresh database, signed in as admin,
// with an editor token for sluice ctl.
type ctlConsole struct {
	base  string
	admin *client
	token string // editor
	env   map[string]string
}

func startCtlConsole(t *testing.T) *ctlConsole {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	c := &ctlConsole{base: consoletest.Start(t, ctx, &wg, backend.Config{DatabaseURL: testenv.PostgresURL(t), AdminPassword: "ctl-password"}, nil)}
	c.admin = login(t, c.base, "admin", "ctl-password")
	var tok struct {
		Token string `json:"token"`
	}
	c.admin.MustDo(t, "POST", "/api/v1/tokens", map[string]string{"name": "ci", "role": "editor"}, 201, &tok)
	c.token = tok.Token
	c.env = map[string]string{"SLUICE_CONSOLE_URL": c.base, "SLUICE_TOKEN": c.token, "HOME": t.TempDir()}
	return c
}

// ctl runs "sluice ctl ARGS" and returns its exit status and output.
func (c *ctlConsole) ctl(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	return runCtlWith(t, c.env, args...)
}

func runCtlWith(t *testing.T, env map[string]string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := run(context.Background(), append([]string{"ctl"}, args...), func(k string) string { return env[k] }, &out, &errOut)
	var ee exitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.code
	default:
		t.Fatalf("sluice ctl %s: unexpected error %v", strings.Join(args, " "), err)
	}
	return code, out.String(), errOut.String()
}

// mustCtl runs sluice ctl and fails unless it exits with want.
func (c *ctlConsole) mustCtl(t *testing.T, want int, args ...string) (stdout, stderr string) {
	t.Helper()
	code, stdout, stderr := c.ctl(t, args...)
	if code != want {
		t.Fatalf("sluice ctl %s = exit %d, want %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, want, stdout, stderr)
	}
	return stdout, stderr
}

func (c *ctlConsole) publish(t *testing.T, domain, yaml string, base int64) int64 {
	t.Helper()
	var pub struct {
		Version int64 `json:"version"`
	}
	c.admin.MustDo(t, "PUT", "/api/v1/domains/"+domain, map[string]any{"yaml": yaml, "message": "seed", "base_version": base}, 200, &pub)
	return pub.Version
}

type ctlVersion struct {
	Version int64    `json:"version"`
	Author  string   `json:"author"`
	Message string   `json:"message"`
	Domains []string `json:"domains"`
}

// versions lists every version through sluice ctl -o json, newest first.
func (c *ctlConsole) versions(t *testing.T) []ctlVersion {
	t.Helper()
	out, _ := c.mustCtl(t, 0, "versions", "list", "--limit", "1000", "-o", "json")
	var list struct {
		Versions []ctlVersion `json:"versions"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("versions list -o json: %v\n%s", err, out)
	}
	return list.Versions
}

func ctlYAML(domain string, n int) string {
	return fmt.Sprintf("domain: %s\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: minute, requests_per_unit: %d}\n", domain, n)
}

func writeRule(t *testing.T, path, src string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
}

func readRule(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestCtlRoundTrip: export → edit → diff exits 2 → apply makes exactly one
// version → diff exits 0; a broken file is refused with FILE:LINE and
// publishes nothing; removed files delete domains only with --prune.
func TestCtlRoundTrip(t *testing.T) {
	t.Parallel()
	c := startCtlConsole(t)
	// A comment and odd spacing: export must keep the YAML byte for byte.
	apiYAML := "# the public API\ndomain: api\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: minute,   requests_per_unit: 100}\n"
	v := c.publish(t, "api", apiYAML, 0)
	c.publish(t, "web", ctlYAML("web", 5), 0)
	c.publish(t, "old", ctlYAML("old", 1), 0)
	dir := filepath.Join(t.TempDir(), "rules")

	out, _ := c.mustCtl(t, 0, "rules", "export", dir)
	if !strings.Contains(out, "exported 3 domains of version 3") {
		t.Fatalf("export said %q", out)
	}
	if got := readRule(t, filepath.Join(dir, "api.yaml")); got != apiYAML {
		t.Fatalf("exported api.yaml = %q, want the published YAML %q", got, apiYAML)
	}
	if out, _ := c.mustCtl(t, 0, "rules", "diff", dir); out != "" {
		t.Fatalf("diff right after export printed %q", out)
	}

	// Edit one domain, add one, leave one removed.
	writeRule(t, filepath.Join(dir, "api.yaml"), strings.Replace(apiYAML, "100", "250", 1))
	writeRule(t, filepath.Join(dir, "new.yaml"), ctlYAML("new", 7))
	if err := os.Remove(filepath.Join(dir, "old.yaml")); err != nil {
		t.Fatal(err)
	}
	out, _ = c.mustCtl(t, 2, "rules", "diff", dir)
	for _, want := range []string{"--- a/api.yaml", "-    rate_limit: {unit: minute,   requests_per_unit: 100}",
		"+    rate_limit: {unit: minute,   requests_per_unit: 250}", "+++ b/new.yaml", "--- a/old.yaml", "api: limit api_key changed"} {
		if !strings.Contains(out, want) {
			t.Errorf("diff lacks %q:\n%s", want, out)
		}
	}
	var diff struct {
		Version int64 `json:"version"`
		Domains []struct {
			Name   string `json:"name"`
			Change string `json:"change"`
		} `json:"domains"`
	}
	out, _ = c.mustCtl(t, 2, "rules", "diff", dir, "-o", "json")
	if err := json.Unmarshal([]byte(out), &diff); err != nil || fmt.Sprint(diff.Domains) != "[{api changed} {new added} {old removed}]" || diff.Version != 3 {
		t.Fatalf("diff -o json = %+v (%v)\n%s", diff, err, out)
	}
	// --preview asks the console what each changed or new limit would have
	// done to the last hour; with no traffic recorded, it says so per limit.
	out, _ = c.mustCtl(t, 2, "rules", "diff", dir, "--preview")
	for _, want := range []string{"Impact on the last hour of traffic:", "api     api_key  limit_changed", "new     api_key  limit_added", "cannot preview: a new limit"} {
		if !strings.Contains(out, want) {
			t.Errorf("diff --preview lacks %q:\n%s", want, out)
		}
	}
	var withPreview struct {
		Previews []struct {
			Domain string `json:"domain"`
			Limits []struct {
				Name        string `json:"name"`
				Previewable bool   `json:"previewable"`
				Reason      string `json:"reason"`
			} `json:"limits"`
		} `json:"previews"`
	}
	out, _ = c.mustCtl(t, 2, "rules", "diff", dir, "--preview", "-o", "json")
	if err := json.Unmarshal([]byte(out), &withPreview); err != nil || len(withPreview.Previews) != 2 ||
		withPreview.Previews[0].Domain != "api" || len(withPreview.Previews[0].Limits) != 1 || withPreview.Previews[0].Limits[0].Reason == "" {
		t.Fatalf("diff --preview -o json = %+v (%v)\n%s", withPreview, err, out)
	}

	// A broken file: refused locally with its position, nothing published.
	good := readRule(t, filepath.Join(dir, "api.yaml"))
	writeRule(t, filepath.Join(dir, "api.yaml"), "domain: api\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
	_, errOut := c.mustCtl(t, 1, "rules", "apply", dir, "-m", "broken")
	if want := filepath.Join(dir, "api.yaml") + ":4:"; !strings.Contains(errOut, want) || !strings.Contains(errOut, "rate_limit.unit") {
		t.Fatalf("broken file: stderr %q lacks %s and the field", errOut, want)
	}
	if n := len(c.versions(t)); n != 3 {
		t.Fatalf("%d versions after a refused apply, want 3", n)
	}
	writeRule(t, filepath.Join(dir, "api.yaml"), good)

	// Apply without --prune keeps old; one version for api and new.
	out, errOut = c.mustCtl(t, 0, "rules", "apply", dir, "-m", "raise api, add new")
	if !strings.Contains(out, "published version 4 (set api, new)") || !strings.Contains(errOut, "no file for old") {
		t.Fatalf("apply: stdout %q stderr %q", out, errOut)
	}
	vs := c.versions(t)
	if len(vs) != 4 || vs[0].Version != 4 || strings.Join(vs[0].Domains, ",") != "api,new" || vs[0].Message != "raise api, add new" ||
		!strings.HasPrefix(vs[0].Author, "token:ci") {
		t.Fatalf("after apply: versions %+v, want one new version 4 changing api and new by token ci", vs)
	}
	// Only old differs now, and only --prune removes it.
	out, _ = c.mustCtl(t, 2, "rules", "diff", dir)
	if !strings.Contains(out, "old: domain removed") || strings.Contains(out, "api.yaml") {
		t.Fatalf("diff after apply:\n%s", out)
	}
	out, _ = c.mustCtl(t, 0, "rules", "apply", dir, "-m", "again")
	if !strings.Contains(out, "no changes") || len(c.versions(t)) != 4 {
		t.Fatalf("apply with nothing to change: %q, %d versions", out, len(c.versions(t)))
	}
	out, _ = c.mustCtl(t, 0, "rules", "apply", dir, "-m", "prune", "--prune", "-o", "json")
	var pub struct {
		Version int64    `json:"version"`
		Set     []string `json:"set"`
		Deleted []string `json:"deleted"`
	}
	if err := json.Unmarshal([]byte(out), &pub); err != nil || pub.Version != 5 || len(pub.Set) != 0 || fmt.Sprint(pub.Deleted) != "[old]" {
		t.Fatalf("apply --prune -o json = %+v (%v)\n%s", pub, err, out)
	}
	c.mustCtl(t, 0, "rules", "diff", dir)
	// An empty directory never prunes everything.
	empty := t.TempDir()
	if _, errOut := c.mustCtl(t, 1, "rules", "apply", empty, "-m", "oops", "--prune", "--force"); !strings.Contains(errOut, "refusing to remove every domain") {
		t.Fatalf("prune from an empty directory: %q", errOut)
	}
	if got := c.versions(t); len(got) != 5 || v != 1 {
		t.Fatalf("versions %+v", got)
	}
}

// TestCtlDrift: apply refuses when the console moved since the export
// unless --force, and a directory never exported needs --force.
func TestCtlDrift(t *testing.T) {
	t.Parallel()
	c := startCtlConsole(t)
	c.publish(t, "api", ctlYAML("api", 1), 0)
	dir := t.TempDir()
	c.mustCtl(t, 0, "rules", "export", dir)
	writeRule(t, filepath.Join(dir, "web.yaml"), ctlYAML("web", 2))
	c.publish(t, "api", ctlYAML("api", 3), 1) // someone else, in the console

	_, errOut := c.mustCtl(t, 1, "rules", "apply", dir, "-m", "stale")
	if !strings.Contains(errOut, "the console moved") || !strings.Contains(errOut, "exported at version 1, the console is at version 2") {
		t.Fatalf("stale apply: %q", errOut)
	}
	if n := len(c.versions(t)); n != 2 {
		t.Fatalf("%d versions after a refused apply, want 2", n)
	}
	_, errOut = c.mustCtl(t, 2, "rules", "diff", dir)
	if !strings.Contains(errOut, "exported at version 1; the console is at version 2") {
		t.Fatalf("diff does not say the console moved: %q", errOut)
	}
	out, _ := c.mustCtl(t, 0, "rules", "apply", dir, "-m", "forced", "--force")
	if !strings.Contains(out, "published version 3 (set api, web)") {
		t.Fatalf("forced apply: %q", out)
	}
	if d := readRule(t, filepath.Join(dir, "api.yaml")); d != ctlYAML("api", 1) {
		t.Fatalf("local api.yaml changed: %q", d)
	}
	// The state file follows the apply: the next apply needs no --force.
	writeRule(t, filepath.Join(dir, "web.yaml"), ctlYAML("web", 4))
	if out, _ := c.mustCtl(t, 0, "rules", "apply", dir, "-m", "next"); !strings.Contains(out, "published version 4 (set web)") {
		t.Fatalf("apply after apply: %q", out)
	}

	fresh := t.TempDir()
	writeRule(t, filepath.Join(fresh, "x.yaml"), ctlYAML("x", 1))
	if _, errOut := c.mustCtl(t, 1, "rules", "apply", fresh, "-m", "m"); !strings.Contains(errOut, "has no .sluice-state.json") {
		t.Fatalf("apply of a directory never exported: %q", errOut)
	}
	// A file named after another domain is refused with its position.
	writeRule(t, filepath.Join(fresh, "y.yaml"), "\n"+ctlYAML("z", 1))
	if _, errOut := c.mustCtl(t, 1, "rules", "diff", fresh); !strings.Contains(errOut, filepath.Join(fresh, "y.yaml")+":2:1: domain:") {
		t.Fatalf("misnamed file: %q", errOut)
	}
}

// TestCtlApprovalRequired: with four-eyes on, apply proposes one change
// request and leaves the state file alone.
func TestCtlApprovalRequired(t *testing.T) {
	t.Parallel()
	c := startCtlConsole(t)
	c.publish(t, "api", ctlYAML("api", 1), 0)
	dir := t.TempDir()
	c.mustCtl(t, 0, "rules", "export", dir)
	c.admin.MustDo(t, "PUT", "/api/v1/settings", map[string]any{"require_approval": true}, 200, nil)
	writeRule(t, filepath.Join(dir, "api.yaml"), ctlYAML("api", 2))
	writeRule(t, filepath.Join(dir, "web.yaml"), ctlYAML("web", 2))
	out, _ := c.mustCtl(t, 0, "rules", "apply", dir, "-m", "needs review")
	if !strings.Contains(out, "approval required: proposed change request") || !strings.Contains(out, "set api, web") {
		t.Fatalf("apply with approval required: %q", out)
	}
	var changes struct {
		Changes []struct {
			ID    int64  `json:"id"`
			Kind  string `json:"kind"`
			Edits []struct {
				Domain string `json:"domain"`
			} `json:"edits"`
		} `json:"changes"`
	}
	c.admin.MustDo(t, "GET", "/api/v1/changes?status=pending", nil, 200, &changes)
	if len(changes.Changes) != 1 || changes.Changes[0].Kind != "ruleset" || len(changes.Changes[0].Edits) != 2 {
		t.Fatalf("pending changes: %+v", changes)
	}
	// The ci token was created by admin, so admin answers for its change
	// and may not approve it.
	c.admin.MustDo(t, "POST", fmt.Sprintf("/api/v1/changes/%d/approve", changes.Changes[0].ID), nil, 403, nil)
	if n := len(c.versions(t)); n != 1 {
		t.Fatalf("%d versions while the change waits, want 1", n)
	}
	// A second person approves: one version; the directory, which now
	// agrees with the console, catches up without --force.
	c.admin.MustDo(t, "POST", "/api/v1/users", map[string]string{"username": "bob", "password": "password1", "role": "editor"}, 201, nil)
	bob := login(t, c.base, "bob", "password1")
	bob.MustDo(t, "POST", fmt.Sprintf("/api/v1/changes/%d/approve", changes.Changes[0].ID), map[string]string{"message": "lgtm"}, 200, nil)
	if vs := c.versions(t); len(vs) != 2 || strings.Join(vs[0].Domains, ",") != "api,web" {
		t.Fatalf("after approval: %+v", vs)
	}
	if out, _ := c.mustCtl(t, 0, "rules", "apply", dir, "-m", "again"); !strings.Contains(out, "no changes") {
		t.Fatalf("apply after approval: %q", out)
	}
	// Break glass as an admin publishes at once.
	var adminTok struct {
		Token string `json:"token"`
	}
	c.admin.MustDo(t, "POST", "/api/v1/tokens", map[string]string{"name": "root", "role": "admin"}, 201, &adminTok)
	env := map[string]string{"SLUICE_CONSOLE_URL": c.base, "SLUICE_TOKEN": adminTok.Token}
	writeRule(t, filepath.Join(dir, "web.yaml"), ctlYAML("web", 3))
	code, out, errOut := runCtlWith(t, env, "rules", "apply", dir, "-m", "urgent", "--break-glass", "INC-1")
	if code != 0 || !strings.Contains(out, "published version 3 (set web)") {
		t.Fatalf("break glass: %d %q %q", code, out, errOut)
	}
}

// TestCtlCommands runs the history, audit, node and token commands against
// a real console and a real enforcer, in text and in JSON.
func TestCtlCommands(t *testing.T) {
	t.Parallel()
	c := startCtlConsole(t)
	var adminTok struct {
		Token string `json:"token"`
	}
	c.admin.MustDo(t, "POST", "/api/v1/tokens", map[string]string{"name": "ops", "role": "admin"}, 201, &adminTok)
	c.env["SLUICE_TOKEN"] = adminTok.Token
	c.publish(t, "api", ctlYAML("api", 1), 0)
	c.publish(t, "api", ctlYAML("api", 2), 1)

	out, _ := c.mustCtl(t, 0, "versions", "list")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "VERSION") || !strings.HasPrefix(lines[1], "2 ") || !strings.Contains(lines[2], "admin") {
		t.Fatalf("versions list:\n%s", out)
	}
	out, _ = c.mustCtl(t, 0, "versions", "show", "1")
	if !strings.Contains(out, "version 1\n") || !strings.Contains(out, ctlYAML("api", 1)) {
		t.Fatalf("versions show 1:\n%s", out)
	}
	out, _ = c.mustCtl(t, 0, "versions", "diff", "1", "2")
	if !strings.Contains(out, "-    rate_limit: {unit: minute, requests_per_unit: 1}") || !strings.Contains(out, "requests_per_unit 1 → 2") {
		t.Fatalf("versions diff 1 2:\n%s", out)
	}
	var vd struct {
		From, To int64
		Domains  []struct{ Name, Change string }
	}
	out, _ = c.mustCtl(t, 0, "versions", "diff", "0", "2", "-o", "json")
	if err := json.Unmarshal([]byte(out), &vd); err != nil || vd.To != 2 || len(vd.Domains) != 1 || vd.Domains[0].Change != "added" {
		t.Fatalf("versions diff 0 2 -o json = %+v %v", vd, err)
	}

	out, _ = c.mustCtl(t, 0, "rollback", "1", "-m", "back to one")
	if !strings.Contains(out, "published version 3 (the rules of version 1)") {
		t.Fatalf("rollback: %q", out)
	}
	var v3 struct {
		Version struct {
			RollbackOf *int64 `json:"rollback_of"`
		} `json:"version"`
		Domains []struct{ Name, YAML string } `json:"domains"`
	}
	out, _ = c.mustCtl(t, 0, "versions", "show", "3", "-o", "json")
	if err := json.Unmarshal([]byte(out), &v3); err != nil || v3.Version.RollbackOf == nil || *v3.Version.RollbackOf != 1 ||
		len(v3.Domains) != 1 || v3.Domains[0].YAML != ctlYAML("api", 1) {
		t.Fatalf("version 3 = %+v %v", v3, err)
	}

	// Tokens: create a node token, run an enforcer with it, see it in nodes.
	var nodeTok struct {
		ID    int64  `json:"id"`
		Token string `json:"token"`
		Role  string `json:"role"`
	}
	out, _ = c.mustCtl(t, 0, "tokens", "create", "edge-1", "--role", "node", "-o", "json")
	if err := json.Unmarshal([]byte(out), &nodeTok); err != nil || nodeTok.Role != "node" || !strings.HasPrefix(nodeTok.Token, "slc_") {
		t.Fatalf("tokens create -o json = %+v %v\n%s", nodeTok, err, out)
	}
	startCtlEnforcer(t, c.base, nodeTok.Token, "edge-1")
	var list struct {
		Nodes []struct {
			ID             string `json:"id"`
			AppliedVersion int64  `json:"applied_version"`
			Status         string `json:"status"`
		} `json:"nodes"`
		CurrentVersion int64 `json:"current_version"`
	}
	waitFor(t, "the node to run version 3", func() bool {
		out, _ = c.mustCtl(t, 0, "nodes", "-o", "json")
		if err := json.Unmarshal([]byte(out), &list); err != nil {
			t.Fatalf("nodes -o json: %v\n%s", err, out)
		}
		return len(list.Nodes) == 1 && list.Nodes[0].AppliedVersion == 3 && list.Nodes[0].Status == "connected"
	})
	if list.Nodes[0].ID != "edge-1" || list.CurrentVersion != 3 {
		t.Fatalf("nodes = %+v", list)
	}
	out, _ = c.mustCtl(t, 0, "nodes")
	if !strings.Contains(out, "edge-1") || !strings.Contains(out, "connected") || !strings.Contains(out, "current version: 3") ||
		!strings.Contains(out, fmt.Sprintf("edge-1 (#%d)", nodeTok.ID)) {
		t.Fatalf("nodes (want the node's token, edge-1 (#%d)):\n%s", nodeTok.ID, out)
	}

	var scoped struct {
		Domains  []string `json:"domains"`
		ReadOnly bool     `json:"read_only"`
	}
	out, _ = c.mustCtl(t, 0, "tokens", "create", "api-ci", "--role", "editor", "--domains", "api, search", "--read-only", "-o", "json")
	if err := json.Unmarshal([]byte(out), &scoped); err != nil || strings.Join(scoped.Domains, ",") != "api,search" || !scoped.ReadOnly {
		t.Fatalf("tokens create --domains --read-only = %+v %v\n%s", scoped, err, out)
	}

	out, _ = c.mustCtl(t, 0, "tokens", "create", "temp", "--role", "viewer")
	secret := out[strings.LastIndex(strings.TrimSpace(out), "\n")+1:]
	secret = strings.TrimSpace(secret)
	if !strings.Contains(out, "shown only now") || !strings.HasPrefix(secret, "slc_") {
		t.Fatalf("tokens create: %q", out)
	}
	var toks struct {
		Tokens []struct {
			ID       int64  `json:"id"`
			Name     string `json:"name"`
			Disabled bool   `json:"disabled"`
		} `json:"tokens"`
	}
	out, _ = c.mustCtl(t, 0, "tokens", "list", "-o", "json")
	if err := json.Unmarshal([]byte(out), &toks); err != nil {
		t.Fatal(err)
	}
	var tempID int64
	for _, tk := range toks.Tokens {
		if tk.Name == "temp" {
			tempID = tk.ID
		}
	}
	if tempID == 0 || strings.Contains(out, secret) {
		t.Fatalf("tokens list -o json: temp missing or secret shown:\n%s", out)
	}
	viewer := map[string]string{"SLUICE_CONSOLE_URL": c.base, "SLUICE_TOKEN": secret}
	if code, _, errOut := runCtlWith(t, viewer, "versions", "list"); code != 0 {
		t.Fatalf("the new token does not work: %s", errOut)
	}
	if code, _, errOut := runCtlWith(t, viewer, "rollback", "1", "-m", "m"); code != 1 || !strings.Contains(errOut, "403") {
		t.Fatalf("a viewer's rollback: %d %q", code, errOut)
	}
	out, _ = c.mustCtl(t, 0, "tokens", "disable", fmt.Sprint(tempID))
	if !strings.Contains(out, `disabled token`) {
		t.Fatalf("tokens disable: %q", out)
	}
	if code, _, errOut := runCtlWith(t, viewer, "versions", "list"); code != 1 || !strings.Contains(errOut, "401") {
		t.Fatalf("a disabled token: %d %q", code, errOut)
	}
	out, _ = c.mustCtl(t, 0, "tokens", "list")
	if !strings.Contains(out, "temp") || !strings.Contains(out, "disabled") || !strings.HasPrefix(out, "ID") {
		t.Fatalf("tokens list:\n%s", out)
	}

	// Audit: the list, a filter, the chain check and the CSV export.
	var events struct {
		Events []struct {
			ID     int64  `json:"id"`
			Action string `json:"action"`
		} `json:"events"`
	}
	out, _ = c.mustCtl(t, 0, "audit", "list", "--action", "version.rollback", "-o", "json")
	if err := json.Unmarshal([]byte(out), &events); err != nil || len(events.Events) != 1 {
		t.Fatalf("audit list --action version.rollback = %+v %v", events, err)
	}
	out, _ = c.mustCtl(t, 0, "audit", "list", "--limit", "1000", "-o", "json")
	if err := json.Unmarshal([]byte(out), &events); err != nil || len(events.Events) < 6 {
		t.Fatalf("audit list -o json = %+v %v", events, err)
	}
	total := len(events.Events)
	out, _ = c.mustCtl(t, 0, "audit", "list", "--domain", "api")
	if !strings.HasPrefix(out, "ID") || !strings.Contains(out, "domain.publish") || strings.Contains(out, "token.create") {
		t.Fatalf("audit list --domain api:\n%s", out)
	}
	out, _ = c.mustCtl(t, 0, "audit", "verify")
	if want := fmt.Sprintf("audit chain ok: %d events", total); !strings.Contains(out, want) {
		t.Fatalf("audit verify = %q, want %q", out, want)
	}
	csvFile := filepath.Join(t.TempDir(), "audit.csv")
	c.mustCtl(t, 0, "audit", "export", "--file", csvFile)
	csv := readRule(t, csvFile)
	if !strings.HasPrefix(csv, "id,at,actor,action,target") || !strings.Contains(csv, "version.rollback") {
		t.Fatalf("audit export:\n%s", csv)
	}
	out, _ = c.mustCtl(t, 0, "audit", "export", "--action", "version.rollback")
	if n := strings.Count(strings.TrimSpace(out), "\n"); n != 1 {
		t.Fatalf("audit export --action version.rollback has %d rows:\n%s", n, out)
	}
}

// TestCtlUsage: bad flags and arguments are usage errors with status 1
// (2 is rules diff's drift).
func TestCtlUsage(t *testing.T) {
	t.Parallel()
	env := map[string]string{"SLUICE_CONSOLE_URL": "http://127.0.0.1:1"}
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "Usage: sluice ctl"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"rules"}, "see the rules commands"},
		{[]string{"audit", "frob"}, `unknown command "audit frob"`},
		{[]string{"rules", "export"}, "usage: sluice ctl rules export DIR"},
		{[]string{"rules", "diff", dir, dir}, "usage: sluice ctl rules diff DIR"},
		{[]string{"rules", "apply", dir}, "-m MSG is required"},
		{[]string{"rules", "apply", dir, "-m", "x", "--nope"}, "flag provided but not defined: -nope"},
		{[]string{"versions", "show", "x"}, `version "x"`},
		{[]string{"versions", "diff", "1"}, "usage: sluice ctl versions diff A B"},
		{[]string{"rollback", "2"}, "-m MSG is required"},
		{[]string{"tokens", "create", "n"}, "--role is required"},
		{[]string{"tokens", "disable", "abc"}, `token id "abc"`},
		{[]string{"versions", "list", "--limit", "0"}, "--limit 0"},
		{[]string{"nodes", "-o", "yaml"}, `-o "yaml"`},
		{[]string{"--console-url", "ftp://x", "nodes"}, "want http(s)://host"},
		{[]string{"nodes"}, "connect"}, // nothing listens on port 1
	} {
		code, _, errOut := runCtlWith(t, env, tc.args...)
		if code != 1 || !strings.Contains(errOut, tc.want) {
			t.Errorf("sluice ctl %s = exit %d %q; want exit 1 and %q", strings.Join(tc.args, " "), code, errOut, tc.want)
		}
	}
	if code, out, _ := runCtlWith(t, env, "-h"); code != 0 || !strings.Contains(out, "rules apply DIR -m MSG") {
		t.Errorf("sluice ctl -h = %d %q", code, out)
	}
}

// TestCtlConfigFile: the console and the token may come from the config
// file, which is warned about while others may read it.
func TestCtlConfigFile(t *testing.T) {
	t.Parallel()
	c := startCtlConsole(t)
	xdg := t.TempDir()
	path := filepath.Join(xdg, "sluice", "ctl.yaml")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("console_url: "+c.base+"\ntoken: "+c.token+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"XDG_CONFIG_HOME": xdg}
	code, out, errOut := runCtlWith(t, env, "versions", "list")
	if code != 0 || !strings.HasPrefix(out, "VERSION") || !strings.Contains(errOut, "others may read it") {
		t.Fatalf("config file 0644: %d %q %q", code, out, errOut)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := runCtlWith(t, env, "versions", "list"); code != 0 || errOut != "" {
		t.Fatalf("config file 0600: %d %q", code, errOut)
	}
	// The environment wins over the file; a named file must exist.
	env["SLUICE_TOKEN"] = "slc_wrong"
	if code, _, errOut := runCtlWith(t, env, "versions", "list"); code != 1 || !strings.Contains(errOut, "401") {
		t.Fatalf("SLUICE_TOKEN over the file: %d %q", code, errOut)
	}
	if code, _, errOut := runCtlWith(t, map[string]string{}, "--config", filepath.Join(xdg, "missing.yaml"), "nodes"); code != 1 || !strings.Contains(errOut, "missing.yaml") {
		t.Fatalf("missing --config: %d %q", code, errOut)
	}
}

// startCtlEnforcer runs an enforcer against the console until the test ends.
func startCtlEnforcer(t *testing.T, consoleURL, token, id string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	ready := make(chan struct{})
	go func() {
		defer close(done)
		cfg := enforcer.Config{Config: node.Config{ConsoleURL: consoleURL, NodeToken: token, NodeID: id, RedisURL: testenv.RedisURL(t), StateDir: t.TempDir(), KeyPrefix: testenv.KeyPrefix(t)},
			HTTPAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0"}
		err := enforcer.Run(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), func(enforcer.Addrs) { close(ready) })
		if err != nil && ctx.Err() == nil {
			t.Errorf("enforcer: %v", err)
		}
	}()
	select {
	case <-ready:
	case <-done:
		t.FailNow()
	case <-time.After(10 * time.Second):
		t.Fatal("the enforcer did not start")
	}
}

// waitFor polls cond until it holds, for at most 10 seconds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestCtlImportLyft imports Lyft's own example config directory
// (envoyproxy/ratelimit's examples/ratelimit/config) plus a CRLF file and
// one that picks its algorithm: one version, every file byte for byte but
// for the added default_algorithm line, and limits that count in fixed
// windows as Lyft's do.
func TestCtlImportLyft(t *testing.T) {
	t.Parallel()
	c := startCtlConsole(t)
	c.publish(t, "mine", ctlYAML("mine", 1), 0)
	dir := t.TempDir()
	originals := map[string]string{} // domain → file content
	for file, domain := range map[string]string{"example.yaml": "rl", "config.yaml": "mongo_cps"} {
		src := readRule(t, filepath.Join("..", "..", "rules", "testdata", "lyft", file))
		writeRule(t, filepath.Join(dir, file), src)
		originals[domain] = src
	}
	originals["win"] = strings.ReplaceAll("# from Windows\ndomain: win\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 5}\n", "\n", "\r\n")
	writeRule(t, filepath.Join(dir, "windows.yaml"), originals["win"])
	originals["tb"] = "domain: tb\ndefault_algorithm: token_bucket\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 5}\n"
	writeRule(t, filepath.Join(dir, "tb.yaml"), originals["tb"])

	out, _ := c.mustCtl(t, 0, "rules", "import", dir, "-m", "from lyft")
	if !strings.Contains(out, "published version 2 (set mongo_cps, rl, tb, win)") {
		t.Fatalf("import: %q", out)
	}
	vs := c.versions(t)
	if len(vs) != 2 || strings.Join(vs[0].Domains, ",") != "mongo_cps,rl,tb,win" || vs[0].Message != "from lyft" {
		t.Fatalf("versions after import: %+v", vs)
	}
	var snap struct {
		Domains []struct{ Name, YAML string } `json:"domains"`
	}
	c.admin.MustDo(t, "GET", "/api/v1/ruleset", nil, 200, &snap)
	for _, d := range snap.Domains {
		orig, ok := originals[d.Name]
		if !ok {
			continue
		}
		if d.Name == "tb" {
			if d.YAML != orig {
				t.Errorf("tb, which sets its algorithm, was changed:\n%s", d.YAML)
			}
			continue
		}
		eol := "\n"
		if strings.Contains(orig, "\r\n") {
			eol = "\r\n"
		}
		if n := strings.Count(d.YAML, "default_algorithm: fixed_window"+eol); n != 1 {
			t.Errorf("%s has %d default_algorithm lines:\n%s", d.Name, n, d.YAML)
		}
		if back := strings.Replace(d.YAML, "default_algorithm: fixed_window"+eol, "", 1); back != orig {
			t.Errorf("%s is not the file plus one line:\n%q\nwant\n%q", d.Name, back, orig)
		}
		dom, err := rules.Parse(d.Name+".yaml", []byte(d.YAML))
		if err != nil {
			t.Fatalf("%s: %v", d.Name, err)
		}
		set, err := rules.Compile([]*rules.Domain{dom})
		if err != nil {
			t.Fatal(err)
		}
		// Lyft's example: foo=any/bar=any is 3 a minute, counted in a fixed window.
		entries := map[string][]rules.Entry{
			"rl":        {{Key: "foo", Value: "x"}, {Key: "bar", Value: "y"}},
			"mongo_cps": {{Key: "database", Value: "users"}},
			"win":       {{Key: "k", Value: "v"}},
		}[d.Name]
		l := set.Match(d.Name, entries)
		if l == nil || l.Algorithm != rules.FixedWindow {
			t.Errorf("%s %v matches %+v, want a fixed_window limit", d.Name, entries, l)
		}
	}
	if len(snap.Domains) != 5 {
		t.Errorf("the console has %d domains, want the 4 imported and mine", len(snap.Domains))
	}

	// Again: nothing to do. Changed in Lyft since: refused unless --force.
	if out, _ := c.mustCtl(t, 0, "rules", "import", dir); !strings.Contains(out, "no changes") {
		t.Fatalf("second import: %q", out)
	}
	writeRule(t, filepath.Join(dir, "tb.yaml"), strings.Replace(originals["tb"], "5}", "6}", 1))
	if _, errOut := c.mustCtl(t, 1, "rules", "import", dir); !strings.Contains(errOut, "already has other rules for tb") {
		t.Fatalf("import over changed rules: %q", errOut)
	}
	if out, _ := c.mustCtl(t, 0, "rules", "import", dir, "--force", "-o", "json"); !strings.Contains(out, `"version": 3`) {
		t.Fatalf("import --force: %q", out)
	}
	// A broken Lyft file: its own line, nothing published.
	writeRule(t, filepath.Join(dir, "broken.yaml"), "domain: broken\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
	if _, errOut := c.mustCtl(t, 1, "rules", "import", dir); !strings.Contains(errOut, filepath.Join(dir, "broken.yaml")+":4:") {
		t.Fatalf("broken Lyft file: %q", errOut)
	}
	if n := len(c.versions(t)); n != 3 {
		t.Fatalf("%d versions after a refused import, want 3", n)
	}
}
