package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// Token is an API token's public description; the secret is never stored.
//
// A token acts for its owner (a user: its creator until an admin hands it
// to someone else) and never holds more than the owner holds now: its
// EffectiveRole is the lower of its role and the owner's, its Scope the
// domains both grant, and it stops working when the owner is disabled.
// Node tokens are the exception (see FindToken). A token without an owner
// was made by the system, not a person, and holds its own role.
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
	// connected with (see ClaimNode); null until then and for other roles
	// and fleet tokens.
	NodeID *string `json:"node_id"`
	// Domains are the token's own domain grants; empty means every domain.
	Domains []string `json:"domains"`
	// ReadOnly tokens make GET requests only.
	ReadOnly bool `json:"read_only"`
	// Fleet node tokens may connect as any node id not already connected.
	Fleet bool `json:"fleet"`
	// Owner is the username the token acts for; null for a system token.
	Owner         *string `json:"owner"`
	OwnerDisabled bool    `json:"owner_disabled"`
	// EffectiveRole is what the token may do now: the lower of Role and
	// the owner's role (Role for node and system tokens).
	EffectiveRole string `json:"effective_role"`
	// Scope is the domains EffectiveRole holds for: the token's and the
	// owner's grants, narrowed.
	Scope Scope `json:"-"`

	ownerID *int64
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
	OwnerID   *int64
	Domains   domainList `gorm:"type:text[]"`
	ReadOnly  bool
	Fleet     bool
}

func (tokenRow) TableName() string { return "api_tokens" }

// token describes the row as it stands, without its owner (see withOwner).
func (r tokenRow) token() Token {
	t := Token{ID: r.ID, Name: r.Name, Role: r.Role, Last4: r.Last4, CreatedBy: r.CreatedBy, CreatedAt: r.CreatedAt,
		ExpiresAt: r.ExpiresAt, Disabled: r.Disabled, RotatedAt: r.RotatedAt, NodeID: r.NodeID,
		Domains: []string(r.Domains), ReadOnly: r.ReadOnly, Fleet: r.Fleet, EffectiveRole: r.Role, Scope: ScopeOf(r.Domains),
		ownerID: r.OwnerID}
	if t.Domains == nil {
		t.Domains = []string{}
	}
	return t
}

// withOwner narrows t to what its owner u holds now.
func (t Token) withOwner(u userRow) Token {
	t.Owner, t.OwnerDisabled = &u.Username, u.Disabled
	if t.Role != RoleNode {
		t.EffectiveRole = lowerRole(t.Role, u.Role)
		t.Scope = t.Scope.Narrow(ScopeOf(u.Domains))
	}
	return t
}

// live reports whether the token works at now. A disabled owner's tokens
// stop working, except node tokens that serve a node already (bound to it,
// or fleet tokens): they live on machines, not with the person, and
// disabling someone who leaves must not cut enforcers off from new rule
// versions. A node token no node has used yet stops working too: only its
// creator can be holding it.
func (t Token) live(now time.Time) bool {
	switch {
	case t.Disabled || t.Expired(now):
		return false
	case t.OwnerDisabled:
		return t.Role == RoleNode && (t.NodeID != nil || t.Fleet)
	}
	return true
}

// ownersOf loads the owners of tokens, by id.
func ownersOf(tx *gorm.DB, tokens []Token) (map[int64]userRow, error) {
	var ids []int64
	seen := make(map[int64]bool)
	for _, t := range tokens {
		if t.ownerID != nil && !seen[*t.ownerID] {
			seen[*t.ownerID] = true
			ids = append(ids, *t.ownerID)
		}
	}
	out := make(map[int64]userRow, len(ids))
	if len(ids) == 0 {
		return out, nil
	}
	var rows []userRow
	if err := tx.Where("id IN ?", ids).Find(&rows).Error; err != nil {
		return nil, fmt.Errorf("read token owners: %w", err)
	}
	for _, r := range rows {
		out[r.ID] = r
	}
	return out, nil
}

// resolveTokens adds each token's owner and narrows it to what the owner holds.
func resolveTokens(tx *gorm.DB, rows []tokenRow) ([]Token, error) {
	out := make([]Token, len(rows))
	for i, r := range rows {
		out[i] = r.token()
	}
	owners, err := ownersOf(tx, out)
	if err != nil {
		return nil, err
	}
	for i, t := range out {
		if t.ownerID != nil {
			if u, ok := owners[*t.ownerID]; ok {
				out[i] = t.withOwner(u)
			}
		}
	}
	return out, nil
}

