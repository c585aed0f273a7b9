package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestUsage(t *testing.T) {
	t.Parallel()
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

// TestSecretFile: a *_FILE variant gives the flag the file's content, and a
// file that cannot be read stops the command with an error naming the file
// (it used to be an empty secret).
func TestSecretFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	env := map[string]string{"SLUICE_NODE_TOKEN_FILE": tokenFile}
	if err := run(context.Background(), []string{"enforcer", "--print-config"}, func(k string) string { return env[k] }, &out, &errOut); err != nil {
		t.Fatalf("readable file: %v\n%s", err, errOut.String())
	}
	if !strings.Contains(out.String(), "node_token=xxxxx") {
		t.Fatalf("readable file: the token is not set:\n%s", out.String())
	}

	out.Reset()
	errOut.Reset()
	missing := filepath.Join(dir, "missing")
	env["SLUICE_NODE_TOKEN_FILE"] = missing
	err := run(context.Background(), []string{"enforcer", "--print-config"}, func(k string) string { return env[k] }, &out, &errOut)
	var exit exitError
	if !errors.As(err, &exit) || exit.code != 2 {
		t.Fatalf("unreadable file: got %v, want exit status 2", err)
	}
	if got := errOut.String(); !strings.Contains(got, "SLUICE_NODE_TOKEN_FILE") || !strings.Contains(got, missing) {
		t.Fatalf("unreadable file: the error does not name the variable and the file:\n%s", got)
	}
}
