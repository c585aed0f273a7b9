package store_test

import (
	"context"
	"database/sql"
	"testing"

	"golang.org/x/crypto/bcrypt"

	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/internal/testenv"
)

// TestPasswordCost: passwords are hashed at bcrypt.DefaultCost unless the
// store is opened with another cost; a hash keeps its own cost, so a user
// created at one cost signs in through a store opened at another; a cost
// bcrypt refuses is refused by Open.
func TestPasswordCost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testenv.PostgresURL(t)
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	for _, c := range []struct {
		name, user string
		opts       []store.Option
		want       int
	}{
		{"default", "dflt", nil, bcrypt.DefaultCost},
		{"zero is the default", "zero", []store.Option{store.PasswordCost(0)}, bcrypt.DefaultCost},
		{"lowered", "low", []store.Option{store.PasswordCost(bcrypt.MinCost)}, bcrypt.MinCost},
	} {
		st, err := store.Open(ctx, url, c.opts...)
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		if _, err := st.CreateUser(ctx, c.user, "password1", store.RoleViewer, actor); err != nil {
			t.Fatal(err)
		}
		var hash string
		if err := db.QueryRowContext(ctx, "SELECT password_hash FROM users WHERE username = $1", c.user).Scan(&hash); err != nil {
			t.Fatal(err)
		}
		if got, err := bcrypt.Cost([]byte(hash)); err != nil || got != c.want {
			t.Errorf("%s: hash cost = %d, %v; want %d", c.name, got, err, c.want)
		}
	}
	other, err := store.Open(ctx, url, store.PasswordCost(bcrypt.MinCost+1))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	for _, u := range []string{"dflt", "low"} {
		if _, err := other.Authenticate(ctx, u, "password1"); err != nil {
			t.Errorf("sign in as %s through a store at another cost: %v", u, err)
		}
	}
	for _, cost := range []int{bcrypt.MinCost - 1, bcrypt.MaxCost + 1} {
		if st, err := store.Open(ctx, url, store.PasswordCost(cost)); err == nil {
			st.Close()
			t.Errorf("Open with password cost %d succeeded, want an error", cost)
		}
	}
}
