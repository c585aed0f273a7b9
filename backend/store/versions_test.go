package store_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend/store"
)

var actor = store.Actor{Name: "user:alice"}

func publish(t *testing.T, st *store.Store, c store.Change) int64 {
	t.Helper()
	if c.Actor.Name == "" {
		c.Actor = actor
	}
	if c.Message == "" {
		c.Message = "m"
	}
	v, err := st.Publish(context.Background(), c)
	if err != nil {
		t.Fatalf("publish %+v: %v", c, err)
	}
	return v
}

func TestPublishErrors(t *testing.T) {
	t.Parallel()
	st, _ := open(t)
	ctx := context.Background()
	publish(t, st, store.Change{Domain: "a", YAML: domainYAML("a", 1)})                 // v1
	publish(t, st, store.Change{Domain: "b", YAML: domainYAML("b", 1)})                 // v2
	publish(t, st, store.Change{Domain: "a", YAML: domainYAML("a", 2), BaseVersion: 1}) // v3

	tests := []struct {
		name   string
		change store.Change
		check  func(error) bool
	}{
		{"stale base names the version", store.Change{Domain: "a", YAML: domainYAML("a", 3), BaseVersion: 2}, func(err error) bool {
			var ce *store.ConflictError
			return errors.As(err, &ce) && ce.ChangedIn == 3 && ce.Base == 2 && errors.Is(err, store.ErrConflict)
		}},
		{"new domain that exists", store.Change{Domain: "b", YAML: domainYAML("b", 3)}, func(err error) bool {
			return errors.Is(err, store.ErrConflict)
		}},
		{"base ahead of head", store.Change{Domain: "c", YAML: domainYAML("c", 1), BaseVersion: 99}, func(err error) bool {
			var ie *store.InvalidError
			return errors.As(err, &ie)
		}},
		{"delete unknown", store.Change{Kind: store.KindDelete, Domain: "zz", BaseVersion: 3}, func(err error) bool {
			return errors.Is(err, store.ErrNotFound)
		}},
		{"rollback to future", store.Change{Kind: store.KindRollback, RollbackTo: 4}, func(err error) bool {
			return errors.Is(err, store.ErrNotFound)
		}},
		{"rollback with stale base", store.Change{Kind: store.KindRollback, RollbackTo: 1, BaseVersion: 2}, func(err error) bool {
			var ce *store.ConflictError
			return errors.As(err, &ce) && ce.Domain == "" && ce.ChangedIn == 3
		}},
		{"domain rollback of a domain that never was", store.Change{Kind: store.KindDomainRollback, Domain: "nope", RollbackTo: 1}, func(err error) bool {
			return errors.Is(err, store.ErrNotFound)
		}},
		{"domain rollback with stale base", store.Change{Kind: store.KindDomainRollback, Domain: "a", RollbackTo: 1, BaseVersion: 1}, func(err error) bool {
			return errors.Is(err, store.ErrConflict)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := tt.change
			c.Message, c.Actor = "m", actor
			_, err := st.Publish(ctx, c)
			if !tt.check(err) {
				t.Fatalf("Publish = %v (%T)", err, errors.Unwrap(err))
			}
		})
	}
	if v, _ := st.CurrentVersion(ctx); v != 3 {
		t.Fatalf("failed publishes moved the head to %d, want 3", v)
	}
}

