package store_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/rules/wire"
)

const overrideDomain = `domain: api
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 100}
`

func overrideSpec(value string, in time.Duration) store.OverrideSpec {
	return store.OverrideSpec{Domain: "api", Entries: []rules.Entry{{Key: "api_key", Value: value}},
		RateLimit: store.OverrideRate{Unit: "hour", RequestsPerUnit: 8}, ExpiresAt: time.Now().Add(in), Message: "ticket 42"}
}

func auditActions(t *testing.T, st *store.Store, action string) []store.AuditEvent {
	t.Helper()
	evs, _, err := st.ListAudit(context.Background(), store.AuditFilter{Action: action})
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

func enforced(t *testing.T, st *store.Store, v int64, domain string) store.DomainRevision {
	t.Helper()
	snap, err := st.FindSnapshot(context.Background(), v)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range snap.Domains {
		if d.Name == domain {
			return d
		}
	}
	t.Fatalf("version %d has no domain %s", v, domain)
	return store.DomainRevision{}
}

// TestOverrideLifecycle creates an override, edits the domain's YAML while
// it is active, and ends it: each step is a version, the override rides
// over the new YAML, and the domain's own YAML never holds it.
func TestOverrideLifecycle(t *testing.T) {
	t.Parallel()
	st, _ := open(t)
	ctx := context.Background()
	v1 := publish(t, st, store.Change{Domain: "api", YAML: overrideDomain})
	id, v2, err := st.CreateOverride(ctx, overrideSpec("k1", time.Hour), actor)
	if err != nil {
		t.Fatal(err)
	}
	if v2 != v1+1 {
		t.Fatalf("override version %d, want %d", v2, v1+1)
	}
	d := enforced(t, st, v2, "api")
	if d.YAML != overrideDomain || len(d.Overrides) != 1 || d.Overrides[0].ID != id {
		t.Fatalf("v%d domain: yaml %q overrides %+v; want the domain's own YAML and the override", v2, d.YAML, d.Overrides)
	}
	if !strings.HasPrefix(d.Enforced(), overrideDomain) || !strings.Contains(d.Enforced(), "value: k1") {
		t.Fatalf("enforced YAML:\n%s", d.Enforced())
	}
	s1, _ := st.FindSnapshot(ctx, v1)
	s2, _ := st.FindSnapshot(ctx, v2)
	if s1.Checksum == s2.Checksum {
		t.Error("the override did not change the checksum")
	}
	if dom, _ := st.FindDomain(ctx, "api"); dom.YAML != overrideDomain || dom.Version != v1 {
		t.Errorf("FindDomain = v%d %q, want the YAML of v%d", dom.Version, dom.YAML, v1)
	}
	meta, _ := st.FindVersion(ctx, v2)
	if len(meta.Domains) != 1 || meta.Domains[0] != "api" || meta.Author != actor.Name {
		t.Errorf("version %d: domains %v author %s", v2, meta.Domains, meta.Author)
	}
	vs, _, _ := st.ListVersions(ctx, store.VersionFilter{Domain: "api"})
	if len(vs) != 2 || vs[0].Version != v2 {
		t.Errorf("versions of api: %+v, want v%d and v%d", vs, v2, v1)
	}

	// Staff edit the YAML (their base is their own last edit): the
	// override stays.
	edited := strings.Replace(overrideDomain, "100", "200", 1)
	v3 := publish(t, st, store.Change{Domain: "api", YAML: edited, BaseVersion: v1})
	d = enforced(t, st, v3, "api")
	if d.YAML != edited || len(d.Overrides) != 1 || !strings.Contains(d.Enforced(), "requests_per_unit: 200") ||
		!strings.Contains(d.Enforced(), "value: k1") {
		t.Fatalf("after the edit: yaml %q overrides %+v enforced:\n%s", d.YAML, d.Overrides, d.Enforced())
	}

	if _, _, err := st.CreateOverride(ctx, overrideSpec("k1", time.Hour), actor); !errors.Is(err, rules.ErrConflict) {
		t.Errorf("a second override of the same entries: %v, want a conflict", err)
	}
	v4, err := st.EndOverride(ctx, id, store.OverrideEnded, "customer launched", store.Actor{Name: "user:bob"})
	if err != nil {
		t.Fatal(err)
	}
	if d := enforced(t, st, v4, "api"); len(d.Overrides) != 0 || d.Enforced() != edited {
		t.Errorf("after the end: overrides %+v enforced %q", d.Overrides, d.Enforced())
	}
	// History keeps what each version enforced.
	if d := enforced(t, st, v3, "api"); len(d.Overrides) != 1 {
		t.Errorf("version %d lost its override: %+v", v3, d.Overrides)
	}
	o, err := st.FindOverride(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if o.Status != store.OverrideEnded || o.EndedVersion == nil || *o.EndedVersion != v4 || o.EndedBy != "user:bob" || o.Version != v2 {
		t.Errorf("ended override: %+v", o)
	}
	if _, err := st.EndOverride(ctx, id, store.OverrideEnded, "again", actor); !errors.Is(err, rules.ErrConflict) {
		t.Errorf("ending it twice: %v, want a conflict", err)
	}
	if n := len(auditActions(t, st, "override.create")); n != 1 {
		t.Errorf("%d override.create events, want 1", n)
	}
	if n := len(auditActions(t, st, "override.end")); n != 1 {
		t.Errorf("%d override.end events, want 1", n)
	}
	// Every version's stored checksum is what its snapshot hashes to, as
	// nodes check it.
	for v := v1; v <= v4; v++ {
		snap, err := st.FindSnapshot(ctx, v)
		if err != nil {
			t.Fatal(err)
		}
		if got := wire.Checksum(snap.WireDomains()); got != snap.Checksum {
			t.Errorf("version %d: snapshot hashes to %s, its checksum is %s", v, got, snap.Checksum)
		}
	}
	if res, err := st.VerifyAudit(ctx); err != nil || !res.OK {
		t.Errorf("audit chain: %+v %v", res, err)
	}
}

func TestOverrideRefused(t *testing.T) {
	t.Parallel()
	st, _ := open(t)
	ctx := context.Background()
	publish(t, st, store.Change{Domain: "api", YAML: overrideDomain})
	for _, tc := range []struct {
		name  string
		spec  store.OverrideSpec
		check func(error) bool
	}{
		{"matches no limit", func() store.OverrideSpec {
			s := overrideSpec("k1", time.Hour)
			s.Entries = []rules.Entry{{Key: "user", Value: "u1"}}
			return s
		}(), func(err error) bool {
			var ue *store.UnprocessableError
			return errors.As(err, &ue) && strings.Contains(ue.Reason, "match no limit")
		}},
		{"unknown domain", func() store.OverrideSpec { s := overrideSpec("k1", time.Hour); s.Domain = "nope"; return s }(),
			func(err error) bool { return errors.Is(err, rules.ErrNotFound) }},
		{"expired", overrideSpec("k1", -time.Second), func(err error) bool {
			var ue *store.UnprocessableError
			return errors.As(err, &ue)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, _, err := st.CreateOverride(ctx, tc.spec, actor); !tc.check(err) {
				t.Errorf("CreateOverride: %v", err)
			}
		})
	}
	if v, _ := st.CurrentVersion(ctx); v != 1 {
		t.Errorf("refused overrides published: at version %d", v)
	}
}

// TestExpireOverridesOnce has eight callers expire the same override at
// once, as replicas might: exactly one version, authored system.
func TestExpireOverridesOnce(t *testing.T) {
	t.Parallel()
	st, _ := open(t)
	ctx := context.Background()
	publish(t, st, store.Change{Domain: "api", YAML: overrideDomain})
	id, _, err := st.CreateOverride(ctx, overrideSpec("k1", time.Minute), actor)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.CreateOverride(ctx, overrideSpec("k2", time.Hour), actor); err != nil {
		t.Fatal(err)
	}
	if vs, err := st.ExpireOverrides(ctx, time.Now()); err != nil || len(vs) != 0 {
		t.Fatalf("expired before its time: %v %v", vs, err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var all []int64
	for range 8 {
		wg.Go(func() {
			vs, err := st.ExpireOverrides(ctx, time.Now().Add(2*time.Minute))
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			all = append(all, vs...)
			mu.Unlock()
		})
	}
	wg.Wait()
	if len(all) != 1 {
		t.Fatalf("versions published: %v, want exactly one", all)
	}
	meta, _ := st.FindVersion(ctx, all[0])
	if meta.Author != "system" {
		t.Errorf("author %q, want system", meta.Author)
	}
	o, _ := st.FindOverride(ctx, id)
	if o.Status != store.OverrideExpired || o.EndedBy != "system" {
		t.Errorf("override: %+v", o)
	}
	if evs := auditActions(t, st, "override.expire"); len(evs) != 1 || evs[0].Actor != "system" {
		t.Errorf("override.expire events: %+v", evs)
	}
	if d := enforced(t, st, all[0], "api"); len(d.Overrides) != 1 || d.Overrides[0].Entries[0].Value != "k2" {
		t.Errorf("after the expiry: %+v, want only k2's override", d.Overrides)
	}
	if next, _ := st.NextOverrideExpiry(ctx); next.IsZero() {
		t.Error("no next expiry, want k2's")
	}
}

// TestOverrideApproval: with four-eyes on an override waits for a second
// person, unless urgent (break-glass, audited); ending one never waits.
func TestOverrideApproval(t *testing.T) {
	t.Parallel()
	st, _ := open(t)
	ctx := context.Background()
	publish(t, st, store.Change{Domain: "api", YAML: overrideDomain})
	requireApproval(t, st, true)

	spec := overrideSpec("k1", time.Hour)
	if _, _, err := st.CreateOverride(ctx, spec, actor); !errors.Is(err, store.ErrApprovalRequired) {
		t.Fatalf("CreateOverride with approval on: %v", err)
	}
	cr, err := st.Propose(ctx, store.Change{Kind: store.KindOverride, Domain: "api", Override: &spec, Message: spec.Message, Actor: actor})
	if err != nil {
		t.Fatal(err)
	}
	if cr.Kind != store.KindOverride || cr.Override == nil {
		t.Fatalf("change request: %+v", cr)
	}
	if _, err := st.Approve(ctx, cr.ID, actor, ""); !errors.Is(err, store.ErrSelfApproval) {
		t.Fatalf("self-approval: %v", err)
	}
	cr, err = st.Approve(ctx, cr.ID, store.Actor{Name: "user:bob"}, "ok")
	if err != nil {
		t.Fatal(err)
	}
	ovs, _, _ := st.ListOverrides(ctx, store.OverrideFilter{Domain: "api"})
	if len(ovs) != 1 || ovs[0].Status != store.OverrideActive || ovs[0].ChangeID == nil || *ovs[0].ChangeID != cr.ID ||
		ovs[0].Author != actor.Name || ovs[0].Version != *cr.Version || ovs[0].Urgent {
		t.Fatalf("approved override: %+v", ovs)
	}

	urgent := overrideSpec("k2", time.Hour)
	urgent.Urgent = true
	_, v, err := st.CreateOverride(ctx, urgent, actor)
	if err != nil {
		t.Fatal(err)
	}
	evs := auditActions(t, st, "override.break_glass")
	if len(evs) != 1 || evs[0].Actor != actor.Name || evs[0].Message != "ticket 42" {
		t.Errorf("override.break_glass events: %+v", evs)
	}
	ovs, _, _ = st.ListOverrides(ctx, store.OverrideFilter{Domain: "api", Status: store.OverrideActive})
	if len(ovs) != 2 || !ovs[0].Urgent || ovs[0].Version != v {
		t.Errorf("active overrides: %+v", ovs)
	}
	if _, err := st.EndOverride(ctx, ovs[0].ID, store.OverrideEnded, "done", actor); err != nil {
		t.Errorf("ending with approval on: %v", err)
	}
}

func TestDeletedDomainEndsOverrides(t *testing.T) {
	t.Parallel()
	st, _ := open(t)
	ctx := context.Background()
	v1 := publish(t, st, store.Change{Domain: "api", YAML: overrideDomain})
	id, _, err := st.CreateOverride(ctx, overrideSpec("k1", time.Hour), actor)
	if err != nil {
		t.Fatal(err)
	}
	v := publish(t, st, store.Change{Kind: store.KindDelete, Domain: "api", BaseVersion: v1})
	o, _ := st.FindOverride(ctx, id)
	if o.Status != store.OverrideEnded || o.EndedVersion == nil || *o.EndedVersion != v {
		t.Errorf("override of a deleted domain: %+v", o)
	}
	v = publish(t, st, store.Change{Domain: "api", YAML: overrideDomain, BaseVersion: v})
	if d := enforced(t, st, v, "api"); len(d.Overrides) != 0 {
		t.Errorf("a new domain of the same name got the old override: %+v", d.Overrides)
	}
}
