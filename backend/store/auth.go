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
	// RoleSupport is a viewer's reads plus counter resets and temporary
	// overrides: support staff help a customer without editing rules.
	RoleSupport = "support"
	RoleEditor  = "editor"
	RoleAdmin   = "admin"
	RoleNode    = "node"
)

// ErrBadCredentials is returned for a wrong username or password, without
// saying which.
var ErrBadCredentials = errors.New("invalid username or password")

// ErrUnknownUser is the ErrBadCredentials of a username no user has. The
// console tells no client which it was; it only audits the failed sign-ins
// of users that exist, so a typed secret never lands in the audit trail.
var ErrUnknownUser = fmt.Errorf("%w: no such user", ErrBadCredentials)

// Authenticate checks a username and password. Every failure, including an
// unknown user, costs one bcrypt comparison and returns ErrBadCredentials
// (ErrUnknownUser, which wraps it, for an unknown user).
func (s *Store) Authenticate(ctx context.Context, username, password string) (User, error) {
	var row userRow
	err := s.db.WithContext(ctx).Where("username = ?", username).Take(&row).Error
	if err != nil && !errors.Is(err, gorm.ErrRecordNotFound) {
		return User{}, fmt.Errorf("find user: %w", err)
	}
	hash := []byte(row.PasswordHash)
	if err != nil {
		hash = s.dummyHash // keeps an unknown user's sign-in as slow as a wrong password's
	}
	var mismatch bool
	if err := s.passwords.run(ctx, func() {
		mismatch = bcrypt.CompareHashAndPassword(hash, []byte(password)) != nil // always run: timing
	}); err != nil {
		return User{}, err
	}
	switch {
	case err != nil:
		return User{}, ErrUnknownUser
	case mismatch || row.Disabled:
		return User{}, ErrBadCredentials
	}
	return row.user(), nil
}

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
// the CSRF token the browser must echo on writes. The login audit event
// (method password) is written in the same transaction.
func (s *Store) CreateSession(ctx context.Context, u User, actor Actor) (secret, csrf string, err error) {
	err = s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		secret, csrf, err = startSession(tx, u, actor, map[string]any{"method": "password"})
		return err
	})
	if err != nil {
		return "", "", err
	}
	return secret, csrf, nil
}

// startSession is CreateSession inside tx, for every way of signing in;
// how is the auth.login event's detail (its method).
func startSession(tx *gorm.DB, u User, actor Actor, how map[string]any) (secret, csrf string, err error) {
	secret, csrf = randomToken(), randomToken()
	now := time.Now().UTC()
	row := sessionRow{IDHash: hashToken(secret), UserID: u.ID, CSRFToken: csrf, CreatedAt: now, LastSeen: now, ExpiresAt: now.Add(SessionAbsolute)}
	// Sweep expired sessions here, where sessions are created, so the
	// table stays as small as the number of people signed in.
	if err := tx.Where("expires_at < ? OR last_seen < ?", now, now.Add(-SessionIdle)).Delete(&sessionRow{}).Error; err != nil {
		return "", "", fmt.Errorf("sweep expired sessions: %w", err)
	}
	if err := tx.Create(&row).Error; err != nil {
		return "", "", fmt.Errorf("create session: %w", err)
	}
	if err := appendAudit(tx, actor, "auth.login", "user:"+u.Username, "", nil, how); err != nil {
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

func randomToken() string {
	b := make([]byte, 32)
	rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

func hashToken(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}
