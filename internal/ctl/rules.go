package ctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sluicehq/sluice/internal/consoleapi"
	"github.com/sluicehq/sluice/rules"
)

func rulesExport(ctx context.Context, e *env, args []string) error {
	fs := e.flags("rules export")
	args, err := e.parse(fs, args, 1, "rules export DIR")
	if err != nil {
		return err
	}
	dir := args[0]
	if err := e.connect(); err != nil {
		return e.fail(err, nil)
	}
	snap, err := e.client.Ruleset(ctx)
	if err != nil {
		return e.fail(err, nil)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return e.fail(err, nil)
	}
	have := map[string]bool{}
	names := make([]string, 0, len(snap.Domains))
	for _, d := range snap.Domains {
		path := filepath.Join(dir, d.Name+".yaml")
		if err := writeFile(path, []byte(d.YAML)); err != nil {
			return e.fail(err, nil)
		}
		have[path] = true
		names = append(names, d.Name)
		if strings.HasPrefix(d.Name, ".") {
			fmt.Fprintf(e.stderr, "sluice ctl: warning: domain %s starts with a dot, so %s is a hidden file, which diff and apply skip\n", d.Name, path)
		}
	}
	if err := writeState(dir, state{ConsoleURL: e.client.base.String(), Version: snap.Version, RulesVersion: snap.RulesVersion, At: time.Now().UTC()}); err != nil {
		return e.fail(err, nil)
	}
	others, err := domainFiles(dir)
	if err != nil {
		return e.fail(err, nil)
	}
	for _, p := range others {
		if !have[p] {
			fmt.Fprintf(e.stderr, "sluice ctl: note: %s is not a domain of the console (kept; apply would publish it)\n", p)
		}
	}
	if e.jsonOut() {
		return e.printJSON(map[string]any{"version": snap.Version, "dir": dir, "domains": names})
	}
	fmt.Fprintf(e.stdout, "exported %d domains of version %d to %s\n", len(names), snap.Version, dir)
	return nil
}

// localRules reads and validates dir's domain files (named DOMAIN.yaml) and
// returns them by domain, with each domain's file.
func (e *env) localRules(dir string) (map[string]string, map[string]string, error) {
	files, err := readRules(dir, true)
	if err != nil {
		return nil, nil, e.fail(err, nil)
	}
	yamls, paths := map[string]string{}, map[string]string{}
	for _, f := range files {
		yamls[f.Domain], paths[f.Domain] = string(f.YAML), f.Path
	}
	return yamls, paths, nil
}

func rulesDiff(ctx context.Context, e *env, args []string) error {
	var preview bool
	fs := e.flags("rules diff")
	fs.BoolVar(&preview, "preview", false, "also show what each changed limit would have done to the last hour of traffic")
	args, err := e.parse(fs, args, 1, "rules diff DIR [--preview]")
	if err != nil {
		return err
	}
	dir := args[0]
	local, _, err := e.localRules(dir)
	if err != nil {
		return err
	}
	if err := e.connect(); err != nil {
		return e.fail(err, nil)
	}
	snap, err := e.client.Ruleset(ctx)
	if err != nil {
		return e.fail(err, nil)
	}
	st, exported, err := readState(dir)
	if err != nil {
		return e.fail(err, nil)
	}
	diffs := rules.DiffRulesets(yamlByName(snap), local)
	var previews []consoleapi.Preview
	if preview {
		for _, d := range diffs {
			if d.Change == "removed" {
				continue
			}
			p, err := e.client.Preview(ctx, d.Name, local[d.Name])
			if err != nil {
				return e.fail(err, nil)
			}
			previews = append(previews, p)
		}
	}
	if e.jsonOut() {
		out := map[string]any{"version": snap.Version, "domains": diffs}
		if exported {
			out["exported_version"] = st.Version
		}
		if preview {
			out["previews"] = previews
		}
		if err := e.printJSON(out); err != nil {
			return err
		}
	} else {
		if exported && st.Version != snap.Version {
			fmt.Fprintf(e.stderr, "sluice ctl: note: %s was exported at version %d; the console is at version %d\n", dir, st.Version, snap.Version)
		}
		for _, d := range diffs {
			for _, c := range d.Changes {
				fmt.Fprintln(e.stdout, c.String())
			}
		}
		for _, d := range diffs {
			fmt.Fprint(e.stdout, "\n"+d.Unified)
		}
		if preview {
			printPreviews(e.stdout, previews)
		}
	}
	if len(diffs) > 0 {
		return ExitError{exitDrift}
	}
	return nil
}