func tokenTarget(id int64) string { return fmt.Sprintf("token:%d", id) }

// TokenPrefix starts every API token so that leaked tokens are recognizable.
const TokenPrefix = "slc_"

func newSecret() (secret, hash, last4 string) {
	secret = TokenPrefix + randomToken()
	return secret, hashToken(secret), secret[len(secret)-4:]
}

// TokenSpec is a token to create.
type TokenSpec struct {
	Name      string
	Role      string
	ExpiresAt *time.Time
	Domains   []string // empty: every domain
	ReadOnly  bool
	Fleet     bool // node tokens only
}

// CreateToken makes a token of 256 random bits and returns it with its secret,
// which is shown once and stored only as a SHA-256 hash.
func (s *Store) CreateToken(ctx context.Context, name, role string, expiresAt *time.Time, actor Actor) (Token, string, error) {
	return s.CreateScopedToken(ctx, TokenSpec{Name: name, Role: role, ExpiresAt: expiresAt}, actor)
}

// CreateScopedToken is CreateToken with domain grants, the read-only flag
// and fleet node tokens. The token's owner is the person the actor answers
// for (actor's owner "user:NAME"); an actor that is no user makes a system
// token, which has no owner.
func (s *Store) CreateScopedToken(ctx context.Context, spec TokenSpec, actor Actor) (Token, string, error) {
	switch spec.Role {
	case RoleViewer, RoleSupport, RoleEditor, RoleAdmin, RoleNode:
	default:
		return Token{}, "", &InvalidError{Reason: "role must be one of viewer, support, editor, admin, node"}
	}
	if err := CheckDomains(spec.Domains); err != nil {
		return Token{}, "", err
	}
	if spec.Fleet && spec.Role != RoleNode {
		return Token{}, "", &InvalidError{Reason: "only node tokens may be fleet tokens"}
	}
	if spec.Role == RoleNode && (len(spec.Domains) > 0 || spec.ReadOnly) {
		return Token{}, "", &InvalidError{Reason: "node tokens take no domains and no read_only flag"}
	}
	secret, hash, last4 := newSecret()
	tok, err := s.createToken(ctx, spec, hash, last4, actor)
	if err != nil {
		return Token{}, "", err
	}
	return tok, secret, nil
}

// createToken writes a checked spec with its secret's hash, and the audit
// event.
func (s *Store) createToken(ctx context.Context, spec TokenSpec, hash, last4 string, actor Actor) (Token, error) {
	row := tokenRow{Name: spec.Name, Role: spec.Role, Hash: hash, Last4: last4, CreatedBy: actor.owner(), CreatedAt: time.Now().UTC(),
		ExpiresAt: spec.ExpiresAt, Domains: domainList(ScopeOf(spec.Domains).Domains), ReadOnly: spec.ReadOnly, Fleet: spec.Fleet}
	if row.Domains == nil {
		row.Domains = domainList{}
	}
	var tok Token
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if name, ok := strings.CutPrefix(actor.owner(), "user:"); ok {
			var u userRow
			err := tx.Where("username = ?", name).Take(&u).Error
			switch {
			case err == nil:
				row.OwnerID = &u.ID
			case !errors.Is(err, gorm.ErrRecordNotFound):
				return fmt.Errorf("find owner: %w", err)
			}
		}
		if err := tx.Create(&row).Error; err != nil {
			return err
		}
		ts, err := resolveTokens(tx, []tokenRow{row})
		if err != nil {
			return err
		}
		tok = ts[0]
		after := map[string]any{"name": spec.Name, "role": spec.Role, "last4": row.Last4, "expires_at": spec.ExpiresAt}
		if len(row.Domains) > 0 {
			after["domains"] = []string(row.Domains)
		}
		if spec.ReadOnly {
			after["read_only"] = true
		}
		if spec.Fleet {
			after["fleet"] = true
		}
		return appendAudit(tx, actor, "token.create", tokenTarget(row.ID), "", nil, after)
	})
	if err != nil {
		return Token{}, fmt.Errorf("create token: %w", err)
	}
	return tok, nil
}

// MinGivenSecret is the shortest secret EnsureFleetToken accepts: 32
// characters of a random string carry far more than 128 bits.
const MinGivenSecret = 32

