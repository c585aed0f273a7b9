// Package ctl is "sluice ctl", the GitOps CLI against the console's REST
// API: rules export, diff, apply and import between a directory of domain
// files and the console, version history and rollback, the audit trail,
// nodes and API tokens, and the support desk's inspect and reset.
//
// Exit status: 0 on success, 1 on any error (bad flags and arguments
// included), and for "rules diff" 2 when the directory and the console
// differ (0 when they are equal). Errors about a domain file name it as
// FILE:LINE:COLUMN, whether the local check or the console found them.
// Every command prints tables for people and, with -o json, JSON for
// scripts.
//
// The console and the credential come from flags, then the environment
// (SLUICE_CONSOLE_URL, SLUICE_TOKEN or SLUICE_TOKEN_FILE), then a config
// file (--config, SLUICE_CTL_CONFIG, default $XDG_CONFIG_HOME/sluice/ctl.yaml,
// i.e. ~/.config/sluice/ctl.yaml):
//
//	console_url: https://sluice.example.com
//	token: slc_...
//
// A config file or token file that others may read is warned about.
package ctl

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// ExitError ends the command with Code after its output was printed.
type ExitError struct{ Code int }

func (e ExitError) Error() string { return fmt.Sprintf("exit status %d", e.Code) }

// Exit statuses.
const (
	exitOK    = 0
	exitError = 1
	exitDrift = 2 // rules diff: the directory and the console differ
)

const usage = `Usage: sluice ctl [flags] <command> ...

Commands:
  rules export DIR           write every domain as DIR/DOMAIN.yaml, exactly as published,
                             and DIR/.sluice-state.json with the exported version
  rules diff DIR             unified diff from the console to DIR; exit 0 when equal,
                             2 when they differ, 1 on errors; --preview adds what each
                             changed limit would have done to the last hour of traffic
  rules apply DIR -m MSG     publish every changed domain of DIR in ONE version; removes
                             domains missing from DIR only with --prune; refuses when
                             the console moved since DIR was exported unless --force
  rules import DIR [-m MSG]  bring a Lyft config directory (every *.yaml, any file
                             names) into the console as one version, counting in fixed
                             windows as Lyft does (adds default_algorithm: fixed_window)
  versions list              history, newest first (--limit N)
  versions show N            one version and its domains
  versions diff A B          what changed from version A to B
  rollback N -m MSG          publish a new version whose content is version N's
  audit list                 audit events (--limit, --action, --actor, --domain, --since, --until)
  audit verify               check the audit hash chain; exit 1 if broken
  audit export               every matching audit event as CSV (--file FILE, else stdout)
  nodes                      the enforcers, their versions and state
  tokens list                API tokens
  tokens create NAME --role ROLE [--expires-in 720h] [--domains a,b] [--read-only] [--fleet]
                             create a token and print its secret (shown once)
  tokens disable ID          disable a token
  inspect DOMAIN key=value... [+ key=value...]
                             the limits a request's descriptors match and their live
                             counters (used, remaining, reset), read without consuming;
                             the pairs are one descriptor, "+" starts the next
  reset DOMAIN key=value... [+ key=value...] -m MSG
                             start those limits' counters afresh (role support or
                             above; audited as counter.reset)
  overrides list             temporary overrides (--domain D, --status active|expired|ended)
  overrides create DOMAIN KEY=VALUE... --rate N/UNIT (--until TIME | --for 48h) -m MSG
                             give requests with exactly these entries another rate until
                             a time: a new version; --urgent publishes at once when
                             approval is required (audited as break-glass)
  overrides end ID -m MSG    end an override early: a new version without it

Flags (before or after the command):
  --console-url URL   console base URL (env SLUICE_CONSOLE_URL; default the config
                      file's console_url, else http://127.0.0.1:8080)
  --config FILE       config file with console_url and token (env SLUICE_CTL_CONFIG;
                      default $XDG_CONFIG_HOME/sluice/ctl.yaml)
  -o text|json        output format (env SLUICE_OUTPUT)
The token comes from SLUICE_TOKEN, SLUICE_TOKEN_FILE or the config file.
`

// options are the flags every command takes.
type options struct {
	consoleURL string
	config     string
	output     string
}

// env is what a command runs with: the parsed options, the resolved
// client and the output streams.
type env struct {
	opts   options
	getenv func(string) string
	stdout io.Writer
	stderr io.Writer
	client *Client // set by connect
}

