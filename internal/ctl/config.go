package ctl

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"gopkg.in/yaml.v3"
)

// fileConfig is the config file: where the console is and the token to
// use. Both are optional; flags and the environment win over it.
type fileConfig struct {
	ConsoleURL string `yaml:"console_url"`
	Token      string `yaml:"token"`
}

// defaultConsoleURL is where a console listens by default on this machine.
const defaultConsoleURL = "http://127.0.0.1:8080"

// configPath is the config file to read, and whether it was named
// explicitly (then it must exist).
func (e *env) configPath() (string, bool) {
	if e.opts.config != "" {
		return e.opts.config, true
	}
	dir := e.getenv("XDG_CONFIG_HOME")
	if dir == "" {
		home := e.getenv("HOME")
		if home == "" {
			return "", false
		}
		dir = filepath.Join(home, ".config")
	}
	return filepath.Join(dir, "sluice", "ctl.yaml"), false
}

// readSecretFile reads a file holding a secret, warning when users other
// than its owner may read it.
func (e *env) readSecretFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if info, err := f.Stat(); err == nil && info.Mode().Perm()&0o077 != 0 {
		fmt.Fprintf(e.stderr, "sluice ctl: warning: %s holds a token and others may read it (mode %04o); chmod 600 %s\n",
			path, info.Mode().Perm(), path)
	}
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(f); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// connect resolves the console URL and token (flag, environment, config
// file) and sets e.client.
func (e *env) connect() error {
	consoleURL := e.opts.consoleURL
	token := e.getenv("SLUICE_TOKEN")
	if token == "" {
		if path := e.getenv("SLUICE_TOKEN_FILE"); path != "" {
			b, err := e.readSecretFile(path)
			if err != nil {
				return fmt.Errorf("SLUICE_TOKEN_FILE=%q cannot be read: %w", path, err)
			}
			token = strings.TrimSpace(string(b))
		}
	}
	if path, named := e.configPath(); path != "" && (consoleURL == "" || token == "") {
		var cfg fileConfig
		b, err := os.ReadFile(path)
		switch {
		case errors.Is(err, fs.ErrNotExist) && !named:
		case err != nil:
			return fmt.Errorf("config file: %w", err)
		default:
			if err := yaml.Unmarshal(b, &cfg); err != nil {
				return fmt.Errorf("config file %s: %w", path, err)
			}
			if cfg.Token != "" {
				// Only a file that holds a token is a secret.
				if _, err := e.readSecretFile(path); err != nil {
					return fmt.Errorf("config file: %w", err)
				}
			}
		}
		if consoleURL == "" {
			consoleURL = cfg.ConsoleURL
		}
		if token == "" {
			token = cfg.Token
		}
	}
	if consoleURL == "" {
		consoleURL = defaultConsoleURL
	}
	c, err := NewClient(consoleURL, token)
	if err != nil {
		return err
	}
	e.client = c
	return nil
}
