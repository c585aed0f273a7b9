package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/rules"
)

// runCLI runs the program and returns its exit status and output.
func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := run(context.Background(), args, func(string) string { return "" }, &out, &errOut)
	var ee exitError
	switch {
	case errors.As(err, &ee):
		code = ee.code
	case err != nil:
		t.Fatalf("run(%q): %v", args, err)
	}
	return code, out.String(), errOut.String()
}

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(content), 0o640); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestRulesCheck(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	good := writeFile(t, dir, "good.yaml", "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n")
	bad := writeFile(t, dir, "bad.yaml", "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 5}\n    burst: 0\n")
	again := writeFile(t, dir, "again.yaml", "domain: api\n")
	other := writeFile(t, dir, "other.yaml", "domain: web\n")
	cases := []struct {
		name  string
		files []string
		code  int
		want  []string // lines of stdout
	}{
		{"valid", []string{good, other}, 0, []string{good + ": ok (domain api)", other + ": ok (domain web)"}},
		{"every problem, with its position", []string{good, bad}, 1, []string{
			bad + `:4:24: descriptors[0].rate_limit.unit: "fortnight" is not a unit (second, minute, hour, day, week, month, year)`,
			bad + ":5:12: descriptors[0].burst: burst must be greater than 0",
		}},
		{"a domain in two files", []string{good, again}, 1, []string{again + `:1:9: domain: domain "api" is already defined in ` + good}},
		{"missing file", []string{filepath.Join(dir, "nope.yaml")}, 1, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, out, errOut := runCLI(t, append([]string{"rules", "check"}, c.files...)...)
			got := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
			if out == "" {
				got = nil
			}
			if code != c.code || strings.Join(got, "\n") != strings.Join(c.want, "\n") {
				t.Fatalf("exit %d, stdout:\n%s\nstderr: %s\nwant exit %d, stdout:\n%s", code, out, errOut, c.code, strings.Join(c.want, "\n"))
			}
		})
	}
}

// TestRulesCheckLyft is the acceptance test: every example config
// of envoyproxy/ratelimit's README passes "sluice rules check" unchanged.
func TestRulesCheckLyft(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("../../rules/testdata/valid/lyft_example*.yaml")
	if err != nil || len(files) < 9 {
		t.Fatalf("README examples: %v, %v", files, err)
	}
	for _, f := range files {
		if code, out, errOut := runCLI(t, "rules", "check", f); code != 0 {
			t.Errorf("rules check %s: exit %d\n%s%s", f, code, out, errOut)
		}
	}
}

