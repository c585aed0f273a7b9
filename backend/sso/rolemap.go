package sso

import (
	"fmt"
	"slices"
	"strings"

	"github.com/sluicehq/sluice/rules"
)

// The roles a mapping may grant, lowest first (the store's names).
var roleRank = map[string]int{"viewer": 1, "support": 2, "editor": 3, "admin": 4}

// maxRoleMapBytes bounds a role map; a real one is a few lines.
const maxRoleMapBytes = 64 << 10

// Grant is a role, for some domains only or (Domains empty) for every one.
type Grant struct {
	Role    string
	Domains []string
}

// RoleMap turns a person's groups at the identity provider into their role
// and domain grants in Sluice. It is written as entries
// GROUP=ROLE or GROUP=ROLE:DOMAIN,DOMAIN separated by ';' or new lines
// ('#' starts a comment line), e.g.
//
//	sre=admin; rate-limit-api=editor:api,api-internal; staff=viewer
//
// The group is everything before the last '=' (so LDAP-style names such as
// cn=sre,ou=groups work); group '*' matches everyone the provider signs in.
// A person in several mapped groups gets the highest role among them; the
// domains of that role are the union of its entries' domains, or every
// domain if any entry of that role names none. Entries of lower roles add
// nothing: a role limited to some domains still reads every domain.
type RoleMap struct {
	entries []entry
}

type entry struct {
	group string
	grant Grant
}

// ParseRoleMap reads a role map (see RoleMap). Errors name the entry.
func ParseRoleMap(s string) (RoleMap, error) {
	if len(s) > maxRoleMapBytes {
		return RoleMap{}, fmt.Errorf("role map: over %d bytes", maxRoleMapBytes)
	}
	var m RoleMap
	seen := map[string]bool{}
	for _, line := range strings.Split(s, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		for _, raw := range strings.Split(line, ";") {
			e := strings.TrimSpace(raw)
			if e == "" {
				continue
			}
			i := strings.LastIndex(e, "=")
			if i <= 0 {
				return RoleMap{}, fmt.Errorf("role map entry %q: want GROUP=ROLE or GROUP=ROLE:DOMAIN,DOMAIN", e)
			}
			group, rhs := strings.TrimSpace(e[:i]), strings.TrimSpace(e[i+1:])
			if strings.HasPrefix(group, "#") {
				return RoleMap{}, fmt.Errorf("role map entry %q: a group may not start with '#' (a comment starts a line)", e)
			}
			role, list, scoped := strings.Cut(rhs, ":")
			role = strings.TrimSpace(role)
			if roleRank[role] == 0 {
				return RoleMap{}, fmt.Errorf("role map entry %q: role %q is not one of viewer, support, editor, admin", e, role)
			}
			g := Grant{Role: role}
			if scoped {
				for _, d := range strings.Split(list, ",") {
					d = strings.TrimSpace(d)
					if msg := rules.DomainNameProblem(d); msg != "" {
						return RoleMap{}, fmt.Errorf("role map entry %q: %s", e, msg)
					}
					g.Domains = append(g.Domains, d)
				}
			}
			if seen[group] {
				return RoleMap{}, fmt.Errorf("role map: group %q is mapped twice", group)
			}
			seen[group] = true
			m.entries = append(m.entries, entry{group: group, grant: g})
		}
	}
	return m, nil
}

// Empty reports whether the map has no entries (then nobody gets a role).
func (m RoleMap) Empty() bool { return len(m.entries) == 0 }

// Grant returns the grant for someone in groups, and false if no entry
// matches them.
func (m RoleMap) Grant(groups []string) (Grant, bool) {
	in := map[string]bool{"*": true}
	for _, g := range groups {
		in[g] = true
	}
	var best Grant
	everywhere := false
	for _, e := range m.entries {
		if !in[e.group] {
			continue
		}
		switch r, b := roleRank[e.grant.Role], roleRank[best.Role]; {
		case r > b:
			best = Grant{Role: e.grant.Role, Domains: slices.Clone(e.grant.Domains)}
			everywhere = len(e.grant.Domains) == 0
		case r == b:
			everywhere = everywhere || len(e.grant.Domains) == 0
			best.Domains = append(best.Domains, e.grant.Domains...)
		}
	}
	if best.Role == "" {
		return Grant{}, false
	}
	if everywhere {
		best.Domains = nil
	}
	slices.Sort(best.Domains)
	best.Domains = slices.Compact(best.Domains)
	return best, true
}

// String writes the map back in its own syntax (for --print-config).
func (m RoleMap) String() string {
	parts := make([]string, len(m.entries))
	for i, e := range m.entries {
		parts[i] = e.group + "=" + e.grant.Role
		if len(e.grant.Domains) > 0 {
			parts[i] += ":" + strings.Join(e.grant.Domains, ",")
		}
	}
	return strings.Join(parts, ";")
}
