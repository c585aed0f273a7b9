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
	ID        int64 // as SessionInfo.ID
	User      User
	CSRFToken string
	ExpiresAt time.Time
}

type sessionRow struct {
	IDHash    string `gorm:"primaryKey"`
	ID        int64  `gorm:"->"` // assigned by Postgres
	UserID    int64
	CSRFToken string
	CreatedAt time.Time
	LastSeen  time.Time
	ExpiresAt time.Time
	IP        string
	UserAgent string
}

func (sessionRow) TableName() string { return "sessions" }

// Session lifetimes: idle expiry slides with use; absolute expiry does not.
// These are the defaults; the settings (session_idle_s,
// session_absolute_s) decide, within MinSessionLifetime and
// SessionAbsolute, which is also the session cookie's lifetime.
const (
	SessionIdle        = 12 * time.Hour
	SessionAbsolute    = 7 * 24 * time.Hour
	MinSessionLifetime = 5 * time.Minute
)

// lifetimes reads the session lifetimes from the settings.
func lifetimes(tx *gorm.DB) (idle, absolute time.Duration, err error) {
	var row settingsRow
	if err := tx.Take(&row).Error; err != nil {
		return 0, 0, fmt.Errorf("read session settings: %w", err)
	}
	return time.Duration(row.SessionIdleS) * time.Second, time.Duration(row.SessionAbsoluteS) * time.Second, nil
}

// sessionLive reports whether row is within both lifetimes at now.
func sessionLive(row sessionRow, now time.Time, idle, absolute time.Duration) bool {
	return now.Before(row.ExpiresAt) && now.Before(row.CreatedAt.Add(absolute)) && now.Sub(row.LastSeen) <= idle
}

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
	row := sessionRow{IDHash: hashToken(secret), UserID: u.ID, CSRFToken: csrf, CreatedAt: now, LastSeen: now,
		IP: actor.IP, UserAgent: actor.UserAgent}
	idle, absolute, err := lifetimes(tx)
	if err != nil {
		return "", "", err
	}
	row.ExpiresAt = now.Add(absolute)
	// Sweep expired sessions here, where sessions are created, so the
	// table stays as small as the number of people signed in.
	if err := tx.Where("expires_at < ? OR last_seen < ? OR created_at < ?", now, now.Add(-idle), now.Add(-absolute)).
		Delete(&sessionRow{}).Error; err != nil {
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
	return s.findSession(ctx, secret, true)
}

// CheckSession is FindSession without sliding the idle expiry: the check
// a long-lived stream repeats, which is no sign that someone is there.
func (s *Store) CheckSession(ctx context.Context, secret string) (Session, error) {
	return s.findSession(ctx, secret, false)
}

func (s *Store) findSession(ctx context.Context, secret string, touch bool) (Session, error) {
	var row sessionRow
	err := s.db.WithContext(ctx).Where("id_hash = ?", hashToken(secret)).Take(&row).Error
	if err != nil {
		return Session{}, notFound(err, "session")
	}
	idle, absolute, err := lifetimes(s.db.WithContext(ctx))
	if err != nil {
		return Session{}, err
	}
	now := time.Now().UTC()
	if !sessionLive(row, now, idle, absolute) {
		return Session{}, fmt.Errorf("session expired: %w", ErrNotFound)
	}
	var u userRow
	if err := s.db.WithContext(ctx).Where("id = ?", row.UserID).Take(&u).Error; err != nil {
		return Session{}, notFound(err, "session user")
	}
	if u.Disabled {
		return Session{}, fmt.Errorf("user disabled: %w", ErrNotFound)
	}
	if touch && now.Sub(row.LastSeen) > time.Minute { // avoid a write per request
		s.db.WithContext(ctx).Model(&sessionRow{}).Where("id_hash = ?", row.IDHash).Update("last_seen", now)
	}
	return Session{User: u.user(), CSRFToken: row.CSRFToken, ExpiresAt: row.ExpiresAt, ID: row.ID}, nil
}

// SessionInfo describes a live session to its user and to admins; the
// secret never leaves the console.
type SessionInfo struct {
	ID        int64     `json:"id"`
	CreatedAt time.Time `json:"created_at"`
	LastSeen  time.Time `json:"last_seen"`
	// ExpiresAt is when it ends unless used again (idle) or at the latest
	// (absolute), whichever is first.
	ExpiresAt time.Time `json:"expires_at"`
	IP        string    `json:"ip"`
	UserAgent string    `json:"user_agent"`
}

// ListSessions returns the live sessions of user id, newest first.
func (s *Store) ListSessions(ctx context.Context, userID int64) ([]SessionInfo, error) {
	db := s.db.WithContext(ctx)
	idle, absolute, err := lifetimes(db)
	if err != nil {
		return nil, err
	}
	var rows []sessionRow
	if err := db.Where("user_id = ?", userID).Order("created_at DESC").Find(&rows).Error; err != nil {
		return nil, fmt.Errorf("list sessions: %w", err)
	}
	now := time.Now().UTC()
	out := []SessionInfo{}
	for _, r := range rows {
		if !sessionLive(r, now, idle, absolute) {
			continue
		}
		end := r.ExpiresAt
		for _, t := range []time.Time{r.CreatedAt.Add(absolute), r.LastSeen.Add(idle)} {
			if t.Before(end) {
				end = t
			}
		}
		out = append(out, SessionInfo{ID: r.ID, CreatedAt: r.CreatedAt, LastSeen: r.LastSeen, ExpiresAt: end, IP: r.IP, UserAgent: r.UserAgent})
	}
	return out, nil
}

// RevokeSessions ends session sessionID of user userID, or all of the
// user's sessions when sessionID is 0 ("sign out everywhere"), and audits
// it as action (auth.logout_all or session.revoke). It returns how many
// ended; an unknown sessionID is not found.
func (s *Store) RevokeSessions(ctx context.Context, userID, sessionID int64, action string, actor Actor) (int64, error) {
	var n int64
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var u userRow
		if err := tx.Where("id = ?", userID).Take(&u).Error; err != nil {
			return notFound(err, fmt.Sprintf("user %d", userID))
		}
		q := tx.Where("user_id = ?", userID)
		if sessionID != 0 {
			q = q.Where("id = ?", sessionID)
		}
		res := q.Delete(&sessionRow{})
		if res.Error != nil {
			return fmt.Errorf("end sessions: %w", res.Error)
		}
		n = res.RowsAffected
		if sessionID != 0 && n == 0 {
			return fmt.Errorf("session %d: %w", sessionID, ErrNotFound)
		}
		after := map[string]any{"sessions_ended": n}
		if sessionID != 0 {
			after["session_id"] = sessionID
		}
		return appendAudit(tx, actor, action, userTarget(u), "", nil, after)
	})
	if err != nil {
		return 0, fmt.Errorf("revoke sessions: %w", err)
	}
	return n, nil
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
