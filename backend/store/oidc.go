package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/sluicehq/sluice/rules"
)

// ErrUserDisabled refuses a single sign-on for a user an admin disabled in
// the console: the provider vouches for who they are, not that they may in.
var ErrUserDisabled = errors.New("this Sluice account is disabled")

// OIDCIdentity is a person an OpenID provider signed in, with the role and
// domain grants the console's role map gives them.
type OIDCIdentity struct {
	Issuer  string
	Subject string
	// Username is the name wanted for a new user (the provider's
	// preferred_username or email, already in the username alphabet); a
	// taken name gets a numeric suffix. An existing user keeps theirs.
	Username string
	Role     string
	// Domains limits the role to these domains; empty means every domain.
	Domains []string
}

// maxUsernameBytes matches the API's username pattern.
const maxUsernameBytes = 64

// SignInOIDC links id to its user (found by issuer and subject, created on
// the first sign-in), sets the user's role and domain grants to id's, and
// starts a session, all in one transaction. The audit trail gets
// user.create for a new user and user.role (with the domains) when the
// role or domains changed, both by actor system:oidc, and auth.login with
// method oidc by the user. The provider's word on the role is final for a
// linked user, even for the last enabled admin: the local break-glass admin
// keeps the console administrable. A disabled user gets ErrUserDisabled and
// nothing changes.
func (s *Store) SignInOIDC(ctx context.Context, id OIDCIdentity, actor Actor) (u User, secret, csrf string, err error) {
	if id.Issuer == "" || id.Subject == "" {
		return User{}, "", "", &InvalidError{Reason: "an identity needs an issuer and a subject"}
	}
	if err := userRole(id.Role); err != nil {
		return User{}, "", "", err
	}
	domains := slices.Clone(id.Domains)
	if domains == nil {
		domains = []string{}
	}
	slices.Sort(domains)
	domains = slices.Compact(domains)
	err = s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		// Two first sign-ins of one person at once must make one user.
		if err := tx.Exec("SELECT pg_advisory_xact_lock(hashtext(?), hashtext(?))", "oidc:"+id.Issuer, id.Subject).Error; err != nil {
			return fmt.Errorf("lock identity: %w", err)
		}
		var row userRow
		err := tx.Clauses(clause.Locking{Strength: "UPDATE"}).
			Where("oidc_issuer = ? AND oidc_subject = ?", id.Issuer, id.Subject).Take(&row).Error
		switch {
		case errors.Is(err, gorm.ErrRecordNotFound):
			if row, err = createOIDCUser(tx, id, domains, actor); err != nil {
				return err
			}
		case err != nil:
			return fmt.Errorf("find user: %w", err)
		case row.Disabled:
			return ErrUserDisabled
		default:
			before, err := readDomains(tx, row.ID)
			if err != nil {
				return err
			}
			if row.Role != id.Role || !slices.Equal(before, domains) {
				if err := tx.Exec("UPDATE users SET role = ?, domains = "+textArray+" WHERE id = ?", id.Role, jsonText(domains), row.ID).Error; err != nil {
					return fmt.Errorf("write grants: %w", err)
				}
				act := actor
				act.Name, act.Owner = "system:oidc", ""
				if err := appendAudit(tx, act, "user.role", userTarget(row), "from the identity provider at sign-in",
					map[string]any{"role": row.Role, "domains": before}, map[string]any{"role": id.Role, "domains": domains}); err != nil {
					return err
				}
				row.Role = id.Role
			}
		}
		u = row.user()
		actor.Name, actor.Owner = "user:"+u.Username, ""
		secret, csrf, err = startSession(tx, u, actor, map[string]any{"method": "oidc", "issuer": id.Issuer})
		return err
	})
	if err != nil {
		return User{}, "", "", fmt.Errorf("sign in with oidc: %w", err)
	}
	return u, secret, csrf, nil
}

// createOIDCUser adds the user for id, named id.Username or, when that is
// taken, id.Username with the first free suffix -2, -3, ... A provider's
// user never takes over a local account of the same name.
func createOIDCUser(tx *gorm.DB, id OIDCIdentity, domains []string, actor Actor) (userRow, error) {
	base := id.Username
	if base == "" {
		base = "sso-user"
	}
	for n := 1; n <= 1000; n++ {
		name := base
		if n > 1 {
			suffix := "-" + strconv.Itoa(n)
			name = base[:min(len(base), maxUsernameBytes-len(suffix))] + suffix
		} else if len(name) > maxUsernameBytes {
			name = name[:maxUsernameBytes]
		}
		var taken int64
		if err := tx.Model(&userRow{}).Where("username = ?", name).Count(&taken).Error; err != nil {
			return userRow{}, fmt.Errorf("check username: %w", err)
		}
		if taken > 0 {
			continue
		}
		// A savepoint keeps the transaction usable if a concurrent
		// sign-up took the name between the check and the insert.
		if err := tx.SavePoint("oidc_user").Error; err != nil {
			return userRow{}, err
		}
		link := oidcUserRow{Username: name, Role: id.Role, OIDCIssuer: id.Issuer, OIDCSubject: id.Subject, CreatedAt: time.Now().UTC()}
		err := tx.Create(&link).Error
		if errors.Is(err, gorm.ErrDuplicatedKey) {
			if err := tx.RollbackTo("oidc_user").Error; err != nil {
				return userRow{}, err
			}
			continue
		}
		if err != nil {
			return userRow{}, fmt.Errorf("create user: %w", err)
		}
		uid := link.ID
		if err := tx.Exec("UPDATE users SET domains = "+textArray+" WHERE id = ?", jsonText(domains), uid).Error; err != nil {
			return userRow{}, fmt.Errorf("write grants: %w", err)
		}
		var row userRow
		if err := tx.Where("id = ?", uid).Take(&row).Error; err != nil {
			return userRow{}, fmt.Errorf("read new user: %w", err)
		}
		act := actor
		act.Name, act.Owner = "system:oidc", ""
		return row, appendAudit(tx, act, "user.create", userTarget(row), "first sign-in through the identity provider", nil,
			map[string]any{"username": name, "role": id.Role, "domains": domains, "oidc_issuer": id.Issuer, "oidc_subject": id.Subject})
	}
	return userRow{}, &RefusedError{Reason: fmt.Sprintf("no free username like %q", base)}
}

