package store_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend/store"
)

func TestLastAdminKeepsTheKeys(t *testing.T) {
	t.Parallel()
	st, _ := open(t)
	ctx := context.Background()
	root, err := st.CreateUser(ctx, "root", "password1", store.RoleAdmin, actor)
	if err != nil {
		t.Fatal(err)
	}
	var re *store.RefusedError
	if _, err := st.SetUserDisabled(ctx, root.ID, true, actor); !errors.As(err, &re) {
		t.Fatalf("disable last admin = %v, want refused", err)
	}
	if _, err := st.SetUserRole(ctx, root.ID, store.RoleEditor, actor); !errors.As(err, &re) {
		t.Fatalf("demote last admin = %v, want refused", err)
	}
	second, err := st.CreateUser(ctx, "second", "password2", store.RoleAdmin, actor)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.SetUserRole(ctx, root.ID, store.RoleEditor, actor); err != nil {
		t.Fatalf("demote with another admin: %v", err)
	}
	if _, err := st.SetUserDisabled(ctx, second.ID, true, actor); !errors.As(err, &re) {
		t.Fatalf("disable the now last admin = %v, want refused", err)
	}
	if _, err := st.CreateUser(ctx, "root", "password3", store.RoleViewer, actor); !errors.As(err, &re) {
		t.Fatalf("duplicate username = %v, want refused", err)
	}
	var ie *store.InvalidError
	if _, err := st.CreateUser(ctx, "x", "password", "root", actor); !errors.As(err, &ie) {
		t.Fatalf("bad role = %v, want invalid", err)
	}
	if _, err := st.CreateUser(ctx, "y", string(make([]byte, 73)), store.RoleViewer, actor); !errors.As(err, &ie) {
		t.Fatalf("73-byte password = %v, want invalid", err)
	}
}

func TestDisableEndsSessions(t *testing.T) {
	t.Parallel()
	st, _ := open(t)
	ctx := context.Background()
	if _, err := st.CreateUser(ctx, "admin", "password0", store.RoleAdmin, actor); err != nil {
		t.Fatal(err)
	}
	u, err := st.CreateUser(ctx, "carol", "password1", store.RoleEditor, actor)
	if err != nil {
		t.Fatal(err)
	}
	secret, _, err := st.CreateSession(ctx, u, actor)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.FindSession(ctx, secret); err != nil {
		t.Fatal(err)
	}
	if _, err := st.SetUserDisabled(ctx, u.ID, true, actor); err != nil {
		t.Fatal(err)
	}
	if _, err := st.FindSession(ctx, secret); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("session of a disabled user = %v, want not found", err)
	}
	if _, err := st.Authenticate(ctx, "carol", "password1"); !errors.Is(err, store.ErrBadCredentials) {
		t.Fatalf("disabled user signs in: %v", err)
	}
	if _, err := st.SetUserDisabled(ctx, u.ID, false, actor); err != nil {
		t.Fatal(err)
	}
	if _, err := st.FindSession(ctx, secret); !errors.Is(err, store.ErrNotFound) {
		t.Fatal("re-enabling a user revived an old session")
	}
	if _, err := st.Authenticate(ctx, "carol", "password1"); err != nil {
		t.Fatalf("re-enabled user: %v", err)
	}
}

func TestPasswords(t *testing.T) {
	t.Parallel()
	st, _ := open(t)
	ctx := context.Background()
	u, err := st.CreateUser(ctx, "dave", "password1", store.RoleViewer, actor)
	if err != nil {
		t.Fatal(err)
	}
	keep, _, _ := st.CreateSession(ctx, u, actor)
	other, _, _ := st.CreateSession(ctx, u, actor)
	if err := st.ChangePassword(ctx, u.ID, "wrong", "password2", keep, actor); !errors.Is(err, store.ErrBadCredentials) {
		t.Fatalf("wrong current password = %v", err)
	}
	if err := st.ChangePassword(ctx, u.ID, "password1", "password2", keep, actor); err != nil {
		t.Fatal(err)
	}
	if _, err := st.FindSession(ctx, keep); err != nil {
		t.Fatalf("the session that changed the password ended: %v", err)
	}
	if _, err := st.FindSession(ctx, other); err == nil {
		t.Fatal("another session survived a password change")
	}
	if _, err := st.Authenticate(ctx, "dave", "password2"); err != nil {
		t.Fatal(err)
	}
	if _, err := st.ResetPassword(ctx, u.ID, "password3", actor); err != nil {
		t.Fatal(err)
	}
	if _, err := st.FindSession(ctx, keep); err == nil {
		t.Fatal("a session survived an admin's password reset")
	}
	if _, err := st.Authenticate(ctx, "dave", "password2"); err == nil {
		t.Fatal("old password works after reset")
	}
	if _, err := st.Authenticate(ctx, "dave", "password3"); err != nil {
		t.Fatal(err)
	}
}

