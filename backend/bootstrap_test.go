package backend

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/crypto/bcrypt"

	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/internal/testenv"
)

func openStore(t *testing.T) *store.Store {
	t.Helper()
	st, err := store.Open(context.Background(), testenv.PostgresURL(t), store.PasswordCost(bcrypt.MinCost))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if err := st.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return st
}

// fleetTokens lists the store's fleet node tokens.
func fleetTokens(t *testing.T, st *store.Store) []store.Token {
	t.Helper()
	all, err := st.ListTokens(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var out []store.Token
	for _, tok := range all {
		if tok.Fleet {
			out = append(out, tok)
		}
	}
	return out
}

// TestBootstrapNodeToken: with a token file and no token, the first start
// makes a fleet node token and writes it to the file (0600), later starts
// keep it, a database started afresh gets it again from the file, a given
// token replaces the file's, and a disabled token stays disabled.
func TestBootstrapNodeToken(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := openStore(t)
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	file := filepath.Join(t.TempDir(), "bootstrap", "node-token")

	// Neither: nothing happens.
	if err := bootstrapNodeToken(ctx, st, "", "", log, &bytes.Buffer{}); err != nil || len(fleetTokens(t, st)) != 0 {
		t.Fatalf("no token, no file: %v, %d fleet tokens", err, len(fleetTokens(t, st)))
	}

	var out bytes.Buffer
	if err := bootstrapNodeToken(ctx, st, "", file, log, &out); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	secret := strings.TrimSpace(string(b))
	if fi, _ := os.Stat(file); fi.Mode().Perm() != 0o600 {
		t.Errorf("token file mode %v, want 0600", fi.Mode().Perm())
	}
	tok, err := st.FindToken(ctx, secret)
	if err != nil || !tok.Fleet || tok.Role != store.RoleNode || tok.Name != BootstrapTokenName || tok.Owner != nil {
		t.Fatalf("the file's token: %+v, %v; want a live fleet node token named %q without an owner", tok, err, BootstrapTokenName)
	}
	if !strings.Contains(out.String(), file) || strings.Contains(out.String(), secret) {
		t.Errorf("the console says %q: want the file named and the secret not shown", out.String())
	}

	// A restart keeps both.
	out.Reset()
	if err := bootstrapNodeToken(ctx, st, "", file, log, &out); err != nil {
		t.Fatal(err)
	}
	if b2, _ := os.ReadFile(file); string(b2) != string(b) || len(fleetTokens(t, st)) != 1 || out.Len() != 0 {
		t.Errorf("restart: file %q (was %q), %d fleet tokens, said %q; want all unchanged", b2, b, len(fleetTokens(t, st)), out.String())
	}

	// A fresh database with the same volume: the file's token again.
	fresh := openStore(t)
	if err := bootstrapNodeToken(ctx, fresh, "", file, log, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	if _, err := fresh.FindToken(ctx, secret); err != nil {
		t.Errorf("fresh database: the file's token: %v", err)
	}

	// A given token is made and written over the file's.
	given := "slc_given-in-dot-env-0123456789abcdef"
	if err := bootstrapNodeToken(ctx, st, given, file, log, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(file); strings.TrimSpace(string(b)) != given {
		t.Errorf("file after a given token: %q, want it", b)
	}
	if tok, err := st.FindToken(ctx, given); err != nil || !tok.Fleet {
		t.Errorf("given token: %+v, %v", tok, err)
	}

	// Disabled, it stays so: no new token, a warning.
	givenTok, _ := st.FindToken(ctx, given)
	if _, err := st.DisableToken(ctx, givenTok.ID, store.Actor{Name: "test"}); err != nil {
		t.Fatal(err)
	}
	before := len(fleetTokens(t, st))
	if err := bootstrapNodeToken(ctx, st, "", file, log, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	if n := len(fleetTokens(t, st)); n != before {
		t.Errorf("%d fleet tokens after a restart with a disabled one, want %d", n, before)
	}
	if _, err := st.FindToken(ctx, given); err == nil {
		t.Error("the disabled bootstrap token works again")
	}
	if !strings.Contains(logs.String(), "disabled") {
		t.Errorf("no warning about the disabled token; logs:\n%s", logs.String())
	}

	// Refused: a short secret, and the secret of a token of another kind.
	if err := bootstrapNodeToken(ctx, st, "short", "", log, &bytes.Buffer{}); err == nil {
		t.Error("a short given token: accepted")
	}
	_, admin, err := st.CreateToken(ctx, "admin", store.RoleAdmin, nil, store.Actor{Name: "test"})
	if err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(t.TempDir(), "node-token")
	if err := bootstrapNodeToken(ctx, st, admin, other, log, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "not of a fleet node token") {
		t.Errorf("an admin token as the bootstrap token: %v, want refused", err)
	}
	if _, err := os.Stat(other); err == nil {
		t.Error("the admin token was written to the node token file")
	}
}
