package node_test

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluicehq/sluice/enforcer/node"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
)

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func write(t *testing.T, path, src string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
}

const lyftFile = `domain: lyft
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5}
`

func fileNode(t *testing.T, dir string) (*node.Node, *prometheus.Registry, *syncBuffer) {
	t.Helper()
	reg := prometheus.NewRegistry()
	logs := &syncBuffer{}
	n, err := node.New(node.Config{RulesDir: dir, RedisURL: testenv.RedisURL(t), KeyPrefix: testenv.KeyPrefix(t), NodeID: "f1",
		Registry: reg, Log: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n, reg, logs
}

// TestFileMode: the directory's files are the ruleset, a Lyft file counts
// in fixed windows, a broken file keeps the previous rules (and says where
// it is broken), and fixing it applies it.
func TestFileMode(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "lyft.yaml"), lyftFile)
	write(t, filepath.Join(dir, "own.yaml"), "domain: own\ndefault_algorithm: token_bucket\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n    burst: 3\n")
	write(t, filepath.Join(dir, "notes.txt"), "not rules")
	write(t, filepath.Join(dir, ".hidden.yaml"), "not: rules")
	n, reg, logs := fileNode(t, dir)
	if n.Subscriber != nil || n.Files == nil || !n.Engine.Loaded() {
		t.Fatalf("file mode node: subscriber %v, files %v, loaded %t", n.Subscriber, n.Files, n.Engine.Loaded())
	}
	set, v := n.Engine.Ruleset()
	if v != 1 || strings.Join(set.Domains(), ",") != "lyft,own" {
		t.Fatalf("version %d domains %v, want 1 and lyft,own", v, set.Domains())
	}
	if l := set.Match("lyft", []rules.Entry{{Key: "user", Value: "u"}}); l == nil || l.Algorithm != rules.FixedWindow {
		t.Errorf("a Lyft file's limit: %+v, want fixed_window", l)
	}
	if l := set.Match("own", []rules.Entry{{Key: "k", Value: "v"}}); l == nil || l.Algorithm != rules.TokenBucket {
		t.Errorf("a file with its own default_algorithm: %+v, want token_bucket", l)
	}

	// Unchanged: nothing is applied again.
	if err := n.Files.Load(); err != nil {
		t.Fatal(err)
	}
	if _, v := n.Engine.Ruleset(); v != 1 {
		t.Errorf("version %d after an unchanged load, want 1", v)
	}

	// A broken file: everything stays as it was.
	write(t, filepath.Join(dir, "lyft.yaml"), strings.Replace(lyftFile, "unit: minute", "unit: fortnight", 1))
	write(t, filepath.Join(dir, "new.yaml"), "domain: new\ndescriptors:\n  - key: x\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	if err := n.Files.Load(); err == nil {
		t.Fatal("a broken file was applied")
	}
	if set, v := n.Engine.Ruleset(); v != 1 || strings.Join(set.Domains(), ",") != "lyft,own" {
		t.Errorf("after a broken file: version %d domains %v, want the previous rules", v, set.Domains())
	}
	want := filepath.Join(dir, "lyft.yaml") + `:4:24: descriptors[0].rate_limit.unit: \"…\" is not a unit`
	if !strings.Contains(logs.String(), want) {
		t.Errorf("logs lack %q:\n%s", want, logs.String())
	}
	failed := `
		# HELP sluice_enforcer_rules_last_reload_successful 1 when the rules directory's current contents are applied, 0 when they were refused (file mode).
		# TYPE sluice_enforcer_rules_last_reload_successful gauge
		sluice_enforcer_rules_last_reload_successful 0
	`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(failed), "sluice_enforcer_rules_last_reload_successful"); err != nil {
		t.Error(err)
	}

	// Fixed: applied, the new file with it.
	write(t, filepath.Join(dir, "lyft.yaml"), strings.Replace(lyftFile, "requests_per_unit: 5", "requests_per_unit: 7", 1))
	if err := n.Files.Load(); err != nil {
		t.Fatal(err)
	}
	set, v = n.Engine.Ruleset()
	if l := set.Match("lyft", []rules.Entry{{Key: "user", Value: "u"}}); v != 2 || l == nil || l.RequestsPerUnit != 7 || set.Match("new", []rules.Entry{{Key: "x", Value: "y"}}) == nil {
		t.Errorf("after the fix: version %d, lyft limit %+v, new domain there: %t; want 2, 7, true", v, l, set.Match("new", []rules.Entry{{Key: "x", Value: "y"}}) != nil)
	}
	reloads := `
		# HELP sluice_enforcer_rules_reloads_total Loads of the rules directory (file mode) by result: applied, or failed (the previous rules kept).
		# TYPE sluice_enforcer_rules_reloads_total counter
		sluice_enforcer_rules_reloads_total{result="applied"} 2
		sluice_enforcer_rules_reloads_total{result="failed"} 1
	`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(reloads), "sluice_enforcer_rules_reloads_total"); err != nil {
		t.Error(err)
	}

	// Two files with one domain: refused, all of it.
	write(t, filepath.Join(dir, "twin.yaml"), lyftFile)
	if err := n.Files.Load(); err == nil || !strings.Contains(err.Error(), `domain "lyft" is already defined`) {
		t.Errorf("a domain in two files: %v", err)
	}
}