// Run runs "sluice ctl" with args (after "ctl"). It returns nil, an
// ExitError whose message was already printed, or an error to print.
func Run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	e := &env{getenv: getenv, stdout: stdout, stderr: stderr}
	e.opts = options{consoleURL: getenv("SLUICE_CONSOLE_URL"), config: getenv("SLUICE_CTL_CONFIG"), output: getenv("SLUICE_OUTPUT")}
	fs := e.flags("ctl")
	if err := fs.Parse(args); err != nil {
		return e.usageError(err)
	}
	args = fs.Args()
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return ExitError{exitError}
	}
	if args[0] == "help" || args[0] == "-h" {
		fmt.Fprint(stdout, usage)
		return nil
	}
	cmd := args[0]
	group := cmd == "rules" || cmd == "versions" || cmd == "audit" || cmd == "tokens" || cmd == "overrides"
	if group && len(args) > 1 {
		cmd += " " + args[1]
		args = args[1:]
	}
	run, ok := commands[cmd]
	if !ok {
		if group {
			fmt.Fprintf(stderr, "sluice ctl: unknown command %q: see the %s commands below\n\n%s", cmd, strings.Fields(cmd)[0], usage)
		} else {
			fmt.Fprintf(stderr, "sluice ctl: unknown command %q\n\n%s", cmd, usage)
		}
		return ExitError{exitError}
	}
	return run(ctx, e, args[1:])
}

// commands maps a command's name to its implementation.
var commands map[string]func(ctx context.Context, e *env, args []string) error

func init() {
	commands = map[string]func(ctx context.Context, e *env, args []string) error{
		"rules export":   rulesExport,
		"rules diff":     rulesDiff,
		"rules apply":    rulesApply,
		"rules import":   rulesImport,
		"versions list":  versionsList,
		"versions show":  versionsShow,
		"versions diff":  versionsDiff,
		"rollback":       rollback,
		"audit list":     auditList,
		"audit verify":   auditVerify,
		"audit export":   auditExport,
		"nodes":          nodes,
		"tokens list":    tokensList,
		"tokens create":  tokensCreate,
		"tokens disable": tokensDisable,
		"inspect":        inspect,
		"reset":          reset,

		"overrides list":   overridesList,
		"overrides create": overridesCreate,
		"overrides end":    overridesEnd,
	}
}

// flags is a flag set with the common options, bound to e.opts, so they
// may come before or after the command.
func (e *env) flags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&e.opts.consoleURL, "console-url", e.opts.consoleURL, "console base URL")
	fs.StringVar(&e.opts.config, "config", e.opts.config, "config file")
	fs.StringVar(&e.opts.output, "o", e.opts.output, "output format: text or json")
	return fs
}

// parse parses a command's flags and checks its number of positional
// arguments (want; at least -want when want is negative) and -o.
func (e *env) parse(fs *flag.FlagSet, args []string, want int, synopsis string) ([]string, error) {
	if err := fs.Parse(interleave(fs, args)); err != nil {
		return nil, e.usageError(fmt.Errorf("%w\nusage: sluice ctl %s", err, synopsis))
	}
	if want >= 0 && fs.NArg() != want || want < 0 && fs.NArg() < -want {
		return nil, e.usageError(fmt.Errorf("usage: sluice ctl %s", synopsis))
	}
	switch e.opts.output {
	case "", "text", "json":
	default:
		return nil, e.usageError(fmt.Errorf("-o %q: use text or json", e.opts.output))
	}
	return fs.Args(), nil
}

// interleave moves flags after positional arguments to the front, so that
// "rules apply DIR -m MSG" parses as the usage shows it. A lone "--" ends
// the flags as usual.
func interleave(fs *flag.FlagSet, args []string) []string {
	var flags, pos []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			pos = append(pos, args[i+1:]...)
			i = len(args)
		case strings.HasPrefix(a, "-") && a != "-":
			flags = append(flags, a)
			name := strings.TrimLeft(a, "-")
			if strings.Contains(name, "=") {
				continue
			}
			if f := fs.Lookup(name); f != nil && !isBool(f) && i+1 < len(args) {
				flags = append(flags, args[i+1])
				i++
			}
		default:
			pos = append(pos, a)
		}
	}
	return append(append(flags, "--"), pos...)
}

func isBool(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// usageError prints err and ends with status 1; -h prints the usage and
// ends with 0.
func (e *env) usageError(err error) error {
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(e.stdout, usage)
		return ExitError{exitOK}
	}
	fmt.Fprintln(e.stderr, "sluice ctl:", err)
	return ExitError{exitError}
}

// jsonOut reports whether -o json was asked for.
func (e *env) jsonOut() bool { return e.opts.output == "json" }
