package node

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/rules"
)

// DefaultPollInterval is how often file mode looks at its directory.
const DefaultPollInterval = time.Second

// FileModeAlgorithm is the algorithm of the limits of a rules-dir file
// that sets no default_algorithm: Lyft's fixed window, so that a Lyft
// config counts as it did in envoyproxy/ratelimit.
const FileModeAlgorithm = rules.FixedWindow

// maxRulesFiles bounds the files file mode reads from its directory.
const maxRulesFiles = 10_000

// Files keeps an engine on the rules of a directory of domain files (file
// mode, the Lyft drop-in): every *.yaml or *.yml file in the directory,
// not below it, and not a dotfile, is one domain, as under Lyft's
// RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config. A file without
// default_algorithm counts in fixed windows (FileModeAlgorithm).
//
// Load applies the directory all or nothing: when any file is invalid, or
// two define one domain, the engine keeps the rules it has and every
// problem is logged as FILE:LINE:COLUMN: path: message, without the file's
// text: quoted values in messages become "…", and so do path segments
// that are not the rules' own field names (an unknown field's name), so a
// file that is not a rules file (a symlink to a secret) never has its
// content logged. Run polls the directory's
// contents (names and bytes, through symlinks) and loads them when they
// change: that catches edits, new and removed files, and Kubernetes'
// ConfigMap updates, which swap a symlinked directory at once.
//
// Symlinks are followed only within the directory (once the directory's
// own path is resolved, so the directory may itself be a symlink, as
// Lyft's RUNTIME_ROOT usually is): a file that resolves outside it fails
// the load, naming the file. ConfigMap mounts, whose files link into the
// directory's own ..data, work; a link to a file elsewhere, which would let
// anyone who can write the directory make the node read (and, through an
// error, show) any file it can read, does not.
type Files struct {
	dir      string
	eng      *engine.Engine
	log      *slog.Logger
	interval time.Duration

	mu      sync.Mutex        // serializes loads
	seen    [sha256.Size]byte // the contents last parsed
	seenErr error             // and why they were refused; nil: applied
	tried   bool
	readErr string // the last error reading the directory, logged once
	version int64

	reloads  *prometheus.CounterVec
	lastOK   prometheus.Gauge
	lastTime prometheus.Gauge
}

// newFiles returns file mode on dir for eng, with its metrics in reg
// (when not nil). Nothing is read yet.
func newFiles(dir string, eng *engine.Engine, log *slog.Logger, reg prometheus.Registerer) (*Files, error) {
	f := &Files{
		dir: dir, eng: eng, log: log, interval: DefaultPollInterval,
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_enforcer_rules_reloads_total",
			Help: "Loads of the rules directory (file mode) by result: applied, or failed (the previous rules kept).",
		}, []string{"result"}),
		lastOK: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_enforcer_rules_last_reload_successful",
			Help: "1 when the rules directory's current contents are applied, 0 when they were refused (file mode).",
		}),
		lastTime: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_enforcer_rules_last_reload_success_timestamp_seconds",
			Help: "When the rules directory was last applied, in Unix seconds (file mode; 0: never).",
		}),
	}
	f.reloads.WithLabelValues("applied")
	f.reloads.WithLabelValues("failed")
	if reg != nil {
		for _, c := range []prometheus.Collector{f.reloads, f.lastOK, f.lastTime} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return f, nil
}

// Dir is the rules directory.
func (f *Files) Dir() string { return f.dir }

// Load reads the directory and, when its contents changed since the last
// Load, applies them all or nothing. It returns the problems of contents
// it refused (a *rules.ValidationError) or the error reading them; the
// engine then keeps its rules. Unchanged contents are not parsed again
// (Load returns what it returned for them).
func (f *Files) Load() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	files, sum, err := readRulesDir(f.dir)
	if err != nil {
		// Not remembered as seen: the next poll tries again. The same
		// error again (a directory gone for a while) is not news.
		if err.Error() != f.readErr {
			f.readErr = err.Error()
			f.fail(err)
		}
		return err
	}
	f.readErr = ""
	if f.tried && sum == f.seen {
		if f.seenErr == nil {
			f.lastOK.Set(1) // back after a read error, as it was
		}
		return f.seenErr
	}
	f.seen, f.tried = sum, true
	domains, err := rules.ParseOptions{DefaultAlgorithm: FileModeAlgorithm}.ParseAll(files)
	var set *rules.Set
	if err == nil {
		set, err = rules.Compile(domains)
	}
	if err == nil {
		f.version++
		err = f.eng.Apply(f.version, set)
	}
	f.seenErr = err
	if err != nil {
		f.fail(err)
		return err
	}
	f.reloads.WithLabelValues("applied").Inc()
	f.lastOK.Set(1)
	f.lastTime.SetToCurrentTime()
	f.log.Info("rules applied", "rules_dir", f.dir, "files", len(files), "domains", len(domains), "limits", set.Len(), "version", f.version)
	return nil
}

