// Package store is the console's Postgres storage: ruleset versions, domain
// revisions, users, sessions, API tokens, the audit chain and the node
// registry. It is the only package that uses gorm; it returns plain Go types.
package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"golang.org/x/crypto/bcrypt"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/sluicehq/sluice/migrations"
)

// Store is the console's database.
type Store struct {
	db  *gorm.DB
	sql *sql.DB
	url string // for the LISTEN session, which is not a pooled connection
	// passwordCost is the bcrypt cost of new password hashes; dummyHash,
	// compared for unknown users, is built at the same cost.
	passwordCost int
	dummyHash    []byte
	// passwords bounds concurrent bcrypt work (see SetPasswordChecks).
	passwords *passwordGate
}

// Option changes how Open sets up a Store.
type Option func(*Store)

// PasswordCost sets the bcrypt cost of the passwords the store hashes
// (bcrypt.DefaultCost when zero). Tests lower it to bcrypt.MinCost. A
// stored hash keeps the cost it was made with.
func PasswordCost(cost int) Option {
	return func(s *Store) {
		if cost != 0 {
			s.passwordCost = cost
		}
	}
}

// Open connects to Postgres. It does not migrate; call Migrate.
func Open(ctx context.Context, databaseURL string, opts ...Option) (*Store, error) {
	st := &Store{url: databaseURL, passwordCost: bcrypt.DefaultCost, passwords: newPasswordGate(0)}
	for _, o := range opts {
		o(st)
	}
	if st.passwordCost < bcrypt.MinCost || st.passwordCost > bcrypt.MaxCost {
		return nil, fmt.Errorf("password cost %d: want %d to %d", st.passwordCost, bcrypt.MinCost, bcrypt.MaxCost)
	}
	dummy, err := bcrypt.GenerateFromPassword([]byte("sluice-dummy-password"), st.passwordCost)
	if err != nil {
		return nil, fmt.Errorf("hash dummy password: %w", err)
	}
	st.dummyHash = dummy
	db, err := gorm.Open(postgres.Open(databaseURL), &gorm.Config{
		TranslateError:         true,
		Logger:                 logger.Discard,
		SkipDefaultTransaction: true,
		NowFunc:                func() time.Time { return time.Now().UTC().Truncate(time.Microsecond) },
	})
	if err != nil {
		return nil, fmt.Errorf("open database: %w", err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, fmt.Errorf("open database: %w", err)
	}
	sqlDB.SetMaxOpenConns(20)
	sqlDB.SetMaxIdleConns(10)
	sqlDB.SetConnMaxIdleTime(5 * time.Minute)
	if err := sqlDB.PingContext(ctx); err != nil {
		sqlDB.Close()
		return nil, fmt.Errorf("connect to database: %w", err)
	}
	st.db, st.sql = db, sqlDB
	return st, nil
}

// Close closes the connection pool.
func (s *Store) Close() error { return s.sql.Close() }

// Migrate applies pending migrations and refuses a newer schema.
func (s *Store) Migrate(ctx context.Context) error { return migrations.Up(ctx, s.sql) }

// Ready reports whether the database answers and is migrated to this
// binary's schema.
func (s *Store) Ready(ctx context.Context) error {
	if err := s.sql.PingContext(ctx); err != nil {
		return fmt.Errorf("ping database: %w", err)
	}
	return migrations.Check(ctx, s.sql)
}

// notFound maps gorm's not-found error to ErrNotFound.
func notFound(err error, what string) error {
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return fmt.Errorf("%s: %w", what, ErrNotFound)
	}
	return fmt.Errorf("%s: %w", what, err)
}