func TestRulesFmt(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	const messy = "domain: api   # the API\ndescriptors:\n  - {key: k, rate_limit: {unit: SECOND, requests_per_unit: 5}}\n"
	const canonical = "domain: api # the API\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 5\n"
	path := writeFile(t, dir, "api.yaml", messy)
	clean := writeFile(t, dir, "clean.yaml", canonical)
	bad := writeFile(t, dir, "bad.yaml", "domain: api\ndescriptors: {}\n")

	if code, out, _ := runCLI(t, "rules", "fmt", path); code != 0 || out != canonical {
		t.Fatalf("fmt: exit %d, output:\n%s\nwant:\n%s", code, out, canonical)
	}
	if code, out, _ := runCLI(t, "rules", "fmt", "-check", path, clean); code != 1 || out != path+"\n" {
		t.Fatalf("fmt -check: exit %d, output %q", code, out)
	}
	if code, out, _ := runCLI(t, "rules", "fmt", "-check", clean); code != 0 || out != "" {
		t.Fatalf("fmt -check on a canonical file: exit %d, output %q", code, out)
	}
	if code, out, errOut := runCLI(t, "rules", "fmt", "-w", path); code != 0 || out != "" {
		t.Fatalf("fmt -w: exit %d, %q %q", code, out, errOut)
	}
	got, err := os.ReadFile(path)
	if err != nil || string(got) != canonical {
		t.Fatalf("after fmt -w: %q, %v", got, err)
	}
	if info, err := os.Stat(path); err != nil || info.Mode().Perm() != 0o640 {
		t.Errorf("fmt -w changed the mode: %v, %v", info.Mode(), err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 3 {
		t.Errorf("fmt -w left files behind: %v", entries)
	}
	code, out, _ := runCLI(t, "rules", "fmt", "-w", bad)
	if code != 1 || !strings.Contains(out, bad+":2:14: descriptors: descriptors must be a list") {
		t.Fatalf("fmt of an invalid file: exit %d, %q", code, out)
	}
	if got, _ := os.ReadFile(bad); string(got) != "domain: api\ndescriptors: {}\n" {
		t.Errorf("fmt -w changed an invalid file: %q", got)
	}
	if code, _, _ := runCLI(t, "rules", "fmt", "-w", "-check", path); code != 2 {
		t.Errorf("fmt -w -check: exit %d, want 2", code)
	}
}

func TestRulesDiff(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	oldDir, newDir := filepath.Join(dir, "old"), filepath.Join(dir, "new")
	for _, d := range []string{oldDir, newDir} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	api := writeFile(t, oldDir, "api.yaml", "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n")
	writeFile(t, oldDir, "gone.yaml", "domain: gone\n")
	writeFile(t, oldDir, "notes.txt", "not a domain")
	api2 := writeFile(t, newDir, "api.yaml", "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 10}\n")

	code, out, errOut := runCLI(t, "rules", "diff", oldDir, newDir)
	want := `api: limit k changed: rate_limit.requests_per_unit 5 → 10, burst 5 → 10
gone: domain removed

--- a/api.yaml
+++ b/api.yaml
@@ -1,4 +1,4 @@
 domain: api
 descriptors:
   - key: k
-    rate_limit: {unit: second, requests_per_unit: 5}
+    rate_limit: {unit: second, requests_per_unit: 10}

--- a/gone.yaml
+++ /dev/null
@@ -1 +0,0 @@
-domain: gone
`
	if code != 1 || out != want {
		t.Fatalf("diff: exit %d, stderr %q, output:\n%s\nwant:\n%s", code, errOut, out, want)
	}

	code, out, _ = runCLI(t, "rules", "diff", "-json", api, api2)
	// The same shape as the console's GET /versions/{a}/diff/{b}.
	var body struct {
		Domains []rules.DomainDiff `json:"domains"`
	}
	if err := json.Unmarshal([]byte(out), &body); err != nil || code != 1 {
		t.Fatalf("diff -json: exit %d, %v:\n%s", code, err, out)
	}
	if len(body.Domains) != 1 || body.Domains[0].Name != "api" || body.Domains[0].Change != "changed" ||
		body.Domains[0].Added != 1 || body.Domains[0].Removed != 1 ||
		len(body.Domains[0].Changes) != 1 || body.Domains[0].Changes[0].Kind != rules.LimitChanged ||
		!strings.Contains(body.Domains[0].Unified, "+    rate_limit: {unit: second, requests_per_unit: 10}") {
		t.Errorf("diff -json = %+v", body)
	}

	if code, out, _ := runCLI(t, "rules", "diff", api, api); code != 0 || out != "" {
		t.Errorf("diff of a file with itself: exit %d, %q", code, out)
	}
	bad := writeFile(t, dir, "bad.yaml", "domain: [\n")
	if code, _, _ := runCLI(t, "rules", "diff", api, bad); code != 2 {
		t.Errorf("diff with an invalid file: exit %d, want 2", code)
	}
	if code, _, _ := runCLI(t, "rules", "diff", api); code != 2 {
		t.Errorf("diff with one argument: exit %d, want 2", code)
	}
}

func TestRulesSchema(t *testing.T) {
	t.Parallel()
	code, out, _ := runCLI(t, "rules", "schema")
	var schema map[string]any
	if err := json.Unmarshal([]byte(out), &schema); code != 0 || err != nil || schema["$defs"] == nil {
		t.Fatalf("schema: exit %d, %v", code, err)
	}
	if code, _, _ := runCLI(t, "rules"); code != 2 {
		t.Errorf("rules without a command: exit %d, want 2", code)
	}
	if code, _, _ := runCLI(t, "rules", "lint"); code != 2 {
		t.Errorf("unknown rules command: exit %d, want 2", code)
	}
}
