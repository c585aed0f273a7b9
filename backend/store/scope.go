package store

import (
	"database/sql/driver"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgtype"
)

// RoleRank orders the people's roles: a role may do what every lower one
// may. The node role is outside the ladder (rank 0): it reaches node
// endpoints only.
var RoleRank = map[string]int{RoleViewer: 1, RoleSupport: 2, RoleEditor: 3, RoleAdmin: 4}

// lowerRole returns the lower of two roles of the ladder.
func lowerRole(a, b string) string {
	if RoleRank[b] < RoleRank[a] {
		return b
	}
	return a
}

// Scope is the set of domains a credential's role holds for: every domain,
// or the listed ones only (possibly none, when a token's and its owner's
// lists have nothing in common).
type Scope struct {
	All     bool
	Domains []string // sorted; only when not All
}

// ScopeOf is the scope of a stored domain list: empty means every domain.
func ScopeOf(domains []string) Scope {
	if len(domains) == 0 {
		return Scope{All: true}
	}
	d := slices.Clone(domains)
	slices.Sort(d)
	return Scope{Domains: slices.Compact(d)}
}

// Allows reports whether the scope holds domain.
func (s Scope) Allows(domain string) bool { return s.All || slices.Contains(s.Domains, domain) }

// Narrow returns the domains both scopes hold.
func (s Scope) Narrow(o Scope) Scope {
	switch {
	case s.All:
		return o
	case o.All:
		return s
	}
	out := Scope{Domains: []string{}}
	for _, d := range s.Domains {
		if o.Allows(d) {
			out.Domains = append(out.Domains, d)
		}
	}
	return out
}

// Within reports whether every domain s holds, o holds too.
func (s Scope) Within(o Scope) bool {
	if o.All {
		return true
	}
	if s.All {
		return false
	}
	for _, d := range s.Domains {
		if !o.Allows(d) {
			return false
		}
	}
	return true
}

// String describes the scope for messages.
func (s Scope) String() string {
	switch {
	case s.All:
		return "every domain"
	case len(s.Domains) == 0:
		return "no domain"
	}
	return "domains " + strings.Join(s.Domains, ", ")
}

// MaxGrantDomains bounds a user's or token's domain list.
const MaxGrantDomains = 100

// CheckDomains checks a domain grant list: at most MaxGrantDomains names,
// each a valid domain name.
func CheckDomains(domains []string) error {
	if len(domains) > MaxGrantDomains {
		return &InvalidError{Reason: fmt.Sprintf("at most %d domains", MaxGrantDomains)}
	}
	for _, d := range domains {
		if !validDomainName(d) {
			return &InvalidError{Reason: fmt.Sprintf("domains: %q is not a domain name (letters, digits, '_', '.', '-'; at most 128)", cut(d, 40))}
		}
	}
	return nil
}

func validDomainName(d string) bool {
	if d == "" || len(d) > 128 {
		return false
	}
	for _, r := range d {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '.' || r == '-') {
			return false
		}
	}
	return true
}

func cut(s string, n int) string {
	if len(s) > n {
		return strings.ToValidUTF8(s[:n], "") + "…"
	}
	return s
}

// domainList is a text[] column; NULL and '{}' read as an empty list.
type domainList []string

var pgTypes = pgtype.NewMap()

func (d *domainList) Scan(src any) error {
	var out []string
	if err := pgTypes.SQLScanner(&out).Scan(src); err != nil {
		return fmt.Errorf("read domain list: %w", err)
	}
	*d = out
	return nil
}

// Value renders the list as a Postgres array literal.
func (d domainList) Value() (driver.Value, error) {
	var b strings.Builder
	b.WriteByte('{')
	for i, s := range d {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('"')
		b.WriteString(strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s))
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String(), nil
}
