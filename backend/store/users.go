package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"golang.org/x/crypto/bcrypt"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// MaxPasswordBytes is the longest password bcrypt can hash.
const MaxPasswordBytes = 72

// User is a console account.
type User struct {
	ID                int64      `json:"id"`
	Username          string     `json:"username"`
	Role              string     `json:"role"`
	Disabled          bool       `json:"disabled"`
	CreatedAt         time.Time  `json:"created_at"`
	PasswordChangedAt *time.Time `json:"password_changed_at"`
	// Domains are the domains the role holds for; empty means every
	// domain.
	Domains []string `json:"domains"`
}

// Scope is the domains the user's role holds for.
func (u User) Scope() Scope { return ScopeOf(u.Domains) }

type userRow struct {
	ID                int64 `gorm:"primaryKey"`
	Username          string
	PasswordHash      string
	Role              string
	Disabled          bool
	CreatedAt         time.Time
	PasswordChangedAt *time.Time
	Domains           domainList `gorm:"type:text[]"`
}

func (userRow) TableName() string { return "users" }

func (r userRow) user() User {
	u := User{ID: r.ID, Username: r.Username, Role: r.Role, Disabled: r.Disabled, CreatedAt: r.CreatedAt,
		PasswordChangedAt: r.PasswordChangedAt, Domains: []string(r.Domains)}
	if u.Domains == nil {
		u.Domains = []string{}
	}
	return u
}

func userRole(role string) error {
	switch role {
	case RoleViewer, RoleSupport, RoleEditor, RoleAdmin:
		return nil
	}
	return &InvalidError{Reason: "role must be one of viewer, support, editor, admin"}
}

func (s *Store) hashPassword(ctx context.Context, password string) (string, error) {
	if password == "" || len(password) > MaxPasswordBytes {
		return "", &InvalidError{Reason: fmt.Sprintf("a password has 1 to %d bytes", MaxPasswordBytes)}
	}
	var (
		hash    []byte
		hashErr error
	)
	if err := s.passwords.run(ctx, func() { hash, hashErr = bcrypt.GenerateFromPassword([]byte(password), s.passwordCost) }); err != nil {
		return "", err
	}
	if err := hashErr; err != nil {
		return "", fmt.Errorf("hash password: %w", err)
	}
	return string(hash), nil
}

// CountUsers returns how many users exist.
func (s *Store) CountUsers(ctx context.Context) (int64, error) {
	var n int64
	if err := s.db.WithContext(ctx).Model(&userRow{}).Count(&n).Error; err != nil {
		return 0, fmt.Errorf("count users: %w", err)
	}
	return n, nil
}

// CreateUser adds a user with a bcrypt-hashed password, whose role holds
// for every domain.
func (s *Store) CreateUser(ctx context.Context, username, password, role string, actor Actor) (User, error) {
	return s.CreateGrantedUser(ctx, username, password, role, nil, actor)
}

// CreateGrantedUser is CreateUser for a role that holds for domains only
// (empty: every domain).
func (s *Store) CreateGrantedUser(ctx context.Context, username, password, role string, domains []string, actor Actor) (User, error) {
	if err := userRole(role); err != nil {
		return User{}, err
	}
	if err := CheckDomains(domains); err != nil {
		return User{}, err
	}
	hash, err := s.hashPassword(ctx, password)
	if err != nil {
		return User{}, err
	}
	row := userRow{Username: username, PasswordHash: hash, Role: role, CreatedAt: time.Now().UTC(), Domains: domainList(ScopeOf(domains).Domains)}
	if row.Domains == nil {
		row.Domains = domainList{}
	}
	err = s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Create(&row).Error; err != nil {
			if errors.Is(err, gorm.ErrDuplicatedKey) {
				return &RefusedError{Reason: fmt.Sprintf("user %q exists", username)}
			}
			return err
		}
		after := map[string]any{"username": username, "role": role}
		if len(row.Domains) > 0 {
			after["domains"] = []string(row.Domains)
		}
		return appendAudit(tx, actor, "user.create", userTarget(row), "", nil, after)
	})
	if err != nil {
		return User{}, fmt.Errorf("create user: %w", err)
	}
	return row.user(), nil
}

