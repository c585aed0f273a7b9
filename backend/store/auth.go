package store

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"golang.org/x/crypto/bcrypt"
	"gorm.io/gorm"

	"github.com/sluicehq/sluice/rules"
)

// Roles.
const (
	RoleViewer = "viewer"
	RoleEditor = "editor"
	RoleAdmin  = "admin"
	RoleNode   = "node"
)

// ErrBadCredentials is returned for a wrong username or password, without
// saying which.
var ErrBadCredentials = errors.New("invalid username or password")

// User is a console account.
type User struct {
	ID        int64     `json:"id"`
	Username  string    `json:"username"`
	Role      string    `json:"role"`
	Disabled  bool      `json:"disabled"`
	CreatedAt time.Time `json:"created_at"`
}

type userRow struct {
	ID           int64 `gorm:"primaryKey"`
	Username     string
	PasswordHash string
	Role         string
	Disabled     bool
	CreatedAt    time.Time
}

func (userRow) TableName() string { return "users" }

func (r userRow) user() User {
	return User{ID: r.ID, Username: r.Username, Role: r.Role, Disabled: r.Disabled, CreatedAt: r.CreatedAt}
}

// CountUsers returns how many users exist.
func (s *Store) CountUsers(ctx context.Context) (int64, error) {
	var n int64
	if err := s.db.WithContext(ctx).Model(&userRow{}).Count(&n).Error; err != nil {
		return 0, fmt.Errorf("count users: %w", err)
	}
	return n, nil
}

// CreateUser adds a user with a bcrypt-hashed password.
func (s *Store) CreateUser(ctx context.Context, username, password, role string, actor Actor) (User, error) {
	hash, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.DefaultCost)
	if err != nil {
		return User{}, fmt.Errorf("hash password: %w", err)
	}
	row := userRow{Username: username, PasswordHash: string(hash), Role: role, CreatedAt: time.Now().UTC()}
	err = s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Create(&row).Error; err != nil {
			if errors.Is(err, gorm.ErrDuplicatedKey) {
				return fmt.Errorf("user %q exists: %w", username, rules.ErrConflict)
			}
			return err
		}
		return appendAudit(tx, actor, "user.create", "user:"+username, "", nil, map[string]any{"username": username, "role": role})
	})
	if err != nil {
		return User{}, fmt.Errorf("create user: %w", err)
	}
	return row.user(), nil
}

// Authenticate checks a username and password. Every failure, including an
// unknown user, costs one bcrypt comparison and returns ErrBadCredentials.
func (s *Store) Authenticate(ctx context.Context, username, password string) (User, error) {
	var row userRow
	err := s.db.WithContext(ctx).Where("username = ?", username).Take(&row).Error
	if err != nil && !errors.Is(err, gorm.ErrRecordNotFound) {
		return User{}, fmt.Errorf("find user: %w", err)
	}
	hash := []byte(row.PasswordHash)
	if err != nil {
		hash = dummyHash
	}
	if bcrypt.CompareHashAndPassword(hash, []byte(password)) != nil || err != nil || row.Disabled {
		return User{}, ErrBadCredentials
	}
	return row.user(), nil
}

// dummyHash keeps the time of a login for an unknown user equal to a wrong
// password's, so timing does not reveal which usernames exist.
var dummyHash, _ = bcrypt.GenerateFromPassword([]byte("sluice-dummy-password"), bcrypt.DefaultCost)

// RecordLogin appends a login or logout audit event.
func (s *Store) RecordLogin(ctx context.Context, action, username string, actor Actor) error {
	return s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		return appendAudit(tx, actor, action, "user:"+username, "", nil, nil)
	})
}

// Session is a signed-in browser session.
type Session struct {
	User      User
	CSRFToken string
	ExpiresAt time.Time
}

type sessionRow struct {
	IDHash    string `gorm:"primaryKey"`
	UserID    int64
	CSRFToken string
	CreatedAt time.Time
	LastSeen  time.Time
	ExpiresAt time.Time
}

func (sessionRow) TableName() string { return "sessions" }

// Session lifetimes: idle expiry slides with use; absolute expiry does not.
const (
	SessionIdle     = 12 * time.Hour
	SessionAbsolute = 7 * 24 * time.Hour
)

// CreateSession starts a session and returns its secret (for the cookie) and
// the CSRF token the browser must echo on writes. The login audit event is
// written in the same transaction.
func (s *Store) CreateSession(ctx context.Context, u User, actor Actor) (secret, csrf string, err error) {
	secret, csrf = randomToken(), randomToken()
	now := time.Now().UTC()
	row := sessionRow{IDHash: hashToken(secret), UserID: u.ID, CSRFToken: csrf, CreatedAt: now, LastSeen: now, ExpiresAt: now.Add(SessionAbsolute)}
	err = s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Create(&row).Error; err != nil {
			return err
		}
		return appendAudit(tx, actor, "auth.login", "user:"+u.Username, "", nil, nil)
	})
	if err != nil {
		return "", "", fmt.Errorf("create session: %w", err)
	}
	return secret, csrf, nil
}