func rulesApply(ctx context.Context, e *env, args []string) error {
	var message, breakGlass string
	var prune, force bool
	fs := e.flags("rules apply")
	fs.StringVar(&message, "m", "", "change message (required)")
	fs.BoolVar(&prune, "prune", false, "remove domains that have no file in DIR")
	fs.BoolVar(&force, "force", false, "apply even though the console moved since DIR was exported")
	fs.StringVar(&breakGlass, "break-glass", "", "admins: publish directly although approval is required, for this reason (audited)")
	const synopsis = "rules apply DIR -m MSG [--prune] [--force] [--break-glass REASON]"
	args, err := e.parse(fs, args, 1, synopsis)
	if err != nil {
		return err
	}
	if strings.TrimSpace(message) == "" {
		return e.usageError(fmt.Errorf("-m MSG is required\nusage: sluice ctl %s", synopsis))
	}
	dir := args[0]
	local, paths, err := e.localRules(dir)
	if err != nil {
		return err
	}
	st, exported, err := readState(dir)
	if err != nil {
		return e.fail(err, nil)
	}
	if err := e.connect(); err != nil {
		return e.fail(err, nil)
	}
	snap, err := e.client.Ruleset(ctx)
	if err != nil {
		return e.fail(err, nil)
	}
	ch := consoleapi.RulesetRequest{Domains: map[string]string{}, Message: message}
	if breakGlass != "" {
		ch.BreakGlassReason = &breakGlass
	}
	current := yamlByName(snap)
	for name, y := range local {
		if cur, ok := current[name]; !ok || cur != y {
			ch.Domains[name] = y
		}
	}
	var kept []string
	for name := range current {
		if _, ok := local[name]; !ok {
			if prune {
				ch.Delete = append(ch.Delete, name)
			} else {
				kept = append(kept, name)
			}
		}
	}
	slices.Sort(ch.Delete)
	slices.Sort(kept)
	if len(local) == 0 && len(ch.Delete) > 0 {
		return e.fail(fmt.Errorf("%s has no domain files: refusing to remove every domain (%d) with --prune", dir, len(ch.Delete)), nil)
	}
	if len(kept) > 0 {
		fmt.Fprintf(e.stderr, "sluice ctl: note: %s has no file for %s (kept; --prune removes them)\n", dir, strings.Join(kept, ", "))
	}
	// A version apply publishes changes domains' YAML: it is its own
	// rules version.
	syncState := func(v int64) error {
		return writeState(dir, state{ConsoleURL: e.client.base.String(), Version: v, RulesVersion: v, At: time.Now().UTC()})
	}
	// With nothing to change the directory agrees with the console as it
	// is now (say, after its change request was approved): no drift to
	// refuse, and the state file catches up.
	ch.BaseVersion = &snap.Version
	if len(ch.Domains)+len(ch.Delete) == 0 {
		err := writeState(dir, state{ConsoleURL: e.client.base.String(), Version: snap.Version, RulesVersion: snap.RulesVersion, At: time.Now().UTC()})
		if err != nil {
			return e.fail(err, nil)
		}
		return e.publish(ctx, ch, paths, syncState)
	}
	switch {
	case force:
	case !exported:
		return e.fail(fmt.Errorf("%s has no %s, so it is unknown which version it was made from: export it first (sluice ctl rules export %s), or --force to publish it over version %d",
			dir, stateFile, dir, snap.Version), nil)
	case st.RulesVersion != 0 && st.RulesVersion != snap.RulesVersion, st.RulesVersion == 0 && st.Version != snap.Version:
		// Only the domains' YAML counts: a temporary override made since
		// (which lives beside the YAML) is no reason to refuse.
		return e.fail(fmt.Errorf("the console moved: %s was exported at version %d, the console is at version %d; see sluice ctl rules diff %s and export again, or --force to publish over it",
			dir, st.Version, snap.Version, dir), nil)
	default:
		ch.BaseVersion = &st.Version
	}
	return e.publish(ctx, ch, paths, syncState)
}