func userTarget(r userRow) string { return "user:" + r.Username }

// ListUsers returns every user, by username.
func (s *Store) ListUsers(ctx context.Context) ([]User, error) {
	var rows []userRow
	if err := s.db.WithContext(ctx).Order("username").Find(&rows).Error; err != nil {
		return nil, fmt.Errorf("list users: %w", err)
	}
	out := make([]User, len(rows))
	for i, r := range rows {
		out[i] = r.user()
	}
	return out, nil
}

// FindUser returns one user.
func (s *Store) FindUser(ctx context.Context, id int64) (User, error) {
	var row userRow
	if err := s.db.WithContext(ctx).Where("id = ?", id).Take(&row).Error; err != nil {
		return User{}, notFound(err, fmt.Sprintf("user %d", id))
	}
	return row.user(), nil
}

// changeUser locks user id, lets edit change the row, writes it back and
// audits it; it refuses a change that leaves no enabled admin of every
// domain (only such an admin manages users). edit reports
// whether anything changed and the audit action; nothing is written or
// audited when nothing changed.
func (s *Store) changeUser(ctx context.Context, id int64, actor Actor, edit func(r *userRow) (action string, before, after any, changed bool, err error)) (User, error) {
	var row userRow
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		// Lock every enabled admin first (always in the same order), then
		// the target: concurrent demotions queue here and each sees the
		// others' outcome.
		var admins []int64
		if err := tx.Model(&userRow{}).Clauses(clause.Locking{Strength: "UPDATE"}).
			Where("role = ? AND NOT disabled AND domains = '{}'", RoleAdmin).Order("id").Pluck("id", &admins).Error; err != nil {
			return fmt.Errorf("lock admins: %w", err)
		}
		if err := tx.Clauses(clause.Locking{Strength: "UPDATE"}).Where("id = ?", id).Take(&row).Error; err != nil {
			return notFound(err, fmt.Sprintf("user %d", id))
		}
		wasAdmin := row.Role == RoleAdmin && !row.Disabled && len(row.Domains) == 0
		action, before, after, changed, err := edit(&row)
		if err != nil || !changed {
			return err
		}
		if wasAdmin && (row.Role != RoleAdmin || row.Disabled || len(row.Domains) > 0) && len(admins) <= 1 {
			return &RefusedError{Reason: "this is the last enabled admin; make another admin first"}
		}
		err = tx.Model(&userRow{}).Where("id = ?", id).Updates(map[string]any{
			"role": row.Role, "disabled": row.Disabled, "password_hash": row.PasswordHash, "password_changed_at": row.PasswordChangedAt,
			"domains": row.Domains,
		}).Error
		if err != nil {
			return fmt.Errorf("write user: %w", err)
		}
		if row.Disabled || action == "user.password_reset" {
			// A disabled user, or one whose password an admin reset, is
			// signed out everywhere at once.
			if err := tx.Where("user_id = ?", id).Delete(&sessionRow{}).Error; err != nil {
				return fmt.Errorf("end sessions: %w", err)
			}
		}
		return appendAudit(tx, actor, action, userTarget(row), "", before, after)
	})
	if err != nil {
		return User{}, fmt.Errorf("change user %d: %w", id, err)
	}
	return row.user(), nil
}

// SetUserDisabled disables or enables a user. A disabled user cannot sign in
// and their sessions end at once. The last enabled admin cannot be disabled.
func (s *Store) SetUserDisabled(ctx context.Context, id int64, disabled bool, actor Actor) (User, error) {
	return s.changeUser(ctx, id, actor, func(r *userRow) (string, any, any, bool, error) {
		if r.Disabled == disabled {
			return "", nil, nil, false, nil
		}
		r.Disabled = disabled
		action := "user.enable"
		if disabled {
			action = "user.disable"
		}
		return action, map[string]any{"disabled": !disabled}, map[string]any{"disabled": disabled}, true, nil
	})
}