// FindSession returns the live session for a cookie secret and slides its
// idle expiry. Expired sessions and disabled users are not found.
func (s *Store) FindSession(ctx context.Context, secret string) (Session, error) {
	var row sessionRow
	err := s.db.WithContext(ctx).Where("id_hash = ?", hashToken(secret)).Take(&row).Error
	if err != nil {
		return Session{}, notFound(err, "session")
	}
	now := time.Now().UTC()
	if now.After(row.ExpiresAt) || now.Sub(row.LastSeen) > SessionIdle {
		return Session{}, fmt.Errorf("session expired: %w", rules.ErrNotFound)
	}
	var u userRow
	if err := s.db.WithContext(ctx).Where("id = ?", row.UserID).Take(&u).Error; err != nil {
		return Session{}, notFound(err, "session user")
	}
	if u.Disabled {
		return Session{}, fmt.Errorf("user disabled: %w", rules.ErrNotFound)
	}
	if now.Sub(row.LastSeen) > time.Minute { // avoid a write per request
		s.db.WithContext(ctx).Model(&sessionRow{}).Where("id_hash = ?", row.IDHash).Update("last_seen", now)
	}
	return Session{User: u.user(), CSRFToken: row.CSRFToken, ExpiresAt: row.ExpiresAt}, nil
}

// DeleteSession ends a session (logout) and audits it.
func (s *Store) DeleteSession(ctx context.Context, secret, username string, actor Actor) error {
	return s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Where("id_hash = ?", hashToken(secret)).Delete(&sessionRow{}).Error; err != nil {
			return fmt.Errorf("delete session: %w", err)
		}
		return appendAudit(tx, actor, "auth.logout", "user:"+username, "", nil, nil)
	})
}

// Token is an API token's public description; the secret is never stored.
type Token struct {
	ID        int64      `json:"id"`
	Name      string     `json:"name"`
	Role      string     `json:"role"`
	Last4     string     `json:"last4"`
	CreatedBy string     `json:"created_by"`
	CreatedAt time.Time  `json:"created_at"`
	ExpiresAt *time.Time `json:"expires_at"`
	Disabled  bool       `json:"disabled"`
}

type tokenRow struct {
	ID        int64 `gorm:"primaryKey"`
	Name      string
	Role      string
	Hash      string
	Last4     string `gorm:"column:last4"`
	CreatedBy string
	CreatedAt time.Time
	ExpiresAt *time.Time
	Disabled  bool
}

func (tokenRow) TableName() string { return "api_tokens" }

func (r tokenRow) token() Token {
	return Token{ID: r.ID, Name: r.Name, Role: r.Role, Last4: r.Last4, CreatedBy: r.CreatedBy, CreatedAt: r.CreatedAt, ExpiresAt: r.ExpiresAt, Disabled: r.Disabled}
}

// TokenPrefix starts every API token so that leaked tokens are recognizable.
const TokenPrefix = "slc_"

// CreateToken makes a token of 256 random bits and returns it with its secret,
// which is shown once and stored only as a SHA-256 hash.
func (s *Store) CreateToken(ctx context.Context, name, role string, expiresAt *time.Time, actor Actor) (Token, string, error) {
	secret := TokenPrefix + randomToken()
	row := tokenRow{Name: name, Role: role, Hash: hashToken(secret), Last4: secret[len(secret)-4:], CreatedBy: actor.Name, CreatedAt: time.Now().UTC(), ExpiresAt: expiresAt}
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Create(&row).Error; err != nil {
			return err
		}
		return appendAudit(tx, actor, "token.create", fmt.Sprintf("token:%d", row.ID), "", nil, map[string]any{"name": name, "role": role, "last4": row.Last4})
	})
	if err != nil {
		return Token{}, "", fmt.Errorf("create token: %w", err)
	}
	return row.token(), secret, nil
}

// FindToken returns the live token for a secret. Disabled and expired tokens
// are not found.
func (s *Store) FindToken(ctx context.Context, secret string) (Token, error) {
	var row tokenRow
	if err := s.db.WithContext(ctx).Where("hash = ?", hashToken(secret)).Take(&row).Error; err != nil {
		return Token{}, notFound(err, "token")
	}
	if row.Disabled || (row.ExpiresAt != nil && time.Now().After(*row.ExpiresAt)) {
		return Token{}, fmt.Errorf("token disabled or expired: %w", rules.ErrNotFound)
	}
	return row.token(), nil
}

func randomToken() string {
	b := make([]byte, 32)
	rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

func hashToken(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}