// publish sends ch and prints what it did: the new version (then done runs
// with it), or the change request proposed for approval. Nothing to change
// is no request at all.
func (e *env) publish(ctx context.Context, ch consoleapi.RulesetRequest, paths map[string]string, done func(v int64) error) error {
	set := make([]string, 0, len(ch.Domains))
	for name := range ch.Domains {
		set = append(set, name)
	}
	slices.Sort(set)
	out := map[string]any{"set": set, "deleted": nonNil(ch.Delete)}
	if len(set)+len(ch.Delete) == 0 {
		if e.jsonOut() {
			out["version"] = *ch.BaseVersion
			return e.printJSON(out)
		}
		fmt.Fprintf(e.stdout, "no changes: the console (version %d) already has these rules\n", *ch.BaseVersion)
		return nil
	}
	pub, err := e.client.PutRuleset(ctx, ch)
	if err != nil {
		return e.fail(err, paths)
	}
	if pub.Change != nil {
		if e.jsonOut() {
			out["change"] = pub.Change
			return e.printJSON(out)
		}
		fmt.Fprintf(e.stdout, "approval required: proposed change request %d (%s); another person approves it in the console\n",
			pub.Change.ID, summary(set, ch.Delete))
		return nil
	}
	if err := done(pub.Version); err != nil {
		return e.fail(fmt.Errorf("published version %d, but %w", pub.Version, err), nil)
	}
	if e.jsonOut() {
		out["version"] = pub.Version
		return e.printJSON(out)
	}
	fmt.Fprintf(e.stdout, "published version %d (%s)\n", pub.Version, summary(set, ch.Delete))
	return nil
}

