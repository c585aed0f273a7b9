package migrations_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/migrations"
)

// migratedDB opens a fresh database migrated to this binary's schema.
func migratedDB(t *testing.T) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// TestNewerSchemaRefused: a database a newer Sluice migrated (its goose
// version beyond this binary's last migration) is refused by Up, so the
// console does not start on it, and by Check, so /readyz is 503.
func TestNewerSchemaRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := migratedDB(t)
	if err := migrations.Check(ctx, db); err != nil {
		t.Fatalf("Check on a migrated database: %v, want nil", err)
	}
	if err := migrations.Up(ctx, db); err != nil {
		t.Fatalf("Up on a migrated database: %v, want nil (nothing to do)", err)
	}
	if _, err := db.ExecContext(ctx, "INSERT INTO goose_db_version (version_id, is_applied) VALUES (9999, true)"); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Up(ctx, db); !errors.Is(err, migrations.ErrSchemaTooNew) {
		t.Errorf("Up on a newer schema: %v, want ErrSchemaTooNew", err)
	}
	if err := migrations.Check(ctx, db); !errors.Is(err, migrations.ErrSchemaTooNew) {
		t.Errorf("Check on a newer schema: %v, want ErrSchemaTooNew", err)
	}
}

// TestPendingMigrationsNotReady: a database behind this binary's schema
// (its last migration not applied) fails Check, which /readyz answers.
func TestPendingMigrationsNotReady(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := migratedDB(t)
	if _, err := db.ExecContext(ctx, "DELETE FROM goose_db_version WHERE version_id = (SELECT max(version_id) FROM goose_db_version)"); err != nil {
		t.Fatal(err)
	}
	err := migrations.Check(ctx, db)
	if err == nil || errors.Is(err, migrations.ErrSchemaTooNew) {
		t.Errorf("Check with a migration pending: %v, want a pending-migrations error", err)
	}
}