// fail records and logs a refused load: each problem on its own line, as
// FILE:LINE:COLUMN: message.
func (f *Files) fail(err error) {
	f.reloads.WithLabelValues("failed").Inc()
	f.lastOK.Set(0)
	kept := "none yet"
	if f.eng.Loaded() {
		kept = fmt.Sprintf("version %d", f.eng.Version())
	}
	var ve *rules.ValidationError
	if !errors.As(err, &ve) {
		f.log.Error("rules not applied: keeping the previous rules", "rules_dir", f.dir, "kept", kept, "error", err)
		return
	}
	f.log.Error("rules not applied: keeping the previous rules", "rules_dir", f.dir, "kept", kept, "problems", len(ve.Problems))
	for _, p := range ve.Problems {
		f.log.Error(redactProblem(p).String())
	}
}

// quoted matches a Go-quoted string (how the rules quote a file's values,
// %q and strconv.Quote), with the "…" of a shortened one, and a
// backquoted span (how yaml.v3 quotes them).
var quoted = regexp.MustCompile("\"(?:[^\"\\\\]|\\\\.)*\"…?|`[^`]*`")

// redactProblem is p without the file's text (see Files).
func redactProblem(p rules.Problem) rules.Problem {
	p.Message = quoted.ReplaceAllString(p.Message, `"…"`)
	if p.Path != "" {
		segs := strings.Split(p.Path, ".")
		for i, seg := range segs {
			name, index, _ := strings.Cut(seg, "[")
			if !rules.IsFieldName(name) {
				segs[i] = "…"
				if index != "" {
					segs[i] += "[" + index
				}
			}
		}
		p.Path = strings.Join(segs, ".")
	}
	return p
}

// Run loads the directory every poll interval until ctx is done. Refused
// contents, and errors reading the directory, are logged (and counted as
// failed reloads) once per change, not once per poll.
func (f *Files) Run(ctx context.Context) error {
	t := time.NewTicker(f.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			_ = f.Load() // logged by Load
		}
	}
}

// readRulesDir reads the domain files of dir, sorted by name, and a hash of
// their names and contents.
func readRulesDir(dir string) ([]rules.File, [sha256.Size]byte, error) {
	var sum [sha256.Size]byte
	root, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return nil, sum, fmt.Errorf("read rules dir: %w", err)
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil, sum, fmt.Errorf("read rules dir: %w", err)
	}
	h := sha256.New()
	var files []rules.File
	for _, e := range entries { // ReadDir sorts by name
		name := e.Name()
		if strings.HasPrefix(name, ".") || !slices.Contains([]string{".yaml", ".yml"}, filepath.Ext(name)) {
			continue // ConfigMaps keep their real files in ..data and ..<timestamp>
		}
		path := filepath.Join(dir, name)
		real, err := filepath.EvalSymlinks(filepath.Join(root, name))
		if errors.Is(err, os.ErrNotExist) {
			continue // a dangling symlink, or a file removed meanwhile
		}
		if err != nil {
			return nil, sum, fmt.Errorf("read rules dir: %w", err)
		}
		if !within(root, real) {
			return nil, sum, fmt.Errorf("read rules dir: %s is a symlink to a file outside %s: file mode reads only the files of its directory", path, dir)
		}
		info, err := os.Stat(real)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			return nil, sum, fmt.Errorf("read rules dir: %w", err)
		}
		if !info.Mode().IsRegular() {
			continue
		}
		if len(files) == maxRulesFiles {
			return nil, sum, fmt.Errorf("read rules dir: more than %d rules files in %s", maxRulesFiles, dir)
		}
		src, err := readBounded(real)
		if err != nil {
			return nil, sum, fmt.Errorf("read rules dir: %w", err)
		}
		fmt.Fprintf(h, "%d:%s:%d:", len(name), name, len(src))
		h.Write(src)
		files = append(files, rules.File{Name: path, YAML: src})
	}
	copy(sum[:], h.Sum(nil))
	return files, sum, nil
}

// within says whether path (resolved) is inside dir (resolved).
func within(dir, path string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)) && !filepath.IsAbs(rel)
}

// readBounded reads a file of at most rules.MaxSourceBytes, plus one byte
// so that Parse can say a longer one is too long without reading all of it.
func readBounded(path string) ([]byte, error) {
	file, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer file.Close()
	return io.ReadAll(io.LimitReader(file, rules.MaxSourceBytes+1))
}
