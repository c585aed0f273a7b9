package migrations

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/pressly/goose/v3"
)

// ErrSchemaTooNew means the database was migrated by a newer Sluice than this
// binary; running on it could corrupt data, so the console refuses to start.
var ErrSchemaTooNew = errors.New("database schema is newer than this binary")

func provider(db *sql.DB) (*goose.Provider, error) {
	p, err := goose.NewProvider(goose.DialectPostgres, db, FS)
	if err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	return p, nil
}

// Up applies every pending migration. It refuses a database whose schema is
// newer than this binary knows.
func Up(ctx context.Context, db *sql.DB) error {
	p, err := provider(db)
	if err != nil {
		return err
	}
	if err := checkNotNewer(ctx, p); err != nil {
		return err
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("apply migrations: %w", err)
	}
	return nil
}

// Check reports whether the database is migrated to exactly this binary's
// latest version (used by /readyz).
func Check(ctx context.Context, db *sql.DB) error {
	p, err := provider(db)
	if err != nil {
		return err
	}
	if err := checkNotNewer(ctx, p); err != nil {
		return err
	}
	pending, err := p.HasPending(ctx)
	if err != nil {
		return fmt.Errorf("check migrations: %w", err)
	}
	if pending {
		return errors.New("database has pending migrations")
	}
	return nil
}

func checkNotNewer(ctx context.Context, p *goose.Provider) error {
	current, err := p.GetDBVersion(ctx)
	if err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	srcs := p.ListSources()
	var latest int64
	if len(srcs) > 0 {
		latest = srcs[len(srcs)-1].Version
	}
	if current > latest {
		return fmt.Errorf("%w: database at %d, binary knows %d", ErrSchemaTooNew, current, latest)
	}
	return nil
}