// summary says which domains a change sets and removes, naming them when
// there are a few (-o json lists them all).
func summary(set, deleted []string) string {
	var parts []string
	for _, p := range []struct {
		verb  string
		names []string
	}{{"set", set}, {"removed", deleted}} {
		switch n := len(p.names); {
		case n == 0:
		case n <= 10:
			parts = append(parts, p.verb+" "+strings.Join(p.names, ", "))
		default:
			parts = append(parts, fmt.Sprintf("%s %d domains", p.verb, n))
		}
	}
	return strings.Join(parts, "; ")
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func rulesImport(ctx context.Context, e *env, args []string) error {
	var message string
	var force bool
	fs := e.flags("rules import")
	fs.StringVar(&message, "m", "", "change message (default: import of DIR)")
	fs.BoolVar(&force, "force", false, "replace domains the console has already (with different rules)")
	args, err := e.parse(fs, args, 1, "rules import DIR [-m MSG] [--force]")
	if err != nil {
		return err
	}
	dir := args[0]
	if strings.TrimSpace(message) == "" {
		message = "import of Lyft config " + filepath.Base(filepath.Clean(dir))
	}
	// Validate the files as they are, so problems name their own lines,
	// then again with the key added.
	files, err := readRules(dir, false)
	if err != nil {
		return e.fail(err, nil)
	}
	if len(files) == 0 {
		return e.fail(fmt.Errorf("%s has no *.yaml files", dir), nil)
	}
	edited := make([]rules.File, len(files))
	paths := map[string]string{}
	for i, f := range files {
		out, _, err := addFixedWindow(f.YAML)
		if err != nil {
			return e.fail(fmt.Errorf("%s: %w", f.Path, err), nil)
		}
		edited[i] = rules.File{Name: f.Path, YAML: out}
		paths[f.Domain] = f.Path
	}
	if _, err := rules.ParseAll(edited); err != nil {
		return e.fail(fmt.Errorf("with %s added:\n%w", fixedWindowLine, err), nil)
	}
	if err := e.connect(); err != nil {
		return e.fail(err, nil)
	}
	snap, err := e.client.Ruleset(ctx)
	if err != nil {
		return e.fail(err, nil)
	}
	current := yamlByName(snap)
	ch := consoleapi.RulesetRequest{Domains: map[string]string{}, Message: message, BaseVersion: &snap.Version}
	var clash []string
	for i, f := range files {
		y := string(edited[i].YAML)
		cur, ok := current[f.Domain]
		switch {
		case ok && cur == y:
		case ok && !force:
			clash = append(clash, fmt.Sprintf("%s (%s)", f.Domain, f.Path))
		default:
			ch.Domains[f.Domain] = y
		}
	}
	if len(clash) > 0 {
		return e.fail(fmt.Errorf("the console already has other rules for %s: --force replaces them", strings.Join(clash, ", ")), nil)
	}
	return e.publish(ctx, ch, paths, func(int64) error { return nil })
}

// fail prints err for people and ends the command with status 1: rule
// problems one per line as FILE:LINE:COLUMN: path: message (a console's 422
// is mapped back to the local files through paths, domain → file), a
// conflict with what to do about it, anything else as it is.
func (e *env) fail(err error, paths map[string]string) error {
	var ee ExitError
	if errors.As(err, &ee) {
		return err
	}
	var ve *rules.ValidationError
	var ae *APIError
	switch {
	case errors.As(err, &ve):
		e.printProblems(ve.Problems, nil)
	case errors.As(err, &ae) && len(ae.Problems()) > 0:
		fmt.Fprintln(e.stderr, "sluice ctl: the console refused the rules; nothing was published:")
		e.printProblems(ae.Problems(), paths)
	case errors.As(err, &ae) && ae.Status == http.StatusConflict && ae.Code == "conflict" && paths != nil:
		fmt.Fprintf(e.stderr, "sluice ctl: %s; nothing was published (export again, or --force)\n", ae.Message)
	default:
		fmt.Fprintln(e.stderr, "sluice ctl:", err)
	}
	return ExitError{exitError}
}

// printProblems prints rule problems; a problem naming DOMAIN.yaml (as the
// console does) is given the local file of that domain.
func (e *env) printProblems(ps []rules.Problem, paths map[string]string) {
	for _, p := range ps {
		if local, ok := paths[strings.TrimSuffix(p.File, ".yaml")]; ok && p.File != "" {
			p.File = local
		}
		fmt.Fprintln(e.stderr, p.String())
	}
}

// printPreviews prints, per changed or new limit, what it would have done
// to the last hour of traffic beside what was actually limited.
func printPreviews(w io.Writer, previews []consoleapi.Preview) {
	fmt.Fprintln(w, "\nImpact on the last hour of traffic:")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DOMAIN\tLIMIT\tCHANGE\tREQUESTS\tLIMITED\tWOULD LIMIT\tVALUES\tNOTE")
	n := 0
	for _, p := range previews {
		for _, l := range p.Limits {
			n++
			if !l.Previewable {
				fmt.Fprintf(tw, "%s\t%s\t%s\t-\t-\t-\t-\tcannot preview: %s\n", p.Domain, l.Name, l.Change, deref(l.Reason))
				continue
			}
			t := l.Totals
			would := strconv.FormatInt(t.WouldLimit, 10)
			if t.WouldLimitLow != t.WouldLimitHigh {
				would += fmt.Sprintf(" (%d–%d)", t.WouldLimitLow, t.WouldLimitHigh)
			}
			note := ""
			if l.Estimate {
				note = "estimate: " + deref(l.EstimateReason)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%d\t%s\n", p.Domain, l.Name, l.Change, t.Requests, t.Limited, would, t.ValuesMax, note)
		}
	}
	tw.Flush()
	if n == 0 {
		fmt.Fprintln(w, "no limit was added or changed")
	}
}
