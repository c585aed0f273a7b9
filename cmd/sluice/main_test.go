package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

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
