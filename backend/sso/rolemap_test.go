package sso

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestRoleMapGrant(t *testing.T) {
	t.Parallel()
	m, err := ParseRoleMap(`
# people at the provider → Sluice
sre=admin
team-api=editor:api,api-internal; team-search=editor:search
cn=oncall,ou=groups=editor
support=support
*=viewer`)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		groups []string
		want   Grant
	}{
		{"everyone", nil, Grant{Role: "viewer"}},
		{"unmapped groups", []string{"marketing"}, Grant{Role: "viewer"}},
		{"one scoped group", []string{"team-api"}, Grant{Role: "editor", Domains: []string{"api", "api-internal"}}},
		{"two scoped groups of one role", []string{"team-search", "team-api"}, Grant{Role: "editor", Domains: []string{"api", "api-internal", "search"}}},
		{"a scoped and an unscoped entry of one role", []string{"team-api", "cn=oncall,ou=groups"}, Grant{Role: "editor"}},
		{"the highest role wins", []string{"team-api", "sre", "support"}, Grant{Role: "admin"}},
		{"lower roles add no domains", []string{"support", "team-search"}, Grant{Role: "editor", Domains: []string{"search"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := m.Grant(tc.groups)
			if !ok {
				t.Fatalf("Grant(%q): no grant", tc.groups)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Grant(%q) (-want +got):\n%s", tc.groups, diff)
			}
		})
	}

	strict, err := ParseRoleMap("sre=admin")
	if err != nil {
		t.Fatal(err)
	}
	if g, ok := strict.Grant([]string{"staff"}); ok {
		t.Errorf("a person in no mapped group got %+v", g)
	}
	if got, want := m.String(), "sre=admin;team-api=editor:api,api-internal;team-search=editor:search;cn=oncall,ou=groups=editor;support=support;*=viewer"; got != want {
		t.Errorf("String() = %q; want %q", got, want)
	}
}

func TestParseRoleMapRefuses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"sre", "want GROUP=ROLE"},
		{"=admin", "want GROUP=ROLE"},
		{"sre=root", `role "root" is not one of`},
		{"sre=node", `role "node" is not one of`},
		{"sre=admin:", "domain is required"},
		{"sre=admin:api,,search", "domain is required"},
		{"sre=admin:a b", "may contain only"},
		{"sre=admin; sre=viewer", `group "sre" is mapped twice`},
		{";#sre=admin", "may not start with '#'"},
		{strings.Repeat("g=viewer;", 10000), "over 65536 bytes"},
	} {
		if _, err := ParseRoleMap(tc.in); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseRoleMap(%.40q) = %v; want an error with %q", tc.in, err, tc.want)
		}
	}
	if m, err := ParseRoleMap(" ; \n# nothing\n"); err != nil || !m.Empty() {
		t.Errorf("blank map = %v, %v; want empty, no error", m, err)
	}
}

func FuzzParseRoleMap(f *testing.F) {
	for _, s := range []string{"sre=admin", "a=editor:x,y;b=viewer", "cn=a,ou=b=support", "*=viewer\n#c\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParseRoleMap(s)
		if err != nil {
			return
		}
		// What parses, written back, parses to the same map.
		again, err := ParseRoleMap(m.String())
		if err != nil {
			t.Fatalf("ParseRoleMap(%q) = %v after %q parsed", m.String(), err, s)
		}
		if again.String() != m.String() {
			t.Fatalf("round trip %q → %q", m.String(), again.String())
		}
		if g, ok := m.Grant([]string{"*", s}); ok && roleRank[g.Role] == 0 {
			t.Fatalf("granted unknown role %q", g.Role)
		}
	})
}

func TestIdentityUsername(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		id   Identity
		want string
	}{
		{Identity{PreferredUsername: "bob", Email: "b@x.io", Subject: "1"}, "bob"},
		{Identity{Email: "Bob.Smith@example.com", Subject: "1"}, "Bob.Smith@example.com"},
		{Identity{PreferredUsername: "José Núñez", Subject: "1"}, "Jos-N-ez"},
		{Identity{PreferredUsername: "///", Subject: "abc|123"}, "sso-abc-123"},
		{Identity{Subject: strings.Repeat("s", 100)}, "sso-" + strings.Repeat("s", 60)},
		{Identity{}, "sso-user"},
	} {
		if got := tc.id.Username(); got != tc.want {
			t.Errorf("%+v.Username() = %q; want %q", tc.id, got, tc.want)
		}
	}
}
