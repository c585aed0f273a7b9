package testenv

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"testing"
	"time"
)

// Postgres is a private Postgres server a test started (StartPostgres), to
// be stopped and restarted under a console.
type Postgres struct {
	t      testing.TB
	bindir string
	dir    string // data directory, also the socket directory
	port   int
	asUser string // "postgres" when the test runs as root, which Postgres refuses
}

// StartPostgres initializes and starts a private Postgres server (initdb and
// pg_ctl from the Debian postgresql package, /usr/lib/postgresql/*/bin, or
// from PATH) on a free port with trust auth and fsync off. It is stopped
// and removed when the test ends. Missing binaries skip the test, or fail
// it under CI=true.
func StartPostgres(t testing.TB) *Postgres {
	t.Helper()
	bindir := pgBindir()
	if bindir == "" {
		missing(t, "postgres server binaries (initdb, pg_ctl; Debian package postgresql)")
	}
	p := &Postgres{t: t, bindir: bindir, port: FreePort(t)}
	dir, err := os.MkdirTemp("", "sluice-pg-")
	if err != nil {
		t.Fatal(err)
	}
	p.dir = dir
	t.Cleanup(func() { os.RemoveAll(dir) })
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("running as root needs user postgres to run the server: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
		p.asUser = "postgres"
	}
	if out, err := p.command("initdb", "-D", filepath.Join(dir, "data"), "-U", "postgres",
		"--auth=trust", "-E", "UTF8", "--no-locale", "--no-sync").CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	p.Start()
	t.Cleanup(func() { p.command("pg_ctl", "-D", p.data(), "-m", "immediate", "-w", "stop").Run() })
	return p
}

func pgBindir() string {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Sort(sort.Reverse(sort.StringSlice(dirs))) // newest major first
	for _, d := range dirs {
		if isExecutable(filepath.Join(d, "initdb")) && isExecutable(filepath.Join(d, "pg_ctl")) {
			return d
		}
	}
	initdb, err1 := exec.LookPath("initdb")
	_, err2 := exec.LookPath("pg_ctl")
	if err1 == nil && err2 == nil {
		return filepath.Dir(initdb)
	}
	return ""
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode()&0o111 != 0
}

func (p *Postgres) data() string { return filepath.Join(p.dir, "data") }

func (p *Postgres) command(name string, args ...string) *exec.Cmd {
	bin := filepath.Join(p.bindir, name)
	if p.asUser != "" {
		return exec.Command("runuser", append([]string{"-u", p.asUser, "--", bin}, args...)...)
	}
	return exec.Command(bin, args...)
}

// URL is the server's postgres database, for connecting as an admin.
func (p *Postgres) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", p.port)
}

// Start starts the server and waits until it accepts connections.
func (p *Postgres) Start() {
	p.t.Helper()
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off", p.port, p.dir)
	cmd := p.command("pg_ctl", "-D", p.data(), "-l", filepath.Join(p.dir, "server.log"), "-o", opts, "-w", "-t", "60", "start")
	if out, err := cmd.CombinedOutput(); err != nil {
		log, _ := os.ReadFile(filepath.Join(p.dir, "server.log"))
		p.t.Fatalf("pg_ctl start: %v\n%s\n%s", err, out, log)
	}
}

// Stop stops the server with a fast shutdown: sessions are disconnected,
// committed work is kept.
func (p *Postgres) Stop() {
	p.t.Helper()
	if out, err := p.command("pg_ctl", "-D", p.data(), "-m", "fast", "-w", "-t", "60", "stop").CombinedOutput(); err != nil {
		p.t.Fatalf("pg_ctl stop: %v\n%s", err, out)
	}
}

// CreateDatabase creates a database cloned from the migrated template (as
// PostgresURL does on the shared server) and returns its URL.
func (p *Postgres) CreateDatabase() string {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	admin, err := sql.Open("pgx", p.URL())
	if err != nil {
		p.t.Fatal(err)
	}
	defer admin.Close()
	tmpl, err := template(ctx, admin, p.URL())
	if err != nil {
		p.t.Fatalf("prepare template database: %v", err)
	}
	name := "sluice_test_" + randomHex(8)
	if _, err := admin.ExecContext(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s", name, tmpl)); err != nil {
		p.t.Fatalf("create test database: %v", err)
	}
	return withDatabase(p.URL(), name)
}