func TestSessionExpiry(t *testing.T) {
	t.Parallel()
	st, url := open(t)
	ctx := context.Background()
	u, err := st.CreateUser(ctx, "erin", "password1", store.RoleViewer, actor)
	if err != nil {
		t.Fatal(err)
	}
	idle, _, _ := st.CreateSession(ctx, u, actor)
	absolute, _, _ := st.CreateSession(ctx, u, actor)
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	// Age the sessions in the database rather than waiting.
	if _, err := db.Exec("UPDATE sessions SET last_seen = now() - $1::interval WHERE id_hash = encode(sha256($2::bytea), 'hex')",
		(store.SessionIdle + time.Minute).String(), idle); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("UPDATE sessions SET expires_at = now() - interval '1 second' WHERE id_hash = encode(sha256($1::bytea), 'hex')", absolute); err != nil {
		t.Fatal(err)
	}
	for name, secret := range map[string]string{"idle": idle, "absolute": absolute} {
		if _, err := st.FindSession(ctx, secret); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("%s-expired session = %v, want not found", name, err)
		}
	}
}

func TestTokens(t *testing.T) {
	t.Parallel()
	st, _ := open(t)
	ctx := context.Background()
	tok, secret, err := st.CreateToken(ctx, "ci", store.RoleEditor, nil, store.Actor{Name: "token:boot#1", Owner: "user:root"})
	if err != nil {
		t.Fatal(err)
	}
	if tok.CreatedBy != "user:root" || tok.Last4 != secret[len(secret)-4:] || len(secret) < 40 {
		t.Fatalf("token %+v secret %q", tok, secret)
	}
	rotated, fresh, err := st.RotateToken(ctx, tok.ID, actor)
	if err != nil {
		t.Fatal(err)
	}
	if fresh == secret || rotated.Last4 != fresh[len(fresh)-4:] || rotated.RotatedAt == nil {
		t.Fatalf("rotated %+v", rotated)
	}
	if _, err := st.FindToken(ctx, secret); !errors.Is(err, store.ErrNotFound) {
		t.Fatal("the old secret works after rotation")
	}
	if _, err := st.FindToken(ctx, fresh); err != nil {
		t.Fatalf("new secret: %v", err)
	}
	if _, err := st.DisableToken(ctx, tok.ID, actor); err != nil {
		t.Fatal(err)
	}
	if _, err := st.FindToken(ctx, fresh); !errors.Is(err, store.ErrNotFound) {
		t.Fatal("a disabled token works")
	}
	var re *store.RefusedError
	if _, _, err := st.RotateToken(ctx, tok.ID, actor); !errors.As(err, &re) {
		t.Fatalf("rotate disabled = %v, want refused", err)
	}
	past := time.Now().Add(-time.Second)
	old, oldSecret, _ := st.CreateToken(ctx, "old", store.RoleViewer, &past, actor)
	if _, err := st.FindToken(ctx, oldSecret); !errors.Is(err, store.ErrNotFound) {
		t.Fatal("an expired token works")
	}
	if _, _, err := st.RotateToken(ctx, old.ID, actor); !errors.As(err, &re) {
		t.Fatalf("rotate expired = %v, want refused", err)
	}
	list, err := st.ListTokens(ctx)
	if err != nil || len(list) != 2 || list[0].ID != old.ID {
		t.Fatalf("list = %+v %v", list, err)
	}
}
