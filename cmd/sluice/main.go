// Command sluice is Sluice's single binary: the console, the enforcer, the
// rules checker, migrations and a one-machine dev mode. main only parses
// flags and wires packages together; see run.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		var ee exitError
		if errors.As(err, &ee) {
			os.Exit(ee.code)
		}
		fmt.Fprintln(os.Stderr, "sluice:", err)
		os.Exit(1)
	}
}

// exitError ends the process with a code after its output was printed.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

const usage = `Usage: sluice <command> [flags]

Commands:
  console        run the console (API, UI, node push)
  enforcer       run an enforcer node
  ctl            the GitOps CLI against a console: rules export|diff|apply|import,
                 versions, rollback, audit, nodes, tokens (sluice ctl -h)
  dev            run a console and an enforcer on this machine with demo rules
  bench          load an enforcer with checks and print checks/s and latency
  migrate        apply database migrations
  rules          check, format and compare rule files (sluice rules -h)
  version        print the version

Run "sluice <command> -h" for a command's flags. Every flag also reads an
environment variable (SLUICE_*, DATABASE_URL, REDIS_URL).
`

// run is the whole program, callable from tests.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitError{2}
	}
	switch args[0] {
	case "console":
		return runConsole(ctx, args[1:], getenv, stdout, stderr)
	case "enforcer":
		return runEnforcer(ctx, args[1:], getenv, stdout, stderr)
	case "dev":
		return runDev(ctx, args[1:], getenv, stdout, stderr)
	case "bench":
		return runBench(ctx, args[1:], getenv, stdout, stderr)
	case "migrate":
		return runMigrate(ctx, args[1:], getenv, stdout, stderr)
	case "rules":
		return runRules(args[1:], getenv, stdout, stderr)
	case "ctl":
		return runCtl(ctx, args[1:], getenv, stdout, stderr)
	case "version", "--version", "-version":
		fmt.Fprintf(stdout, "sluice %s\n", buildVersion())
		return nil
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprintf(stderr, "sluice: unknown command %q\n\n%s", args[0], usage)
	return exitError{2}
}
