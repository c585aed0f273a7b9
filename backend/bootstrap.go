package backend

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sluicehq/sluice/backend/store"
)

// BootstrapTokenName names the fleet node token the console makes from
// Config.BootstrapNodeToken or Config.BootstrapNodeTokenFile.
const BootstrapTokenName = "bootstrap"

// bootstrapNodeToken gives enforcers started alongside the console (a
// compose file, a first install) a fleet node token with no hand step.
// The secret is secret when given, else the one in file, else a new one
// written to file (mode 0600, through a temporary file and a rename, so a
// reader never sees half a token). The console creates the token when no
// token has that secret, and writes a given secret to file when the file
// holds another. A token that exists is left as it stands: disabled, it
// stays disabled (the nodes using it are refused) and only a warning says
// so; remove the file to have a new one made. A secret that belongs to a
// token other than a fleet node token is an error.
func bootstrapNodeToken(ctx context.Context, st *store.Store, secret, file string, log *slog.Logger, out io.Writer) error {
	if secret == "" && file == "" {
		return nil
	}
	var inFile string
	if file != "" {
		b, err := os.ReadFile(file)
		switch {
		case err == nil:
			inFile = strings.TrimSpace(string(b))
		case !errors.Is(err, fs.ErrNotExist):
			return fmt.Errorf("bootstrap node token: %w", err)
		}
	}
	source, generated := "SLUICE_BOOTSTRAP_NODE_TOKEN", false
	switch {
	case secret != "":
	case inFile != "":
		secret, source = inFile, file
	default:
		b := make([]byte, 32)
		rand.Read(b)
		secret, source, generated = store.TokenPrefix+base64.RawURLEncoding.EncodeToString(b), file, true
		// The file first: a token the console made but failed to write
		// down would be a live credential nobody holds.
		if err := writeSecretFile(file, secret); err != nil {
			return fmt.Errorf("bootstrap node token: %w", err)
		}
	}
	tok, created, err := st.EnsureFleetToken(ctx, BootstrapTokenName, secret, store.Actor{Name: "system:bootstrap"})
	if err != nil {
		return fmt.Errorf("bootstrap node token from %s: %w", source, err)
	}
	if tok.Role != store.RoleNode || !tok.Fleet {
		// Checked before a given secret reaches the file the enforcers read.
		return fmt.Errorf("bootstrap node token from %s: it is the secret of token %d (%q, role %s), not of a fleet node token", source, tok.ID, tok.Name, tok.Role)
	}
	if file != "" && !generated && inFile != secret {
		if err := writeSecretFile(file, secret); err != nil {
			return fmt.Errorf("bootstrap node token: %w", err)
		}
	}
	switch {
	case created && file != "":
		fmt.Fprintf(out, "Created fleet node token %q (id %d) for enforcers; its secret is in %s\n", tok.Name, tok.ID, file)
	case created:
		fmt.Fprintf(out, "Created fleet node token %q (id %d) for enforcers from %s\n", tok.Name, tok.ID, source)
	case tok.Disabled || tok.Expired(time.Now()):
		log.Warn("the bootstrap node token is disabled or expired: nodes connecting with it are refused; remove the token file (or set another token) to have a new one made",
			"token_id", tok.ID, "source", source)
	}
	return nil
}

// writeSecretFile replaces path with secret (and a newline), readable by
// its owner only.
func writeSecretFile(path, secret string) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // after the rename, a no-op
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return err
	}
	if _, err := f.WriteString(secret + "\n"); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
