package main

import (
	"regexp"
	"strings"
	"testing"
)

// flagInfo is one flag of a subcommand, as its -h lists it.
type flagInfo struct {
	name, env, def string
}

var (
	flagLineRE    = regexp.MustCompile(`^  -([A-Za-z0-9-]+)`)
	flagEnvRE     = regexp.MustCompile(`\(env ([A-Z0-9_]+)\)`)
	flagDefaultRE = regexp.MustCompile(`\(default "?([^")]*)"?\)`)
)

// binaryFlags returns the flags of `sluice CMD` by running `sluice CMD -h`
// through run: the binary's own flag set, each with its environment
// variable and default.
func binaryFlags(t *testing.T, cmd string) map[string]flagInfo {
	t.Helper()
	code, stdout, stderr := runCLI(t, cmd, "-h")
	if code != 0 {
		t.Fatalf("sluice %s -h: exit %d: %s", cmd, code, stderr)
	}
	out := map[string]flagInfo{}
	var cur *flagInfo
	flush := func() {
		if cur != nil {
			out[cur.name] = *cur
		}
	}
	for _, line := range strings.Split(stdout+stderr, "\n") {
		if m := flagLineRE.FindStringSubmatch(line); m != nil {
			flush()
			cur = &flagInfo{name: m[1]}
			line = line[len(m[0]):]
		}
		if cur == nil {
			continue
		}
		if m := flagEnvRE.FindStringSubmatch(line); m != nil {
			cur.env = m[1]
		}
		if m := flagDefaultRE.FindStringSubmatch(line); m != nil {
			cur.def = m[1]
		}
	}
	flush()
	if len(out) < 3 {
		t.Fatalf("sluice %s -h listed %d flags: is its format still flag.PrintDefaults'?", cmd, len(out))
	}
	return out
}

// enforcerDefault is the default of one of the enforcer's flags.
func enforcerDefault(t *testing.T, name string) string {
	t.Helper()
	f, ok := binaryFlags(t, "enforcer")[name]
	if !ok {
		t.Fatalf("sluice enforcer has no flag --%s", name)
	}
	return f.def
}
