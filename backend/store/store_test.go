package store_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib"
	"golang.org/x/crypto/bcrypt"

	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/internal/testenv"
)

func open(t *testing.T) (*store.Store, string) {
	t.Helper()
	url := testenv.PostgresURL(t)
	st, err := store.Open(context.Background(), url, store.PasswordCost(bcrypt.MinCost)) // fast hashing; TestPasswordCost covers the default
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st, url
}

func domainYAML(name string, n int) string {
	return fmt.Sprintf("domain: %s\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: %d}\n", name, n)
}

// TestConcurrentPublish has 20 publishers on 4 domains, each retrying on
// conflict: versions must be contiguous, every change present, the audit
// chain intact.
func TestConcurrentPublish(t *testing.T) {
	t.Parallel()
	st, _ := open(t)
	ctx := context.Background()
	const publishers, each = 20, 3
	var wg sync.WaitGroup
	errc := make(chan error, publishers)
	for p := range publishers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			domain := fmt.Sprintf("d%d", p%4)
			for i := 0; i < each; {
				base := int64(0)
				if d, err := st.FindDomain(ctx, domain); err == nil {
					base = d.Version
				}
				_, err := st.Publish(ctx, store.Change{Domain: domain, YAML: domainYAML(domain, p*100+i+1), BaseVersion: base,
					Message: "m", Actor: store.Actor{Name: fmt.Sprintf("p%d", p)}})
				if errors.Is(err, store.ErrConflict) {
					continue
				}
				if err != nil {
					errc <- err
					return
				}
				i++
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	vs, _, err := st.ListVersions(ctx, store.VersionFilter{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(vs), publishers*each; got != want {
		t.Fatalf("versions = %d, want %d", got, want)
	}
	for i, v := range vs {
		if want := int64(len(vs) - i); v.Version != want {
			t.Fatalf("versions not contiguous: position %d is %d, want %d", i, v.Version, want)
		}
	}
	snap, err := st.FindSnapshot(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Domains) != 4 {
		t.Fatalf("latest snapshot has %d domains, want 4", len(snap.Domains))
	}
	res, err := st.VerifyAudit(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !res.OK || res.Events != publishers*each {
		t.Fatalf("audit verify = %+v, want ok with %d events", res, publishers*each)
	}
}

// TestAuditTamperDetected edits a row behind the trigger's back.
func TestAuditTamperDetected(t *testing.T) {
	t.Parallel()
	st, url := open(t)
	ctx := context.Background()
	for i := range 3 {
		if _, err := st.Publish(ctx, store.Change{Domain: "a", YAML: domainYAML("a", i+1), BaseVersion: int64(i), Message: "m", Actor: store.Actor{Name: "x"}}); err != nil {
			t.Fatal(err)
		}
	}
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, "UPDATE audit_events SET message = 'edited' WHERE id = 2"); err == nil {
		t.Fatal("UPDATE on audit_events succeeded; the trigger should refuse it")
	}
	if _, err := db.ExecContext(ctx, "DELETE FROM audit_events WHERE id = 1"); err == nil {
		t.Fatal("DELETE on audit_events succeeded; the trigger should refuse it")
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		"ALTER TABLE audit_events DISABLE TRIGGER audit_events_no_update",
		"UPDATE audit_events SET message = 'edited' WHERE id = 2",
		"ALTER TABLE audit_events ENABLE TRIGGER audit_events_no_update",
	} {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	res, err := st.VerifyAudit(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.OK || res.BrokenID != 2 {
		t.Fatalf("verify = %+v, want broken at 2", res)
	}
}

func TestRollbackRestoresContent(t *testing.T) {
	t.Parallel()
	st, _ := open(t)
	ctx := context.Background()
	a := store.Actor{Name: "x"}
	v1, _ := st.Publish(ctx, store.Change{Domain: "a", YAML: domainYAML("a", 1), Message: "m", Actor: a})
	v2, _ := st.Publish(ctx, store.Change{Domain: "b", YAML: domainYAML("b", 1), Message: "m", Actor: a})
	if _, err := st.Publish(ctx, store.Change{Domain: "a", YAML: domainYAML("a", 2), BaseVersion: v2, Message: "m", Actor: a}); err != nil {
		t.Fatal(err)
	}
	v4, err := st.Publish(ctx, store.Change{Kind: store.KindRollback, RollbackTo: v1, Message: "undo", Actor: a})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := st.FindSnapshot(ctx, v4)
	if err != nil {
		t.Fatal(err)
	}
	old, _ := st.FindSnapshot(ctx, v1)
	if snap.Checksum != old.Checksum || len(snap.Domains) != 1 || snap.Domains[0].YAML != domainYAML("a", 1) {
		t.Fatalf("rollback snapshot = %+v, want version %d's content", snap, v1)
	}
	meta, _ := st.FindVersion(ctx, v4)
	if meta.RollbackOf == nil || *meta.RollbackOf != v1 {
		t.Fatalf("rollback_of = %v, want %d", meta.RollbackOf, v1)
	}
}
