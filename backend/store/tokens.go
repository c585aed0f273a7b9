package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

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
	RotatedAt *time.Time `json:"rotated_at"`
	// NodeID is the node id a node token is bound to: the first one it
	// connected with (see ClaimNode); null until then and for other roles.
	NodeID *string `json:"node_id"`
}

// Expired reports whether the token's expiry has passed at now.
func (t Token) Expired(now time.Time) bool { return t.ExpiresAt != nil && !now.Before(*t.ExpiresAt) }

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
	RotatedAt *time.Time
	NodeID    *string
}

func (tokenRow) TableName() string { return "api_tokens" }

func (r tokenRow) token() Token {
	return Token{ID: r.ID, Name: r.Name, Role: r.Role, Last4: r.Last4, CreatedBy: r.CreatedBy, CreatedAt: r.CreatedAt,
		ExpiresAt: r.ExpiresAt, Disabled: r.Disabled, RotatedAt: r.RotatedAt, NodeID: r.NodeID}
}

func tokenTarget(id int64) string { return fmt.Sprintf("token:%d", id) }

// TokenPrefix starts every API token so that leaked tokens are recognizable.
const TokenPrefix = "slc_"

func newSecret() (secret, hash, last4 string) {
	secret = TokenPrefix + randomToken()
	return secret, hashToken(secret), secret[len(secret)-4:]
}

// CreateToken makes a token of 256 random bits and returns it with its secret,
// which is shown once and stored only as a SHA-256 hash.
func (s *Store) CreateToken(ctx context.Context, name, role string, expiresAt *time.Time, actor Actor) (Token, string, error) {
	switch role {
	case RoleViewer, RoleSupport, RoleEditor, RoleAdmin, RoleNode:
	default:
		return Token{}, "", &InvalidError{Reason: "role must be one of viewer, support, editor, admin, node"}
	}
	secret, hash, last4 := newSecret()
	row := tokenRow{Name: name, Role: role, Hash: hash, Last4: last4, CreatedBy: actor.owner(), CreatedAt: time.Now().UTC(), ExpiresAt: expiresAt}
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Create(&row).Error; err != nil {
			return err
		}
		return appendAudit(tx, actor, "token.create", tokenTarget(row.ID), "", nil,
			map[string]any{"name": name, "role": role, "last4": row.Last4, "expires_at": expiresAt})
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
	if t := row.token(); t.Disabled || t.Expired(time.Now()) {
		return Token{}, fmt.Errorf("token disabled or expired: %w", ErrNotFound)
	}
	return row.token(), nil
}

// ListTokens returns every token (never a secret), newest first.
func (s *Store) ListTokens(ctx context.Context) ([]Token, error) {
	var rows []tokenRow
	if err := s.db.WithContext(ctx).Order("id DESC").Find(&rows).Error; err != nil {
		return nil, fmt.Errorf("list tokens: %w", err)
	}
	out := make([]Token, len(rows))
	for i, r := range rows {
		out[i] = r.token()
	}
	return out, nil
}

// DisableToken disables a token for good; it stops working at once.
// Disabling a disabled token changes nothing.
func (s *Store) DisableToken(ctx context.Context, id int64, actor Actor) (Token, error) {
	var row tokenRow
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Clauses(clause.Locking{Strength: "UPDATE"}).Where("id = ?", id).Take(&row).Error; err != nil {
			return notFound(err, fmt.Sprintf("token %d", id))
		}
		if row.Disabled {
			return nil
		}
		row.Disabled = true
		if err := tx.Model(&tokenRow{}).Where("id = ?", id).Update("disabled", true).Error; err != nil {
			return fmt.Errorf("write token: %w", err)
		}
		return appendAudit(tx, actor, "token.disable", tokenTarget(id), "",
			map[string]any{"disabled": false, "name": row.Name}, map[string]any{"disabled": true, "name": row.Name})
	})
	if err != nil {
		return Token{}, fmt.Errorf("disable token %d: %w", id, err)
	}
	return row.token(), nil
}

// RotateToken gives a live token a new secret, returned once; the old
// secret stops working at once. Name, role and expiry stay.
func (s *Store) RotateToken(ctx context.Context, id int64, actor Actor) (Token, string, error) {
	var (
		row    tokenRow
		secret string
	)
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Clauses(clause.Locking{Strength: "UPDATE"}).Where("id = ?", id).Take(&row).Error; err != nil {
			return notFound(err, fmt.Sprintf("token %d", id))
		}
		now := time.Now().UTC()
		switch t := row.token(); {
		case t.Disabled:
			return &RefusedError{Reason: fmt.Sprintf("token %d is disabled; create a new one", id)}
		case t.Expired(now):
			return &RefusedError{Reason: fmt.Sprintf("token %d has expired; create a new one", id)}
		}
		oldLast4 := row.Last4
		var hash string
		secret, hash, row.Last4 = newSecret()
		row.RotatedAt = &now
		err := tx.Model(&tokenRow{}).Where("id = ?", id).Updates(map[string]any{"hash": hash, "last4": row.Last4, "rotated_at": now}).Error
		if err != nil {
			return fmt.Errorf("write token: %w", err)
		}
		return appendAudit(tx, actor, "token.rotate", tokenTarget(id), "",
			map[string]any{"last4": oldLast4, "name": row.Name}, map[string]any{"last4": row.Last4, "name": row.Name})
	})
	if err != nil {
		return Token{}, "", fmt.Errorf("rotate token %d: %w", id, err)
	}
	return row.token(), secret, nil
}

// NodeBoundError refuses a node token's connection as a node id other than
// the one the token is bound to, or as a node id another live token holds.
type NodeBoundError struct {
	NodeID  string // the node id asked for
	BoundTo string // the token's node id; "" when another token holds NodeID
}

func (e *NodeBoundError) Error() string {
	if e.BoundTo != "" {
		return fmt.Sprintf("this node token is bound to node id %q, not %q; use a token of its own for each node", e.BoundTo, e.NodeID)
	}
	return fmt.Sprintf("node id %q is bound to another node token", e.NodeID)
}

// ClaimNode binds node token id to nodeID if it is bound to nothing yet,
// with an audit event, and returns a *NodeBoundError if it is bound to
// another node id or another live token holds nodeID. A token stays bound
// when rotated; to move a node id to a new token, disable the old token.
func (s *Store) ClaimNode(ctx context.Context, id int64, nodeID string, actor Actor) error {
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var row tokenRow
		if err := tx.Clauses(clause.Locking{Strength: "UPDATE"}).Where("id = ?", id).Take(&row).Error; err != nil {
			return notFound(err, fmt.Sprintf("token %d", id))
		}
		switch {
		case row.NodeID != nil && *row.NodeID == nodeID:
			return nil
		case row.NodeID != nil:
			return &NodeBoundError{NodeID: nodeID, BoundTo: *row.NodeID}
		}
		err := tx.Model(&tokenRow{}).Where("id = ?", id).Update("node_id", nodeID).Error
		if errors.Is(err, gorm.ErrDuplicatedKey) {
			return &NodeBoundError{NodeID: nodeID}
		}
		if err != nil {
			return fmt.Errorf("write token: %w", err)
		}
		return appendAudit(tx, actor, "token.bind", tokenTarget(id), "", map[string]any{"node_id": nil},
			map[string]any{"node_id": nodeID, "name": row.Name})
	})
	if err != nil {
		return fmt.Errorf("claim node %q for token %d: %w", nodeID, id, err)
	}
	return nil
}
