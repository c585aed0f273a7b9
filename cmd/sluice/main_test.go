package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
	pwFile := filepath.Join(dir, "password")
	if err := os.WriteFile(pwFile, []byte("from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	env := map[string]string{"SLUICE_ADMIN_PASSWORD_FILE": pwFile}
	if err := run(context.Background(), []string{"console", "--print-config"}, func(k string) string { return env[k] }, &out, &errOut); err != nil {
		t.Fatalf("readable file: %v\n%s", err, errOut.String())
	}
	if !strings.Contains(out.String(), "admin_password=xxxxx") || strings.Contains(out.String(), "from-file") {
		t.Fatalf("readable file: the password is not set, or shown:\n%s", out.String())
	}

	out.Reset()
	errOut.Reset()
	missing := filepath.Join(dir, "missing")
	env["SLUICE_ADMIN_PASSWORD_FILE"] = missing
	err := run(context.Background(), []string{"console", "--print-config"}, func(k string) string { return env[k] }, &out, &errOut)
	var exit exitError
	if !errors.As(err, &exit) || exit.code != 2 {
		t.Fatalf("unreadable file: got %v, want exit status 2", err)
	}
	if got := errOut.String(); !strings.Contains(got, "SLUICE_ADMIN_PASSWORD_FILE") || !strings.Contains(got, missing) {
		t.Fatalf("unreadable file: the error does not name the variable and the file:\n%s", got)
	}
}

// TestNodeTokenFile: the enforcer's node token file is read when the
// enforcer starts, not at parse time, and waited for until it appears
// (the console may write it later); --node-token and the file together
// are refused.
func TestNodeTokenFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "node-token")
	var out, errOut bytes.Buffer
	env := map[string]string{"SLUICE_NODE_TOKEN_FILE": path}
	if err := run(context.Background(), []string{"enforcer", "--print-config"}, func(k string) string { return env[k] }, &out, &errOut); err != nil {
		t.Fatalf("a file not there yet: %v\n%s", err, errOut.String())
	}
	if !strings.Contains(out.String(), "node_token_file="+path) {
		t.Errorf("print-config does not show the file:\n%s", out.String())
	}
	env["SLUICE_NODE_TOKEN"] = "slc_x"
	if err := run(context.Background(), []string{"enforcer"}, func(k string) string { return env[k] }, &out, &errOut); err == nil || !strings.Contains(err.Error(), "mutually exclusive") {
		t.Errorf("token and token file: %v, want refused", err)
	}

	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	got := make(chan string, 1)
	go func() {
		tok, err := waitForSecretFile(context.Background(), path, log)
		if err != nil {
			t.Error(err)
		}
		got <- tok
	}()
	select {
	case tok := <-got:
		t.Fatalf("returned %q before the file existed", tok)
	case <-time.After(3 * secretFilePoll):
	}
	if err := os.WriteFile(path, []byte("  \n"), 0o600); err != nil { // empty: still waiting
		t.Fatal(err)
	}
	if err := os.WriteFile(path+".tmp", []byte("slc_from-the-console\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
	select {
	case tok := <-got:
		if tok != "slc_from-the-console" {
			t.Errorf("token %q, want the file's, trimmed", tok)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("did not notice the file")
	}
	// A cancelled wait returns nothing, and no error.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if tok, err := waitForSecretFile(ctx, filepath.Join(dir, "never"), log); tok != "" || err != nil {
		t.Errorf("cancelled wait = %q, %v", tok, err)
	}
}