// SetUserRole changes a user's role. The last enabled admin keeps theirs.
func (s *Store) SetUserRole(ctx context.Context, id int64, role string, actor Actor) (User, error) {
	if err := userRole(role); err != nil {
		return User{}, err
	}
	return s.changeUser(ctx, id, actor, func(r *userRow) (string, any, any, bool, error) {
		if r.Role == role {
			return "", nil, nil, false, nil
		}
		before := r.Role
		r.Role = role
		return "user.role", map[string]any{"role": before}, map[string]any{"role": role}, true, nil
	})
}

// SetUserDomains changes the domains a user's role holds for (empty: every
// domain). Their sessions stay; the next request holds the new grants, and
// their tokens are narrowed with them.
func (s *Store) SetUserDomains(ctx context.Context, id int64, domains []string, actor Actor) (User, error) {
	if err := CheckDomains(domains); err != nil {
		return User{}, err
	}
	want := ScopeOf(domains).Domains
	return s.changeUser(ctx, id, actor, func(r *userRow) (string, any, any, bool, error) {
		before := ScopeOf(r.Domains).Domains
		if slices.Equal(before, want) {
			return "", nil, nil, false, nil
		}
		r.Domains = domainList(want)
		if r.Domains == nil {
			r.Domains = domainList{}
		}
		if before == nil {
			before = []string{}
		}
		return "user.domains", map[string]any{"domains": before}, map[string]any{"domains": []string(r.Domains)}, true, nil
	})
}

// ResetPassword sets a user's password (an admin's reset) and ends all of
// the user's sessions.
func (s *Store) ResetPassword(ctx context.Context, id int64, password string, actor Actor) (User, error) {
	hash, err := s.hashPassword(ctx, password)
	if err != nil {
		return User{}, err
	}
	return s.changeUser(ctx, id, actor, func(r *userRow) (string, any, any, bool, error) {
		now := time.Now().UTC()
		r.PasswordHash, r.PasswordChangedAt = hash, &now
		return "user.password_reset", nil, nil, true, nil
	})
}

// ChangePassword sets a user's own password after checking the current one
// (ErrBadCredentials if wrong), and ends the user's other sessions: every
// session except the one whose secret is keep.
func (s *Store) ChangePassword(ctx context.Context, id int64, current, password, keep string, actor Actor) error {
	hash, err := s.hashPassword(ctx, password)
	if err != nil {
		return err
	}
	err = s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var row userRow
		if err := tx.Clauses(clause.Locking{Strength: "UPDATE"}).Where("id = ?", id).Take(&row).Error; err != nil {
			return notFound(err, fmt.Sprintf("user %d", id))
		}
		var mismatch bool
		if err := s.passwords.run(ctx, func() {
			mismatch = bcrypt.CompareHashAndPassword([]byte(row.PasswordHash), []byte(current)) != nil
		}); err != nil {
			return err
		}
		if row.Disabled || mismatch {
			return ErrBadCredentials
		}
		now := time.Now().UTC()
		err := tx.Model(&userRow{}).Where("id = ?", id).Updates(map[string]any{"password_hash": hash, "password_changed_at": now}).Error
		if err != nil {
			return fmt.Errorf("write user: %w", err)
		}
		if err := tx.Where("user_id = ? AND id_hash <> ?", id, hashToken(keep)).Delete(&sessionRow{}).Error; err != nil {
			return fmt.Errorf("end other sessions: %w", err)
		}
		return appendAudit(tx, actor, "user.password_change", userTarget(row), "", nil, nil)
	})
	if err != nil {
		return fmt.Errorf("change password: %w", err)
	}
	return nil
}
