package ctl

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sluicehq/sluice/internal/atomicfile"
)

// printJSON prints v as indented JSON.
func (e *env) printJSON(v any) error {
	enc := json.NewEncoder(e.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// table prints rows under a header, aligned, for people.
func (e *env) table(header []string, rows [][]string) error {
	w := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, strings.Join(header, "\t"))
	for _, r := range rows {
		fmt.Fprintln(w, strings.Join(r, "\t"))
	}
	return w.Flush()
}

// when formats a time for tables; the zero time is "-".
func when(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

// cell keeps one table cell on one line and bounded.
func cell(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > 60 {
		s = string(r[:59]) + "…"
	}
	if s == "" {
		return "-"
	}
	return s
}

// positive parses a command argument that must be a positive integer.
func (e *env) positive(name, s string, zero bool) (int64, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 || (n == 0 && !zero) {
		return 0, e.usageError(fmt.Errorf("%s %q: want a version number", name, s))
	}
	return n, nil
}

func versionsList(ctx context.Context, e *env, args []string) error {
	var limit int
	fs := e.flags("versions list")
	fs.IntVar(&limit, "limit", 20, "how many versions, newest first (at most 1000)")
	if _, err := e.parse(fs, args, 0, "versions list [--limit N]"); err != nil {
		return err
	}
	if limit < 1 || limit > 1000 {
		return e.usageError(fmt.Errorf("--limit %d: want 1 to 1000", limit))
	}
	if err := e.connect(); err != nil {
		return e.fail(err, nil)
	}
	vs, err := e.client.Versions(ctx, limit)
	if err != nil {
		return e.fail(err, nil)
	}
	if e.jsonOut() {
		return e.printJSON(map[string]any{"versions": vs})
	}
	rows := make([][]string, len(vs))
	for i, v := range vs {
		nodes := "-"
		if v.AppliedBy != nil && v.Connected != nil {
			nodes = fmt.Sprintf("%d/%d", *v.AppliedBy, *v.Connected)
		}
		note := v.Message
		if v.RollbackOf != nil {
			note = fmt.Sprintf("(rollback to %d) %s", *v.RollbackOf, note)
		}
		rows[i] = []string{strconv.FormatInt(v.Version, 10), when(v.CreatedAt), cell(v.Author), cell(strings.Join(v.Domains, ",")), nodes, cell(note)}
	}
	return e.table([]string{"VERSION", "CREATED", "AUTHOR", "DOMAINS", "NODES", "MESSAGE"}, rows)
}

func versionsShow(ctx context.Context, e *env, args []string) error {
	fs := e.flags("versions show")
	args, err := e.parse(fs, args, 1, "versions show N")
	if err != nil {
		return err
	}
	n, err := e.positive("version", args[0], false)
	if err != nil {
		return err
	}
	if err := e.connect(); err != nil {
		return e.fail(err, nil)
	}
	v, err := e.client.Version(ctx, n)
	if err != nil {
		return e.fail(err, nil)
	}
	if e.jsonOut() {
		return e.printJSON(v)
	}
	m := v.Version
	fmt.Fprintf(e.stdout, "version %d\ncreated  %s\nauthor   %s\n", m.Version, when(m.CreatedAt), m.Author)
	if m.ApprovedBy != nil {
		fmt.Fprintf(e.stdout, "approved %s\n", *m.ApprovedBy)
	}
	if m.RollbackOf != nil {
		fmt.Fprintf(e.stdout, "rollback to version %d\n", *m.RollbackOf)
	}
	fmt.Fprintf(e.stdout, "message  %s\nchanged  %s\nchecksum %s\n", m.Message, strings.Join(m.Domains, ", "), m.Checksum)
	for _, d := range v.Domains {
		fmt.Fprintf(e.stdout, "\n# %s.yaml (last changed in version %d)\n%s", d.Name, d.Version, d.YAML)
		if !strings.HasSuffix(d.YAML, "\n") {
			fmt.Fprintln(e.stdout)
		}
	}
	return nil
}

func versionsDiff(ctx context.Context, e *env, args []string) error {
	fs := e.flags("versions diff")
	args, err := e.parse(fs, args, 2, "versions diff A B")
	if err != nil {
		return err
	}
	a, err := e.positive("version", args[0], true)
	if err != nil {
		return err
	}
	b, err := e.positive("version", args[1], true)
	if err != nil {
		return err
	}
	if err := e.connect(); err != nil {
		return e.fail(err, nil)
	}
	d, err := e.client.Diff(ctx, a, b)
	if err != nil {
		return e.fail(err, nil)
	}
	if e.jsonOut() {
		return e.printJSON(map[string]any{"from": a, "to": b, "domains": d})
	}
	if len(d) == 0 {
		fmt.Fprintf(e.stdout, "versions %d and %d have the same rules\n", a, b)
		return nil
	}
	for _, dd := range d {
		for _, c := range dd.Changes {
			fmt.Fprintln(e.stdout, c.String())
		}
	}
	for _, dd := range d {
		fmt.Fprint(e.stdout, "\n"+dd.Unified)
	}
	return nil
}

func rollback(ctx context.Context, e *env, args []string) error {
	var message, breakGlass string
	fs := e.flags("rollback")
	fs.StringVar(&message, "m", "", "change message (required)")
	fs.StringVar(&breakGlass, "break-glass", "", "admins: publish directly although approval is required, for this reason (audited)")
	const synopsis = "rollback N -m MSG [--break-glass REASON]"
	args, err := e.parse(fs, args, 1, synopsis)
	if err != nil {
		return err
	}
	if strings.TrimSpace(message) == "" {
		return e.usageError(fmt.Errorf("-m MSG is required\nusage: sluice ctl %s", synopsis))
	}
	n, err := e.positive("version", args[0], false)
	if err != nil {
		return err
	}
	if err := e.connect(); err != nil {
		return e.fail(err, nil)
	}
	pub, err := e.client.Rollback(ctx, n, message, breakGlass)
	if err != nil {
		return e.fail(err, nil)
	}
	if e.jsonOut() {
		return e.printJSON(pub)
	}
	if pub.Change != nil {
		fmt.Fprintf(e.stdout, "approval required: proposed change request %d (rollback to version %d)\n", pub.Change.ID, n)
		return nil
	}
	fmt.Fprintf(e.stdout, "published version %d (the rules of version %d)\n", pub.Version, n)
	return nil
}

// auditQuery declares the audit filters on fs and returns a function that
// builds the query from them.
func auditQuery(fs interface {
	StringVar(p *string, name, value, usage string)
}) func() url.Values {
	var actor, action, target, domain, since, until string
	fs.StringVar(&actor, "actor", "", "only events by this actor, like user:alice")
	fs.StringVar(&action, "action", "", "only this action, like domain.publish")
	fs.StringVar(&target, "target", "", "only this target, like domain:api")
	fs.StringVar(&domain, "domain", "", "only events about this domain")
	fs.StringVar(&since, "since", "", "only events at or after this RFC 3339 time")
	fs.StringVar(&until, "until", "", "only events before this RFC 3339 time")
	return func() url.Values {
		q := url.Values{}
		for k, v := range map[string]string{"actor": actor, "action": action, "target": target, "domain": domain, "since": since, "until": until} {
			if v != "" {
				q.Set(k, v)
			}
		}
		return q
	}
}

func auditList(ctx context.Context, e *env, args []string) error {
	var limit int
	fs := e.flags("audit list")
	fs.IntVar(&limit, "limit", 50, "how many events, newest first (at most 1000)")
	query := auditQuery(fs)
	if _, err := e.parse(fs, args, 0, "audit list [--limit N] [--actor A] [--action A] [--target T] [--domain D] [--since T] [--until T]"); err != nil {
		return err
	}
	if limit < 1 || limit > 1000 {
		return e.usageError(fmt.Errorf("--limit %d: want 1 to 1000", limit))
	}
	if err := e.connect(); err != nil {
		return e.fail(err, nil)
	}
	q := query()
	q.Set("limit", strconv.Itoa(limit))
	events, err := e.client.Audit(ctx, q)
	if err != nil {
		return e.fail(err, nil)
	}
	if e.jsonOut() {
		return e.printJSON(map[string]any{"events": events})
	}
	rows := make([][]string, len(events))
	for i, ev := range events {
		rows[i] = []string{strconv.FormatInt(ev.ID, 10), when(ev.At), cell(ev.Actor), cell(ev.Action), cell(ev.Target), cell(ev.Message)}
	}
	return e.table([]string{"ID", "AT", "ACTOR", "ACTION", "TARGET", "MESSAGE"}, rows)
}

func auditVerify(ctx context.Context, e *env, args []string) error {
	fs := e.flags("audit verify")
	if _, err := e.parse(fs, args, 0, "audit verify"); err != nil {
		return err
	}
	if err := e.connect(); err != nil {
		return e.fail(err, nil)
	}
	v, err := e.client.VerifyAudit(ctx)
	if err != nil {
		return e.fail(err, nil)
	}
	if e.jsonOut() {
		if err := e.printJSON(v); err != nil {
			return err
		}
	} else if v.OK {
		fmt.Fprintf(e.stdout, "audit chain ok: %d events\n", v.Events)
	} else {
		fmt.Fprintf(e.stdout, "audit chain BROKEN at event %d: %s (%d events checked)\n", deref(v.BrokenID), deref(v.Reason), v.Events)
	}
	if !v.OK {
		return ExitError{exitError}
	}
	return nil
}

func auditExport(ctx context.Context, e *env, args []string) error {
	var file string
	fs := e.flags("audit export")
	fs.StringVar(&file, "file", "", "write the CSV to this file (default: standard output)")
	query := auditQuery(fs)
	if _, err := e.parse(fs, args, 0, "audit export [--file FILE] [--actor A] [--action A] [--target T] [--domain D] [--since T] [--until T]"); err != nil {
		return err
	}
	if err := e.connect(); err != nil {
		return e.fail(err, nil)
	}
	if file == "" {
		if err := e.client.AuditCSV(ctx, query(), e.stdout); err != nil {
			return e.fail(err, nil)
		}
		return nil
	}
	// The file appears whole or not at all: a failed export leaves no
	// partial CSV behind.
	err := atomicfile.Write(file, 0o600, func(w io.Writer) error { return e.client.AuditCSV(ctx, query(), w) })
	if err != nil {
		return e.fail(err, nil)
	}
	return nil
}

func nodes(ctx context.Context, e *env, args []string) error {
	fs := e.flags("nodes")
	if _, err := e.parse(fs, args, 0, "nodes"); err != nil {
		return err
	}
	if err := e.connect(); err != nil {
		return e.fail(err, nil)
	}
	list, err := e.client.Nodes(ctx)
	if err != nil {
		return e.fail(err, nil)
	}
	if e.jsonOut() {
		return e.printJSON(list)
	}
	rows := make([][]string, len(list.Nodes))
	for i, n := range list.Nodes {
		labels := make([]string, 0, len(n.Labels))
		for k, v := range n.Labels {
			labels = append(labels, k+"="+v)
		}
		slices.Sort(labels)
		version := strconv.FormatInt(n.AppliedVersion, 10)
		if n.AppliedVersion != list.CurrentVersion {
			version += " (behind)"
		}
		if n.NackVersion != nil {
			version += fmt.Sprintf(" rejected %d: %s", *n.NackVersion, n.NackError)
		}
		if len(n.UnsupportedDomains) > 0 {
			names := make([]string, len(n.UnsupportedDomains))
			for j, u := range n.UnsupportedDomains {
				names[j] = u.Domain
			}
			version += " cannot run: " + strings.Join(names, ",") // -o json says why
		}
		token := "-"
		if n.TokenID != nil && n.TokenName != nil {
			token = fmt.Sprintf("%s (#%d)", *n.TokenName, *n.TokenID)
		}
		rows[i] = []string{cell(n.ID), n.Status, cell(version), when(n.LastSeen), cell(token), cell(strings.Join(labels, ",")), cell(n.Build)}
	}
	if err := e.table([]string{"ID", "STATUS", "VERSION", "LAST SEEN", "TOKEN", "LABELS", "BUILD"}, rows); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "current version: %d\n", list.CurrentVersion)
	return nil
}

func tokensList(ctx context.Context, e *env, args []string) error {
	fs := e.flags("tokens list")
	if _, err := e.parse(fs, args, 0, "tokens list"); err != nil {
		return err
	}
	if err := e.connect(); err != nil {
		return e.fail(err, nil)
	}
	toks, err := e.client.Tokens(ctx)
	if err != nil {
		return e.fail(err, nil)
	}
	if e.jsonOut() {
		return e.printJSON(map[string]any{"tokens": toks})
	}
	rows := make([][]string, len(toks))
	for i, t := range toks {
		expires, state, node := "never", "active", "-"
		if t.ExpiresAt != nil {
			expires = when(*t.ExpiresAt)
		}
		if t.Disabled {
			state = "disabled"
		}
		if t.NodeID != nil {
			node = *t.NodeID
		}
		rows[i] = []string{strconv.FormatInt(t.ID, 10), cell(t.Name), string(t.Role), "…" + t.Last4, state, expires, cell(t.CreatedBy), cell(node)}
	}
	return e.table([]string{"ID", "NAME", "ROLE", "SECRET", "STATE", "EXPIRES", "CREATED BY", "NODE"}, rows)
}

func tokensCreate(ctx context.Context, e *env, args []string) error {
	var role, expiresIn, domains string
	var opts TokenOptions
	fs := e.flags("tokens create")
	fs.StringVar(&role, "role", "", "viewer, support, editor, admin or node (required)")
	fs.StringVar(&expiresIn, "expires-in", "", "lifetime as a Go duration, like 720h (default: never expires)")
	fs.StringVar(&domains, "domains", "", "comma-separated domains the role holds for (default: every domain you hold)")
	fs.BoolVar(&opts.ReadOnly, "read-only", false, "GET requests only")
	fs.BoolVar(&opts.Fleet, "fleet", false, "a node token any node id may connect with (not one already connected)")
	const synopsis = "tokens create NAME --role ROLE [--expires-in 720h] [--domains a,b] [--read-only] [--fleet]"
	args, err := e.parse(fs, args, 1, synopsis)
	if err != nil {
		return err
	}
	if role == "" {
		return e.usageError(fmt.Errorf("--role is required\nusage: sluice ctl %s", synopsis))
	}
	if err := e.connect(); err != nil {
		return e.fail(err, nil)
	}
	for _, d := range strings.Split(domains, ",") {
		if d = strings.TrimSpace(d); d != "" {
			opts.Domains = append(opts.Domains, d)
		}
	}
	tok, err := e.client.CreateToken(ctx, args[0], role, expiresIn, opts)
	if err != nil {
		return e.fail(err, nil)
	}
	if e.jsonOut() {
		return e.printJSON(tok)
	}
	fmt.Fprintf(e.stdout, "created token %d %q (role %s); its secret, shown only now:\n%s\n", tok.ID, tok.Name, tok.Role, tok.Token)
	return nil
}

func tokensDisable(ctx context.Context, e *env, args []string) error {
	fs := e.flags("tokens disable")
	args, err := e.parse(fs, args, 1, "tokens disable ID")
	if err != nil {
		return err
	}
	id, err := strconv.ParseInt(args[0], 10, 64)
	if err != nil || id <= 0 {
		return e.usageError(fmt.Errorf("token id %q: want a positive integer", args[0]))
	}
	if err := e.connect(); err != nil {
		return e.fail(err, nil)
	}
	tok, err := e.client.DisableToken(ctx, id)
	if err != nil {
		return e.fail(err, nil)
	}
	if e.jsonOut() {
		return e.printJSON(tok)
	}
	fmt.Fprintf(e.stdout, "disabled token %d %q\n", tok.ID, tok.Name)
	return nil
}

// deref is *p, or the zero value for nil (a field the console left out).
func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
