package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/sluicehq/sluice/internal/atomicfile"
	"github.com/sluicehq/sluice/rules"
)

const rulesUsage = `Usage: sluice rules <command> ...

Commands:
  check FILE...          validate domain files; exit 0 when all are valid, else 1,
                         with FILE:LINE:COLUMN: path: message per problem
  fmt [-w|-check] FILE...
                         print each file in canonical form, comments kept;
                         -w rewrites the files, -check lists the files that are
                         not in canonical form and exits 1 if there are any
  diff [-json] OLD NEW   the changes from OLD to NEW (each a domain file or a
                         directory of them) and a unified diff per domain; -json
                         prints the console's diff shape ({"domains": [...]});
                         exit 0 when they are the same, 1 when they differ, 2 on
                         errors
  schema                 print the JSON Schema of a domain file, for editors
`

func runRules(args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, rulesUsage)
		return exitError{2}
	}
	switch args[0] {
	case "check":
		return rulesCheck(args[1:], getenv, stdout, stderr)
	case "fmt":
		return rulesFmt(args[1:], getenv, stdout, stderr)
	case "diff":
		return rulesDiff(args[1:], getenv, stdout, stderr)
	case "schema":
		_, err := stdout.Write(rules.JSONSchema())
		return err
	case "help", "-h", "--help":
		fmt.Fprint(stdout, rulesUsage)
		return nil
	}
	fmt.Fprintf(stderr, "sluice rules: unknown command %q\n\n%s", args[0], rulesUsage)
	return exitError{2}
}

// printProblems prints a validation error one problem a line, or any other
// error as it is; it reports whether err was a validation error.
func printProblems(err error, stdout, stderr io.Writer) bool {
	var ve *rules.ValidationError
	if errors.As(err, &ve) {
		for _, p := range ve.Details() {
			fmt.Fprintln(stdout, p.String())
		}
		return true
	}
	fmt.Fprintln(stderr, err)
	return false
}

func rulesCheck(args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("rules check", getenv, stderr)
	if err := fs.parse(args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		fmt.Fprint(stderr, "usage: sluice rules check FILE...\n")
		return exitError{2}
	}
	failed := false
	var files []rules.File
	for _, name := range fs.Args() {
		src, err := os.ReadFile(name)
		if err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", name, err)
			failed = true
			continue
		}
		files = append(files, rules.File{Name: name, YAML: src})
	}
	domains, err := rules.ParseAll(files)
	if err == nil {
		// Parse already applies Compile's rules; this also catches any
		// disagreement between the two.
		_, err = rules.Compile(domains)
	}
	if err != nil {
		printProblems(err, stdout, stderr)
		return exitError{1}
	}
	for i, d := range domains {
		fmt.Fprintf(stdout, "%s: ok (domain %s)\n", files[i].Name, d.Name)
	}
	if failed {
		return exitError{1}
	}
	return nil
}

func rulesFmt(args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var write, check bool
	fs := newFlagSet("rules fmt", getenv, stderr)
	fs.bool(&write, "w", "SLUICE_RULES_FMT_WRITE", false, "rewrite the files in canonical form")
	fs.bool(&check, "check", "SLUICE_RULES_FMT_CHECK", false, "list the files not in canonical form; exit 1 if any")
	if err := fs.parse(args); err != nil {
		return err
	}
	if fs.NArg() == 0 || write && check {
		fmt.Fprint(stderr, "usage: sluice rules fmt [-w|-check] FILE...\n")
		return exitError{2}
	}
	failed, unformatted := false, false
	for _, name := range fs.Args() {
		src, err := os.ReadFile(name)
		if err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", name, err)
			failed = true
			continue
		}
		out, err := rules.FormatSource(name, src)
		if err != nil {
			// A file whose comments cannot be kept is left alone.
			printProblems(err, stdout, stderr)
			failed = true
			continue
		}
		switch {
		case check:
			if !bytes.Equal(out, src) {
				fmt.Fprintln(stdout, name)
				unformatted = true
			}
		case write:
			if bytes.Equal(out, src) {
				continue
			}
			if err := replaceFile(name, out); err != nil {
				fmt.Fprintln(stderr, err)
				failed = true
			}
		default:
			if _, err := stdout.Write(out); err != nil {
				return err
			}
		}
	}
	if failed || unformatted {
		return exitError{1}
	}
	return nil
}

// replaceFile replaces name with data atomically (see atomicfile); the
// file keeps its permissions.
func replaceFile(name string, data []byte) error {
	info, err := os.Stat(name)
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(name, data, info.Mode().Perm()); err != nil {
		return fmt.Errorf("rewrite %s: %w", name, err)
	}
	return nil
}

func rulesDiff(args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var asJSON bool
	fs := newFlagSet("rules diff", getenv, stderr)
	fs.bool(&asJSON, "json", "SLUICE_RULES_DIFF_JSON", false, `print {"domains": [...]}, as the console's GET /api/v1/versions/{a}/diff/{b} does`)
	if err := fs.parse(args); err != nil {
		return err
	}
	if fs.NArg() != 2 {
		fmt.Fprint(stderr, "usage: sluice rules diff [-json] OLD NEW\n")
		return exitError{2}
	}
	before, err := loadDomains(fs.Arg(0), stdout, stderr)
	if err != nil {
		return err
	}
	after, err := loadDomains(fs.Arg(1), stdout, stderr)
	if err != nil {
		return err
	}
	diffs := rules.DiffRulesets(before, after)

	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(map[string]any{"domains": diffs}); err != nil {
			return err
		}
	} else {
		for _, d := range diffs {
			for _, c := range d.Changes {
				fmt.Fprintln(stdout, c.String())
			}
		}
		for _, d := range diffs {
			fmt.Fprint(stdout, "\n"+d.Unified)
		}
	}
	if len(diffs) > 0 {
		return exitError{1}
	}
	return nil
}

// loadDomains reads a domain file, or every *.yaml and *.yml file of a
// directory, and returns each domain's source by name. Problems are printed
// and end the command with status 2.
func loadDomains(path string, stdout, stderr io.Writer) (map[string]string, error) {
	paths := []string{path}
	if info, err := os.Stat(path); err != nil {
		fmt.Fprintln(stderr, err)
		return nil, exitError{2}
	} else if info.IsDir() {
		entries, err := os.ReadDir(path)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return nil, exitError{2}
		}
		paths = paths[:0]
		for _, e := range entries {
			if ext := filepath.Ext(e.Name()); !e.IsDir() && (ext == ".yaml" || ext == ".yml") && !strings.HasPrefix(e.Name(), ".") {
				paths = append(paths, filepath.Join(path, e.Name()))
			}
		}
	}
	files := make([]rules.File, 0, len(paths))
	for _, p := range paths {
		src, err := os.ReadFile(p)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return nil, exitError{2}
		}
		files = append(files, rules.File{Name: p, YAML: src})
	}
	domains, err := rules.ParseAll(files)
	if err != nil {
		printProblems(err, stdout, stderr)
		return nil, exitError{2}
	}
	out := make(map[string]string, len(domains))
	for i, d := range domains {
		out[d.Name] = string(files[i].YAML)
	}
	return out, nil
}