// oidcUserRow is a new user linked to an identity provider; it has no
// password (an empty hash matches none).
type oidcUserRow struct {
	ID           int64 `gorm:"primaryKey"`
	Username     string
	PasswordHash string
	Role         string
	OIDCIssuer   string `gorm:"column:oidc_issuer"`
	OIDCSubject  string `gorm:"column:oidc_subject"`
	CreatedAt    time.Time
}

func (oidcUserRow) TableName() string { return "users" }

// UserGrants returns a user's role, domain grants and, for a user linked
// to an identity provider, its issuer and subject.
func (s *Store) UserGrants(ctx context.Context, id int64) (role string, domains []string, issuer, subject string, err error) {
	var iss, sub *string
	var list string
	err = s.db.WithContext(ctx).Raw("SELECT role, array_to_json(domains)::text, oidc_issuer, oidc_subject FROM users WHERE id = ?", id).
		Row().Scan(&role, &list, &iss, &sub)
	if errors.Is(err, sql.ErrNoRows) {
		err = gorm.ErrRecordNotFound
	}
	if err != nil {
		return "", nil, "", "", notFound(err, fmt.Sprintf("user %d", id))
	}
	if err := json.Unmarshal([]byte(list), &domains); err != nil {
		return "", nil, "", "", fmt.Errorf("user %d domains: %w", id, err)
	}
	if iss != nil {
		issuer, subject = *iss, *sub
	}
	return role, domains, issuer, subject, nil
}

// textArray is the SQL of a text[] from a JSON array of strings passed as
// one parameter (see jsonText), so no driver or ORM needs to know arrays.
const textArray = "ARRAY(SELECT jsonb_array_elements_text(?::jsonb))"

func jsonText(list []string) string {
	b, _ := json.Marshal(list) // a []string always encodes
	return string(b)
}

// readDomains returns user id's domain grants, sorted.
func readDomains(tx *gorm.DB, id int64) ([]string, error) {
	var list string
	if err := tx.Raw("SELECT array_to_json(domains)::text FROM users WHERE id = ?", id).Row().Scan(&list); err != nil {
		return nil, fmt.Errorf("read grants: %w", err)
	}
	var out []string
	if err := json.Unmarshal([]byte(list), &out); err != nil {
		return nil, fmt.Errorf("read grants: %w", err)
	}
	slices.Sort(out)
	return out, nil
}

// OIDCFlow is a sign-in between the redirect to the provider and its
// callback.
type OIDCFlow struct {
	Nonce    string
	Verifier string // the PKCE code verifier
	ReturnTo string // the console path to land on
}

// OIDCFlowLifetime bounds how long a person may take at the provider.
const OIDCFlowLifetime = 10 * time.Minute

// CreateOIDCFlow keeps f under state (stored as its hash) until
// OIDCFlowLifetime has passed or TakeOIDCFlow uses it. Expired flows are
// swept here.
func (s *Store) CreateOIDCFlow(ctx context.Context, state string, f OIDCFlow) error {
	now := time.Now().UTC()
	return s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Exec("DELETE FROM oidc_flows WHERE expires_at < ?", now).Error; err != nil {
			return fmt.Errorf("sweep sign-in flows: %w", err)
		}
		err := tx.Exec("INSERT INTO oidc_flows (state_hash, nonce, verifier, return_to, created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?)",
			hashToken(state), f.Nonce, f.Verifier, f.ReturnTo, now, now.Add(OIDCFlowLifetime)).Error
		if err != nil {
			return fmt.Errorf("save sign-in flow: %w", err)
		}
		return nil
	})
}

// TakeOIDCFlow returns the flow kept under state and deletes it, so a
// callback completes at most once. A used, expired or unknown state is
// rules.ErrNotFound.
func (s *Store) TakeOIDCFlow(ctx context.Context, state string) (OIDCFlow, error) {
	var f OIDCFlow
	var expires time.Time
	err := s.db.WithContext(ctx).Raw("DELETE FROM oidc_flows WHERE state_hash = ? RETURNING nonce, verifier, return_to, expires_at", hashToken(state)).
		Row().Scan(&f.Nonce, &f.Verifier, &f.ReturnTo, &expires)
	if errors.Is(err, sql.ErrNoRows) {
		err = gorm.ErrRecordNotFound
	}
	if err != nil {
		return OIDCFlow{}, notFound(err, "sign-in flow")
	}
	if time.Now().After(expires) {
		return OIDCFlow{}, fmt.Errorf("sign-in flow expired: %w", rules.ErrNotFound)
	}
	return f, nil
}