// EnsureFleetToken makes secret, chosen outside the console (a bootstrap
// token from a deployment's environment), the secret of a fleet node
// token named name, unless a token with that secret exists already. It
// returns the token and whether it created it. An existing token is
// returned as it stands (disabled, expired, of another role) for the
// caller to judge: it is never enabled or changed here, so disabling a
// bootstrap token sticks across restarts. A secret shorter than
// MinGivenSecret or with spaces or control characters is an
// *InvalidError.
func (s *Store) EnsureFleetToken(ctx context.Context, name, secret string, actor Actor) (Token, bool, error) {
	if len(secret) < MinGivenSecret || strings.ContainsFunc(secret, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		return Token{}, false, &InvalidError{Reason: fmt.Sprintf("a node token must be at least %d characters without spaces", MinGivenSecret)}
	}
	find := func() (Token, error) {
		var row tokenRow
		db := s.db.WithContext(ctx)
		if err := db.Where("hash = ?", hashToken(secret)).Take(&row).Error; err != nil {
			return Token{}, notFound(err, "token")
		}
		ts, err := resolveTokens(db, []tokenRow{row})
		if err != nil {
			return Token{}, err
		}
		return ts[0], nil
	}
	tok, err := find()
	if err == nil || !errors.Is(err, ErrNotFound) {
		return tok, false, err
	}
	tok, err = s.createToken(ctx, TokenSpec{Name: name, Role: RoleNode, Fleet: true}, hashToken(secret), secret[len(secret)-4:], actor)
	if errors.Is(err, gorm.ErrDuplicatedKey) { // another console replica made it meanwhile
		tok, err = find()
		return tok, false, err
	}
	if err != nil {
		return Token{}, false, err
	}
	return tok, true, nil
}

// FindToken returns the live token for a secret, narrowed to what its
// owner holds now. Disabled and expired tokens, and tokens of a disabled
// owner (but for node tokens that serve a node already, see Token.live),
// are not found.
func (s *Store) FindToken(ctx context.Context, secret string) (Token, error) {
	return s.findToken(ctx, "hash = ?", hashToken(secret))
}

func (s *Store) findToken(ctx context.Context, where string, arg any) (Token, error) {
	var row tokenRow
	db := s.db.WithContext(ctx)
	if err := db.Where(where, arg).Take(&row).Error; err != nil {
		return Token{}, notFound(err, "token")
	}
	ts, err := resolveTokens(db, []tokenRow{row})
	if err != nil {
		return Token{}, err
	}
	if !ts[0].live(time.Now()) {
		return Token{}, fmt.Errorf("token disabled or expired, or its owner disabled: %w", ErrNotFound)
	}
	return ts[0], nil
}

// LiveTokens returns, of the tokens with secrets secrets, those that work
// now (as FindToken), by secret. A missing secret was revoked: its token
// disabled, rotated or expired, or its owner disabled.
func (s *Store) LiveTokens(ctx context.Context, secrets []string) (map[string]Token, error) {
	out := make(map[string]Token, len(secrets))
	if len(secrets) == 0 {
		return out, nil
	}
	bySecret := make(map[string]string, len(secrets))
	hashes := make([]string, len(secrets))
	for i, sec := range secrets {
		hashes[i] = hashToken(sec)
		bySecret[hashes[i]] = sec
	}
	// One array parameter, scanned by hand: a console replica checks the
	// tokens of all its nodes (thousands) every few seconds.
	rows, err := s.liveTokenRows(ctx, hashes)
	if err != nil {
		return nil, fmt.Errorf("check tokens: %w", err)
	}
	db := s.db.WithContext(ctx)
	ts, err := resolveTokens(db, rows)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	for i, t := range ts {
		if t.live(now) {
			out[bySecret[rows[i].Hash]] = t
		}
	}
	return out, nil
}

// AuthChanges returns how many committed statements may have revoked a
// token (migration 0021: a token disabled, rotated, re-scoped or deleted,
// its owner disabled or given another role). While it stays the same, the
// tokens LiveTokens found live still are, until they expire.
func (s *Store) AuthChanges(ctx context.Context) (int64, error) {
	var n int64
	if err := s.sql.QueryRowContext(ctx, "SELECT n FROM auth_changes").Scan(&n); err != nil {
		return 0, fmt.Errorf("read token changes: %w", err)
	}
	return n, nil
}

// tokenColumns are tokenRow's columns, in liveTokenRows' scan order.
const tokenColumns = "id, name, role, hash, last4, created_by, created_at, expires_at, disabled, rotated_at, node_id, owner_id, domains, read_only, fleet"

