package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"time"
)

// flagSet is a FlagSet whose flags take their defaults from the environment.
type flagSet struct {
	*flag.FlagSet
	getenv func(string) string
	badEnv []string // environment values that could not be read
}

func newFlagSet(name string, getenv func(string) string, stderr io.Writer) *flagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return &flagSet{FlagSet: fs, getenv: getenv}
}

// string defines a string flag defaulting to env (or its *_FILE variant,
// for secrets) and then to def. A *_FILE that cannot be read is an error at
// parse time, never an empty secret.
func (f *flagSet) string(p *string, name, env, def, help string) {
	if v := f.getenv(env); v != "" {
		def = v
	} else if path := f.getenv(env + "_FILE"); path != "" {
		if b, err := os.ReadFile(path); err == nil {
			def = strings.TrimSpace(string(b))
		} else {
			f.badEnv = append(f.badEnv, fmt.Sprintf("%s_FILE=%q cannot be read: %v", env, path, err))
		}
	}
	f.StringVar(p, name, def, help+" (env "+env+")")
}

// stringNoFile is string without the *_FILE variant: for a secret whose
// file is a flag of its own, read later (and perhaps waited for or
// written) rather than at parse time.
func (f *flagSet) stringNoFile(p *string, name, env, def, help string) {
	if v := f.getenv(env); v != "" {
		def = v
	}
	f.StringVar(p, name, def, help+" (env "+env+")")
}

func (f *flagSet) bool(p *bool, name, env string, def bool, help string) {
	switch strings.ToLower(f.getenv(env)) {
	case "1", "true", "yes", "on":
		def = true
	case "0", "false", "no", "off":
		def = false
	}
	f.BoolVar(p, name, def, help+" (env "+env+")")
}

// duration defines a duration flag defaulting to env, then to def. An env
// value that is not a duration is an error at parse time.
func (f *flagSet) duration(p *time.Duration, name, env string, def time.Duration, help string) {
	if v := f.getenv(env); v != "" {
		if d, err := time.ParseDuration(v); err == nil {
			def = d
		} else {
			f.badEnv = append(f.badEnv, fmt.Sprintf("%s=%q is not a duration like 720h", env, v))
		}
	}
	f.DurationVar(p, name, def, help+" (env "+env+")")
}

// int defines an int flag defaulting to env, then to def. An env value
// that is not a whole number is an error at parse time.
func (f *flagSet) int(p *int, name, env string, def int, help string) {
	if v := f.getenv(env); v != "" {
		if n, err := strconv.Atoi(v); err == nil {
			def = n
		} else {
			f.badEnv = append(f.badEnv, fmt.Sprintf("%s=%q is not a whole number", env, v))
		}
	}
	f.IntVar(p, name, def, help+" (env "+env+")")
}

// parse parses args; -h prints usage and ends with status 0.
func (f *flagSet) parse(args []string) error {
	if len(f.badEnv) > 0 {
		fmt.Fprintln(f.Output(), strings.Join(f.badEnv, "\n"))
		return exitError{2}
	}
	if err := f.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitError{0}
		}
		return exitError{2}
	}
	return nil
}

func newLogger(level string, w io.Writer) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log level %q: use debug, info, warn or error", level)
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l})), nil
}

func buildVersion() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "devel"
	}
	v := info.Main.Version
	for _, s := range info.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			v += " " + s.Value[:12]
		}
	}
	return v
}

// redact hides a URL's password for --print-config. Values that are not
// URLs (a list of Redis Cluster seeds) carry no password and stay as they are.
func redact(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.User == nil {
		return s
	}
	return u.Redacted()
}

// secretFilePoll is how often waitForSecretFile looks for its file, and
// secretFileNag how often it says it is still waiting.
const (
	secretFilePoll = 200 * time.Millisecond
	secretFileNag  = 30 * time.Second
)

// waitForSecretFile returns the trimmed content of path once it exists and
// is not empty: a token another process writes (the console's bootstrap
// token on a shared volume) may appear after this process starts. It
// returns "" when ctx ends first, and an error only when the file exists
// but cannot be read.
func waitForSecretFile(ctx context.Context, path string, log *slog.Logger) (string, error) {
	var nagged time.Time
	for {
		b, err := os.ReadFile(path)
		switch {
		case err == nil && strings.TrimSpace(string(b)) != "":
			return strings.TrimSpace(string(b)), nil
		case err != nil && !errors.Is(err, fs.ErrNotExist):
			return "", err
		}
		if time.Since(nagged) >= secretFileNag {
			log.Info("waiting for the node token file", "path", path)
			nagged = time.Now()
		}
		select {
		case <-ctx.Done():
			return "", nil
		case <-time.After(secretFilePoll):
		}
	}
}
