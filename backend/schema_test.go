package backend_test

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	neturl "net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/migrations"
)

// openDB opens url for the test's own SQL.
func openDB(t *testing.T, url string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func exec(t *testing.T, db *sql.DB, query string) {
	t.Helper()
	if _, err := db.ExecContext(context.Background(), query); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}

// TestConsoleRefusesNewerSchema: a console does not start on a database a
// newer Sluice migrated; it never listens.
func TestConsoleRefusesNewerSchema(t *testing.T) {
	t.Parallel()
	url := testenv.PostgresURL(t)
	exec(t, openDB(t, url), "INSERT INTO goose_db_version (version_id, is_applied) VALUES (9999, true)")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	listened := false
	err := backend.Run(ctx, backend.Config{Listen: "127.0.0.1:0", DatabaseURL: url, AdminPassword: "test-password"},
		slog.New(slog.DiscardHandler), io.Discard, func(net.Addr) { listened = true })
	if !errors.Is(err, migrations.ErrSchemaTooNew) {
		t.Errorf("Run on a newer schema: %v, want ErrSchemaTooNew", err)
	}
	if listened {
		t.Error("the console listened on a newer schema")
	}
}

// TestConsoleReadyzFollowsSchema: a running console's /readyz is 200 while
// its database is at this binary's schema, and 503 while a migration is
// pending or once a newer Sluice has migrated it, so a load balancer takes
// the replica out.
func TestConsoleReadyzFollowsSchema(t *testing.T) {
	t.Parallel()
	url := testenv.PostgresURL(t)
	db := openDB(t, url)
	ctx, cancel := context.WithCancel(context.Background())
	addrs := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() {
		done <- backend.Run(ctx, backend.Config{Listen: "127.0.0.1:0", DatabaseURL: url, AdminPassword: "test-password"},
			slog.New(slog.DiscardHandler), io.Discard, func(a net.Addr) { addrs <- a })
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("console: %v", err)
		}
	})
	var base string
	select {
	case a := <-addrs:
		base = "http://" + a.String()
	case err := <-done:
		t.Fatalf("console stopped: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("console did not listen within 60s")
	}
	readyz := func(want int, wantBody, when string) {
		t.Helper()
		resp, err := http.Get(base + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want || !strings.Contains(string(b), wantBody) {
			t.Errorf("/readyz %s: %d %s, want %d %s", when, resp.StatusCode, b, want, wantBody)
		}
	}

	readyz(200, `"ready"`, "migrated")
	var last int64
	if err := db.QueryRow("SELECT max(version_id) FROM goose_db_version").Scan(&last); err != nil {
		t.Fatal(err)
	}
	exec(t, db, "DELETE FROM goose_db_version WHERE version_id = (SELECT max(version_id) FROM goose_db_version)")
	readyz(503, "not migrated", "with a migration pending")
	if _, err := db.Exec("INSERT INTO goose_db_version (version_id, is_applied) VALUES ($1, true)", last); err != nil {
		t.Fatal(err)
	}
	readyz(200, `"ready"`, "migrated again")
	exec(t, db, "INSERT INTO goose_db_version (version_id, is_applied) VALUES (9999, true)")
	readyz(503, "not migrated", "on a newer schema")
	exec(t, db, "DELETE FROM goose_db_version WHERE version_id = 9999")
	readyz(200, `"ready"`, "back on this binary's schema")

	// The database unreachable: it refuses connections, and the console's
	// open ones are ended.
	adminURL := os.Getenv("DATABASE_URL")
	if adminURL == "" {
		adminURL = testenv.DefaultDatabaseURL
	}
	admin := openDB(t, adminURL)
	u, err := neturl.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	name := strings.TrimPrefix(u.Path, "/")
	exec(t, admin, "ALTER DATABASE "+name+" WITH ALLOW_CONNECTIONS false")
	exec(t, admin, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '"+name+"'")
	readyz(503, "not reachable", "with the database refusing connections")
}
