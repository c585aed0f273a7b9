package node_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestFileModeLogsNoFileText: a refused file is logged by name, line,
// column and rule path, never with its text: not a value, not an unknown
// field's name, not a non-rules file's first line; and a symlink to a file
// outside the directory fails the load (naming the link) instead of being
// read, while links within it and a symlinked directory still work.
func TestFileModeLogsNoFileText(t *testing.T) {
	outside := t.TempDir()
	write(t, filepath.Join(outside, "secret.txt"), "hunter2-secret-password\n")
	real := t.TempDir()
	write(t, filepath.Join(real, "lyft.yaml"), lyftFile)
	dir := filepath.Join(t.TempDir(), "current") // the directory is itself a symlink, as Lyft's RUNTIME_ROOT
	if err := os.Symlink(real, dir); err != nil {
		t.Fatal(err)
	}
	n, _, logs := fileNode(t, dir)

	for _, tc := range []struct{ name, src, want string }{
		{"first line", "hunter2-secret-password\n", `bad.yaml:1:1: the file (a mapping with "…" and "…") must be a mapping, not "…"`},
		{"unknown field", "domain: api\nhunter2: x\n", `bad.yaml:2:1: …: unknown field "…"`},
		{"value", "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: hunter2, requests_per_unit: 1}\n",
			`bad.yaml:4:24: descriptors[0].rate_limit.unit: "…" is not a unit`},
		{"list", "descriptors: hunter2\ndomain: api\n", `descriptors: descriptors must be a list, not "…"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			write(t, filepath.Join(real, "bad.yaml"), tc.src)
			if err := n.Files.Load(); err == nil {
				t.Fatal("a bad file was applied")
			}
			got := logs.String()
			// The text handler writes a message's quotes as \".
			if strings.Contains(got, "hunter2") || !strings.Contains(got, strings.ReplaceAll(tc.want, `"`, `\"`)) {
				t.Errorf("logs hold the file's text or not its position:\n%s\nwant %q and no hunter2", got, tc.want)
			}
		})
	}
	os.Remove(filepath.Join(real, "bad.yaml"))
	if err := n.Files.Load(); err != nil {
		t.Fatalf("the good file alone: %v", err)
	}

	if err := os.Symlink(filepath.Join(outside, "secret.txt"), filepath.Join(real, "secret.yaml")); err != nil {
		t.Fatal(err)
	}
	err := n.Files.Load()
	if err == nil || !strings.Contains(err.Error(), "secret.yaml is a symlink to a file outside") {
		t.Fatalf("a symlink out of the directory: %v, want the load refused naming it", err)
	}
	if got := logs.String(); strings.Contains(got, "hunter2") {
		t.Errorf("logs hold the linked file's text:\n%s", got)
	}
	os.Remove(filepath.Join(real, "secret.yaml"))
	if err := os.Symlink("lyft.yaml", filepath.Join(real, "alias.yml")); err != nil {
		t.Fatal(err)
	}
	if err := n.Files.Load(); err == nil || !strings.Contains(err.Error(), "lyft") {
		t.Errorf("a symlink within the directory (the same domain twice) = %v, want it read (and refused as a duplicate)", err)
	}
}
