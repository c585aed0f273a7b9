package ctl

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/sluicehq/sluice/rules"
)

// stateFile records, in an exported directory, the console version it was
// exported at (or last applied as), so apply can tell that the console
// moved since. It is hidden and not a *.yaml file, so it is never a domain.
const stateFile = ".sluice-state.json"

// state is the content of stateFile.
type state struct {
	ConsoleURL string `json:"console_url"`
	Version    int64  `json:"version"`
	// RulesVersion is the console's rules_version then: temporary
	// overrides, which live beside the YAML, do not move it, so they never
	// make apply refuse. 0 in a state file written before it existed.
	RulesVersion int64     `json:"rules_version,omitempty"`
	At           time.Time `json:"at"`
}

// readState reads dir's state file; ok is false when there is none.
func readState(dir string) (st state, ok bool, err error) {
	b, err := os.ReadFile(filepath.Join(dir, stateFile))
	if errors.Is(err, fs.ErrNotExist) {
		return state{}, false, nil
	}
	if err != nil {
		return state{}, false, err
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return state{}, false, fmt.Errorf("%s: %w", filepath.Join(dir, stateFile), err)
	}
	return st, true, nil
}

func writeState(dir string, st state) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	return writeFile(filepath.Join(dir, stateFile), append(b, '\n'))
}

// localFile is one domain file of a directory.
type localFile struct {
	Path   string
	Domain string
	YAML   []byte
}

// domainFiles lists the *.yaml and *.yml files of dir (not hidden ones),
// sorted by name.
func domainFiles(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		name := e.Name()
		if ext := filepath.Ext(name); !e.IsDir() && (ext == ".yaml" || ext == ".yml") && !strings.HasPrefix(name, ".") {
			out = append(out, filepath.Join(dir, name))
		}
	}
	slices.Sort(out)
	return out, nil
}

// readRules reads every domain file of dir and validates them together, as
// one ruleset, with the rules package. With named set each file must be
// named after its domain (DOMAIN.yaml), as export writes them. Problems
// come back as a *rules.ValidationError naming the files by their paths.
func readRules(dir string, named bool) ([]localFile, error) {
	paths, err := domainFiles(dir)
	if err != nil {
		return nil, err
	}
	files := make([]rules.File, len(paths))
	for i, p := range paths {
		src, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		files[i] = rules.File{Name: p, YAML: src}
	}
	domains, err := rules.ParseAll(files)
	if err != nil {
		return nil, err
	}
	if _, err := rules.Compile(domains); err != nil {
		return nil, err
	}
	out := make([]localFile, len(files))
	var problems []rules.Problem
	for i, d := range domains {
		out[i] = localFile{Path: files[i].Name, Domain: d.Name, YAML: files[i].YAML}
		if stem := strings.TrimSuffix(filepath.Base(files[i].Name), filepath.Ext(files[i].Name)); named && stem != d.Name {
			line, col := 1, 1
			if _, key, _ := topKey(files[i].YAML, "domain"); key != nil {
				line, col = key.Line, key.Column
			}
			problems = append(problems, rules.Problem{File: files[i].Name, Line: line, Column: col, Path: "domain",
				Message: fmt.Sprintf("domain %q is in a file named %s: name it %s.yaml", d.Name, filepath.Base(files[i].Name), d.Name)})
		}
	}
	if len(problems) > 0 {
		return nil, &rules.ValidationError{Problems: problems}
	}
	return out, nil
}

// topKey finds key in the top-level mapping of a YAML document: the
// mapping, the key's node and its value's node (nil when absent).
func topKey(src []byte, key string) (root, k, v *yaml.Node) {
	var doc yaml.Node
	if err := yaml.Unmarshal(src, &doc); err != nil || doc.Kind != yaml.DocumentNode || len(doc.Content) == 0 {
		return nil, nil, nil
	}
	root = doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return nil, nil, nil
	}
	for i := 0; i+1 < len(root.Content); i += 2 {
		if root.Content[i].Value == key {
			return root, root.Content[i], root.Content[i+1]
		}
	}
	return root, nil, nil
}

// fixedWindowLine is the domain-level key import adds to a Lyft file:
// Lyft counts in fixed windows, Sluice's default is a token bucket.
const fixedWindowLine = "default_algorithm: fixed_window"

// addFixedWindow returns src with "default_algorithm: fixed_window" as a
// top-level key, inserted on its own line after the domain line (before
// it when the domain's value spans lines), the rest of the file byte for
// byte as it was; changed is false when src sets default_algorithm
// already. A file whose top level is not a block mapping with a domain key
// is an error.
func addFixedWindow(src []byte) (out []byte, changed bool, err error) {
	root, key, _ := topKey(src, "default_algorithm")
	if root == nil || root.Style&yaml.FlowStyle != 0 {
		return nil, false, errors.New("the file is not a block mapping (key: value lines): add " + fixedWindowLine + " by hand")
	}
	if key != nil {
		return src, false, nil
	}
	_, key, value := topKey(src, "domain")
	if key == nil {
		return nil, false, errors.New("the file has no domain key")
	}
	lines := bytes.SplitAfter(src, []byte("\n"))
	at := key.Line - 1 // insert before the domain line
	if value.Kind == yaml.ScalarNode && value.Line == key.Line && value.Style&(yaml.LiteralStyle|yaml.FoldedStyle) == 0 {
		at = key.Line // after it
	}
	if at > len(lines) || key.Line < 1 {
		return nil, false, errors.New("cannot place " + fixedWindowLine)
	}
	eol := "\n"
	if l := lines[key.Line-1]; bytes.HasSuffix(l, []byte("\r\n")) {
		eol = "\r\n"
	}
	var b bytes.Buffer
	for i, l := range lines {
		if i == at {
			b.WriteString(strings.Repeat(" ", key.Column-1) + fixedWindowLine + eol)
		}
		b.Write(l)
		if i == len(lines)-1 && at == len(lines) {
			if !bytes.HasSuffix(l, []byte("\n")) {
				b.WriteString(eol)
			}
			b.WriteString(strings.Repeat(" ", key.Column-1) + fixedWindowLine + eol)
		}
	}
	out = b.Bytes()
	if _, k, v := topKey(out, "default_algorithm"); k == nil || v.Value != "fixed_window" {
		return nil, false, errors.New("cannot place " + fixedWindowLine + ": add it by hand")
	}
	return out, true, nil
}

// writeFile writes data to path through a temporary file in the same
// directory and a rename, so a crash never leaves half a file.
func writeFile(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after a successful rename, a no-op
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