// liveTokenRows reads the token rows with these hashes.
func (s *Store) liveTokenRows(ctx context.Context, hashes []string) ([]tokenRow, error) {
	rs, err := s.sql.QueryContext(ctx, "SELECT "+tokenColumns+" FROM api_tokens WHERE hash = ANY($1::text[])", hashes)
	if err != nil {
		return nil, err
	}
	defer rs.Close()
	rows := make([]tokenRow, 0, len(hashes))
	for rs.Next() {
		var r tokenRow
		if err := rs.Scan(&r.ID, &r.Name, &r.Role, &r.Hash, &r.Last4, &r.CreatedBy, &r.CreatedAt, &r.ExpiresAt, &r.Disabled,
			&r.RotatedAt, &r.NodeID, &r.OwnerID, &r.Domains, &r.ReadOnly, &r.Fleet); err != nil {
			return nil, err
		}
		rows = append(rows, r)
	}
	return rows, rs.Err()
}

// ListTokens returns every token (never a secret), newest first.
func (s *Store) ListTokens(ctx context.Context) ([]Token, error) {
	db := s.db.WithContext(ctx)
	var rows []tokenRow
	if err := db.Order("id DESC").Find(&rows).Error; err != nil {
		return nil, fmt.Errorf("list tokens: %w", err)
	}
	return resolveTokens(db, rows)
}

// TransferToken hands token id to the user named username, who answers
// for it from now on: the token holds at most what they hold. The new
// owner must be enabled.
func (s *Store) TransferToken(ctx context.Context, id int64, username string, actor Actor) (Token, error) {
	var tok Token
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var row tokenRow
		if err := tx.Clauses(clause.Locking{Strength: "UPDATE"}).Where("id = ?", id).Take(&row).Error; err != nil {
			return notFound(err, fmt.Sprintf("token %d", id))
		}
		var u userRow
		if err := tx.Where("username = ?", username).Take(&u).Error; err != nil {
			return notFound(err, fmt.Sprintf("user %q", username))
		}
		if u.Disabled {
			return &RefusedError{Reason: fmt.Sprintf("user %q is disabled; hand the token to an enabled user", username)}
		}
		before, err := resolveTokens(tx, []tokenRow{row})
		if err != nil {
			return err
		}
		if row.OwnerID != nil && *row.OwnerID == u.ID {
			tok = before[0]
			return nil
		}
		if err := tx.Model(&tokenRow{}).Where("id = ?", id).Update("owner_id", u.ID).Error; err != nil {
			return fmt.Errorf("write token: %w", err)
		}
		row.OwnerID = &u.ID
		ts, err := resolveTokens(tx, []tokenRow{row})
		if err != nil {
			return err
		}
		tok = ts[0]
		return appendAudit(tx, actor, "token.owner", tokenTarget(id), "",
			map[string]any{"owner": before[0].Owner, "name": row.Name}, map[string]any{"owner": username, "name": row.Name})
	})
	if err != nil {
		return Token{}, fmt.Errorf("hand over token %d: %w", id, err)
	}
	return tok, nil
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
// A fleet token is never bound: any node id that no other live token holds
// may connect with it, and the caller refuses an id that is connected
// already (ClaimNodeRow). It returns the token as stored (its Fleet flag and
// Name), without its owner.
func (s *Store) ClaimNode(ctx context.Context, id int64, nodeID string, actor Actor) (Token, error) {
	var row tokenRow
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		// A fleet token's row is only read: its nodes, connecting at once
		// after a console restart, do not queue on a row lock.
		if err := tx.Where("id = ?", id).Take(&row).Error; err != nil {
			return notFound(err, fmt.Sprintf("token %d", id))
		}
		if row.Fleet {
			var n int64
			if err := tx.Model(&tokenRow{}).Where("node_id = ? AND NOT disabled", nodeID).Count(&n).Error; err != nil {
				return fmt.Errorf("read token bindings: %w", err)
			}
			if n > 0 {
				return &NodeBoundError{NodeID: nodeID}
			}
			return nil
		}
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
		row.NodeID = &nodeID
		return appendAudit(tx, actor, "token.bind", tokenTarget(id), "", map[string]any{"node_id": nil},
			map[string]any{"node_id": nodeID, "name": row.Name})
	})
	if err != nil {
		return row.token(), fmt.Errorf("claim node %q for token %d: %w", nodeID, id, err)
	}
	return row.token(), nil
}
