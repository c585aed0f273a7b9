// Package testenv gives tests real services: a fresh, migrated Postgres
// database per test and a unique Redis key prefix per test. When a service is
// missing the test is skipped, except under CI=true where it fails.
package testenv

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"io/fs"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"

	"github.com/sluicehq/sluice/migrations"
)

// DefaultDatabaseURL is used when DATABASE_URL is unset.
const DefaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// DefaultRedisURL is used when REDIS_URL is unset.
const DefaultRedisURL = "redis://127.0.0.1:6379/0"

func missing(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("required service missing (CI=true): "+format, args...)
	}
	t.Skipf("service missing: "+format, args...)
}

// databaseSlots bounds the test databases one test binary holds at once:
// tests run in parallel (and go test runs packages side by side), and each
// database's consoles and stores keep pooled connections open, so without a
// bound a shared server reaches max_connections (100 by default) and every
// test fails with "too many clients". A slot is held by a top-level test
// from its first PostgresURL until it ends, however many databases it and
// its subtests make (so a test never waits for itself).
var databaseSlots = struct {
	sync.Mutex
	free chan struct{}
	held map[string]int // top-level test name: its PostgresURL calls not yet cleaned up
}{free: make(chan struct{}, maxDatabaseTests), held: map[string]int{}}

// maxDatabaseTests is how many top-level tests of one binary hold databases
// at once; with two binaries side by side and a handful of connections each,
// that stays well under a default server's 100.
const maxDatabaseTests = 4

// holdDatabaseSlot waits for a slot for t's top-level test and releases it
// when the last of that test's databases is cleaned up.
func holdDatabaseSlot(t testing.TB) {
	t.Helper()
	top, _, _ := strings.Cut(t.Name(), "/")
	databaseSlots.Lock()
	n := databaseSlots.held[top]
	databaseSlots.held[top] = n + 1
	databaseSlots.Unlock()
	if n == 0 {
		databaseSlots.free <- struct{}{}
	}
	t.Cleanup(func() {
		databaseSlots.Lock()
		defer databaseSlots.Unlock()
		if databaseSlots.held[top]--; databaseSlots.held[top] == 0 {
			delete(databaseSlots.held, top)
			<-databaseSlots.free
		}
	})
}

// PostgresURL returns the URL of a fresh database, migrated to the latest
// schema, that is dropped when the test ends. It is cloned from a template
// database built once per migration set.
func PostgresURL(t testing.TB) string {
	t.Helper()
	holdDatabaseSlot(t)
	base := os.Getenv("DATABASE_URL")
	if base == "" {
		base = DefaultDatabaseURL
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	admin, err := sql.Open("pgx", base)
	if err != nil {
		t.Fatalf("open postgres: %v", err)
	}
	defer admin.Close()
	if err := admin.PingContext(ctx); err != nil {
		missing(t, "postgres at %s: %v", redact(base), err)
	}
	tmpl, err := template(ctx, admin, base)
	if err != nil {
		t.Fatalf("prepare template database: %v", err)
	}
	name := "sluice_test_" + randomHex(8)
	if _, err := admin.ExecContext(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s", name, tmpl)); err != nil {
		t.Fatalf("create test database: %v", err)
	}
	// Commits do not wait for their WAL to reach the disk (as StartPostgres's
	// servers run): nothing is lost unless the server crashes, which no
	// test does to the shared one, and a test's many small transactions
	// each skip an fsync.
	if _, err := admin.ExecContext(ctx, fmt.Sprintf("ALTER DATABASE %s SET synchronous_commit = off", name)); err != nil {
		t.Fatalf("configure test database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		db, err := sql.Open("pgx", base)
		if err != nil {
			return
		}
		defer db.Close()
		if _, err := db.ExecContext(ctx, fmt.Sprintf("DROP DATABASE IF EXISTS %s WITH (FORCE)", name)); err != nil {
			t.Logf("drop test database %s: %v", name, err)
		}
	})
	return withDatabase(base, name)
}

// template returns the name of a migrated template database, creating it
// under an advisory lock so that parallel test binaries build it once.
func template(ctx context.Context, admin *sql.DB, base string) (string, error) {
	h := fnv.New64a()
	err := fs.WalkDir(migrations.FS, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(migrations.FS, path)
		h.Write([]byte(path))
		h.Write(b)
		return err
	})
	if err != nil {
		return "", err
	}
	name := fmt.Sprintf("sluice_tmpl_%x", h.Sum64())
	conn, err := admin.Conn(ctx)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "SELECT pg_advisory_lock(7301)"); err != nil {
		return "", err
	}
	defer conn.ExecContext(context.Background(), "SELECT pg_advisory_unlock(7301)")
	var exists bool
	if err := conn.QueryRowContext(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		return "", err
	}
	if exists {
		return name, nil
	}
	building := name + "_build"
	if _, err := conn.ExecContext(ctx, fmt.Sprintf("DROP DATABASE IF EXISTS %s", building)); err != nil {
		return "", err
	}
	if _, err := conn.ExecContext(ctx, fmt.Sprintf("CREATE DATABASE %s", building)); err != nil {
		return "", err
	}
	db, err := sql.Open("pgx", withDatabase(base, building))
	if err != nil {
		return "", err
	}
	err = migrations.Up(ctx, db)
	db.Close()
	if err != nil {
		return "", err
	}
	if _, err := conn.ExecContext(ctx, fmt.Sprintf("ALTER DATABASE %s RENAME TO %s", building, name)); err != nil {
		return "", err
	}
	return name, nil
}

func withDatabase(base, name string) string {
	u, err := url.Parse(base)
	if err != nil {
		return base
	}
	u.Path = "/" + name
	// A test database is thrown away after the test: its commits need not
	// wait for the disk (pgx passes unknown parameters to the server as
	// session settings). Dozens of test databases committing side by side
	// on a shared server otherwise queue behind each other's fsyncs.
	q := u.Query()
	if !q.Has("synchronous_commit") {
		q.Set("synchronous_commit", "off")
	}
	u.RawQuery = q.Encode()
	return u.String()
}

func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparseable url)"
	}
	return u.Redacted()
}

// RedisURL returns the URL of a reachable Redis (REDIS_URL or the local
// default). Tests must confine themselves to keys under KeyPrefix.
func RedisURL(t testing.TB) string {
	t.Helper()
	raw := os.Getenv("REDIS_URL")
	if raw == "" {
		raw = DefaultRedisURL
	}
	addr := strings.Split(raw, ",")[0]
	if u, err := url.Parse(addr); err == nil && u.Host != "" {
		addr = u.Host
	}
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		missing(t, "redis at %s: %v", addr, err)
	}
	c.Close()
	return raw
}

// KeyPrefix returns a Redis key prefix unique to this test run.
func KeyPrefix(t testing.TB) string {
	t.Helper()
	return "sluicetest:" + randomHex(6) + ":"
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