// TestFileModeConfigMapSwap: Kubernetes mounts a ConfigMap as symlinks to
// a ..data symlink it swaps at once; the swap is seen and applied.
func TestFileModeConfigMapSwap(t *testing.T) {
	dir := t.TempDir()
	mount := func(version, src string) {
		real := filepath.Join(dir, "..2026_"+version)
		if err := os.Mkdir(real, 0o755); err != nil {
			t.Fatal(err)
		}
		write(t, filepath.Join(real, "lyft.yaml"), src)
		tmp := filepath.Join(dir, "..data_tmp")
		if err := os.Symlink(filepath.Base(real), tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	mount("a", lyftFile)
	if err := os.Symlink("..data/lyft.yaml", filepath.Join(dir, "lyft.yaml")); err != nil {
		t.Fatal(err)
	}
	n, _, _ := fileNode(t, dir)
	mount("b", strings.Replace(lyftFile, "requests_per_unit: 5", "requests_per_unit: 9", 1))
	if err := n.Files.Load(); err != nil {
		t.Fatal(err)
	}
	set, v := n.Engine.Ruleset()
	if l := set.Match("lyft", []rules.Entry{{Key: "user", Value: "u"}}); v != 2 || l.RequestsPerUnit != 9 || len(set.Domains()) != 1 {
		t.Errorf("after the swap: version %d, limit %d, domains %v; want 2, 9, [lyft]", v, l.RequestsPerUnit, set.Domains())
	}
}

// TestFileModeConfig: file mode and a console exclude each other, and a
// directory that cannot be read is an error at once.
func TestFileModeConfig(t *testing.T) {
	_, err := node.New(node.Config{RulesDir: t.TempDir(), ConsoleURL: "http://127.0.0.1:9", RedisURL: "redis://127.0.0.1:9/0"})
	if err == nil || !strings.Contains(err.Error(), "mutually exclusive") {
		t.Errorf("rules dir and console url: %v", err)
	}
	_, err = node.New(node.Config{RulesDir: filepath.Join(t.TempDir(), "missing"), RedisURL: "redis://127.0.0.1:9/0"})
	if err == nil || !strings.Contains(err.Error(), "read rules dir") {
		t.Errorf("missing rules dir: %v", err)
	}
	// A broken directory at start: the node runs, without rules (not
	// ready), until it is fixed.
	dir := t.TempDir()
	write(t, filepath.Join(dir, "bad.yaml"), "domain: [")
	n, _, _ := fileNode(t, dir)
	if n.Engine.Loaded() {
		t.Error("a broken directory was applied")
	}
	write(t, filepath.Join(dir, "bad.yaml"), lyftFile)
	if err := n.Files.Load(); err != nil || !n.Engine.Loaded() {
		t.Errorf("after the fix: %v, loaded %t", err, n.Engine.Loaded())
	}
}

// TestFileModeDirectoryGone: a directory that disappears keeps the rules,
// and says so once, not at every poll; when it is back, it is loaded.
func TestFileModeDirectoryGone(t *testing.T) {
	parent := t.TempDir()
	dir := filepath.Join(parent, "rules")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "lyft.yaml"), lyftFile)
	n, reg, logs := fileNode(t, dir)
	if err := os.Rename(dir, dir+".away"); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := n.Files.Load(); err == nil {
			t.Fatal("a missing directory loaded")
		}
	}
	if got := strings.Count(logs.String(), "read rules dir"); got != 1 {
		t.Errorf("the missing directory was logged %d times, want once:\n%s", got, logs.String())
	}
	if !n.Engine.Loaded() {
		t.Error("the rules were dropped")
	}
	if err := os.Rename(dir+".away", dir); err != nil {
		t.Fatal(err)
	}
	if err := n.Files.Load(); err != nil {
		t.Fatal(err)
	}
	reloads := `
		# HELP sluice_enforcer_rules_reloads_total Loads of the rules directory (file mode) by result: applied, or failed (the previous rules kept).
		# TYPE sluice_enforcer_rules_reloads_total counter
		sluice_enforcer_rules_reloads_total{result="applied"} 1
		sluice_enforcer_rules_reloads_total{result="failed"} 1
		# HELP sluice_enforcer_rules_last_reload_successful 1 when the rules directory's current contents are applied, 0 when they were refused (file mode).
		# TYPE sluice_enforcer_rules_last_reload_successful gauge
		sluice_enforcer_rules_last_reload_successful 1
	`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(reloads), "sluice_enforcer_rules_reloads_total", "sluice_enforcer_rules_last_reload_successful"); err != nil {
		t.Error(err)
	}
}