func TestDomainRollback(t *testing.T) {
	t.Parallel()
	st, _ := open(t)
	ctx := context.Background()
	v1 := publish(t, st, store.Change{Domain: "a", YAML: domainYAML("a", 1)})
	v2 := publish(t, st, store.Change{Domain: "b", YAML: domainYAML("b", 1)})
	publish(t, st, store.Change{Domain: "a", YAML: domainYAML("a", 2), BaseVersion: v1})
	publish(t, st, store.Change{Domain: "b", YAML: domainYAML("b", 2), BaseVersion: v2})

	v5 := publish(t, st, store.Change{Kind: store.KindDomainRollback, Domain: "a", RollbackTo: v1})
	snap, err := st.FindSnapshot(ctx, v5)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, d := range snap.Domains {
		got[d.Name] = d.YAML
	}
	if got["a"] != domainYAML("a", 1) || got["b"] != domainYAML("b", 2) {
		t.Fatalf("after rolling a back to %d: %v; want a at 1 and b untouched at 2", v1, got)
	}
	meta, err := st.FindVersion(ctx, v5)
	if err != nil {
		t.Fatal(err)
	}
	if meta.RollbackOf == nil || *meta.RollbackOf != v1 || len(meta.Domains) != 1 || meta.Domains[0] != "a" {
		t.Fatalf("version %d = %+v, want rollback_of %d changing only a", v5, meta, v1)
	}
	// Rolling b back to v1, where it did not exist, removes it.
	v6 := publish(t, st, store.Change{Kind: store.KindDomainRollback, Domain: "b", RollbackTo: v1})
	if _, err := st.FindDomain(ctx, "b"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("b after rollback to %d (version %d): %v, want not found", v1, v6, err)
	}
}

func TestListVersionsFilters(t *testing.T) {
	t.Parallel()
	st, _ := open(t)
	ctx := context.Background()
	bob := store.Actor{Name: "user:bob"}
	publish(t, st, store.Change{Domain: "a", YAML: domainYAML("a", 1)})                             // 1 alice a
	publish(t, st, store.Change{Domain: "b", YAML: domainYAML("b", 1), Actor: bob})                 // 2 bob b
	publish(t, st, store.Change{Domain: "a", YAML: domainYAML("a", 2), BaseVersion: 1, Actor: bob}) // 3 bob a
	publish(t, st, store.Change{Kind: store.KindRollback, RollbackTo: 1})                           // 4 alice a,b
	versions := func(f store.VersionFilter) ([]int64, int64) {
		t.Helper()
		vs, next, err := st.ListVersions(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		out := []int64{}
		for _, v := range vs {
			out = append(out, v.Version)
		}
		return out, next
	}
	tests := []struct {
		name string
		f    store.VersionFilter
		want []int64
		next int64
	}{
		{"all", store.VersionFilter{}, []int64{4, 3, 2, 1}, 0},
		{"domain a", store.VersionFilter{Domain: "a"}, []int64{4, 3, 1}, 0},
		{"domain b", store.VersionFilter{Domain: "b"}, []int64{4, 2}, 0},
		{"author bob", store.VersionFilter{Author: "user:bob"}, []int64{3, 2}, 0},
		{"page 1", store.VersionFilter{Limit: 2}, []int64{4, 3}, 3},
		{"page 2", store.VersionFilter{Limit: 2, Before: 3}, []int64{2, 1}, 0},
		{"future", store.VersionFilter{Since: time.Now().Add(time.Hour)}, []int64{}, 0},
		{"past", store.VersionFilter{Until: time.Now().Add(-time.Hour)}, []int64{}, 0},
		{"window", store.VersionFilter{Since: time.Now().Add(-time.Hour), Until: time.Now().Add(time.Hour), Author: "user:alice"}, []int64{4, 1}, 0},
	}
	for _, tt := range tests {
		got, next := versions(tt.f)
		if !equal(got, tt.want) || next != tt.next {
			t.Errorf("%s: versions %v next %d, want %v next %d", tt.name, got, next, tt.want, tt.next)
		}
	}
	vs, _, _ := st.ListVersions(ctx, store.VersionFilter{Limit: 1})
	if d := vs[0].Domains; len(d) != 2 || d[0] != "a" || d[1] != "b" {
		t.Errorf("version 4 changed %v, want [a b]", d)
	}
}

func equal(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestHistoryImmutable checks that the database itself refuses to edit
// published versions.
func TestHistoryImmutable(t *testing.T) {
	t.Parallel()
	st, url := open(t)
	publish(t, st, store.Change{Domain: "a", YAML: domainYAML("a", 1)})
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, q := range []string{
		"UPDATE versions SET message = 'x'",
		"DELETE FROM versions",
		"UPDATE domain_revisions SET yaml = 'x'",
		"DELETE FROM domain_revisions",
	} {
		if _, err := db.Exec(q); err == nil {
			t.Errorf("%s succeeded; history must be append-only", q)
		}
	}
}
