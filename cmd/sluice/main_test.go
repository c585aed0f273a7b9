package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRulesCheck(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(good, []byte("domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n"), 0o600)
	os.WriteFile(bad, []byte("domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 5}\n"), 0o600)
	cases := []struct {
		name     string
		files    []string
		code     int
		contains string
	}{
		{"valid", []string{good}, 0, "ok"},
		{"invalid", []string{good, bad}, 1, bad + ":4:"},
		{"missing file", []string{filepath.Join(dir, "nope.yaml")}, 1, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			err := run(context.Background(), append([]string{"rules", "check"}, c.files...), func(string) string { return "" }, &out, &errOut)
			code := 0
			if ee, ok := err.(exitError); ok {
				code = ee.code
			} else if err != nil {
				t.Fatal(err)
			}
			if code != c.code || !strings.Contains(out.String(), c.contains) {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit %d with %q", code, out.String(), errOut.String(), c.code, c.contains)
			}
		})
	}
}

func TestUsage(t *testing.T) {
	var out, errOut bytes.Buffer
	getenv := func(string) string { return "" }
	if err := run(context.Background(), nil, getenv, &out, &errOut); err == nil {
		t.Fatal("no command: want an error")
	}
	if err := run(context.Background(), []string{"version"}, getenv, &out, &errOut); err != nil || !strings.HasPrefix(out.String(), "sluice ") {
		t.Fatalf("version: %v %q", err, out.String())
	}
	out.Reset()
	env := map[string]string{"SLUICE_NODE_TOKEN": "secret", "REDIS_URL": "redis://:pw@h:6379/0"}
	err := run(context.Background(), []string{"enforcer", "--print-config"}, func(k string) string { return env[k] }, &out, &errOut)
	if err != nil || strings.Contains(out.String(), "secret") || strings.Contains(out.String(), "pw@") || !strings.Contains(out.String(), "node_token=xxxxx") {
		t.Fatalf("print-config: %v\n%s", err, out.String())
	}
}
