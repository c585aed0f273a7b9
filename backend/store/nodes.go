package store

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"gorm.io/gorm"
)

// Node statuses.
const (
	NodeConnected    = "connected"
	NodeDisconnected = "disconnected"
)

// Node kinds.
const (
	// NodeSluice is a Sluice enforcer on the push websocket.
	NodeSluice = "sluice"
	// NodeXDS is an xDS client (a stock envoyproxy/ratelimit) fed over ADS
	// (backend/xds).
	NodeXDS = "xds"
)

// VersionsChannel is the Postgres NOTIFY channel on which every new version
// is announced (payload: the version number). A trigger on the versions
// table sends it when the publishing transaction commits.
const VersionsChannel = "sluice_versions"

// Node is an enforcer as the console last saw it.
type Node struct {
	ID             string            `json:"id"`
	AppliedVersion int64             `json:"applied_version"`
	Status         string            `json:"status"`
	Labels         map[string]string `json:"labels"`
	Region         string            `json:"region"`
	Build          string            `json:"build"`
	Address        string            `json:"address"`
	Protocol       int               `json:"protocol"`
	ConnectedSince *time.Time        `json:"connected_since"`
	LastSeen       time.Time         `json:"last_seen"`
	// NackVersion, NackError and NackedAt describe the last version the
	// node rejected, while it still runs an older one; an ack of a version
	// at or above NackVersion clears them.
	NackVersion *int64     `json:"nack_version"`
	NackError   string     `json:"nack_error"`
	NackedAt    *time.Time `json:"nacked_at"`
	// Console is the id of the console replica holding the connection.
	Console string `json:"console"`
	// Session identifies one connection; a write from an older session of
	// the same node never overwrites a newer one.
	Session string `json:"-"`
	// Rates are the node's latest reported decision rates; nil when it is
	// disconnected or has not reported.
	Rates *NodeRates `json:"rates"`
	// Kind is NodeSluice (also when empty) or NodeXDS.
	Kind string `json:"kind"`
	// UnsupportedDomains are, for an xDS node, the domains of the version
	// it was last sent that it cannot run, left out of what it was sent.
	UnsupportedDomains []UnsupportedDomain `json:"unsupported_domains"`
	// TokenID and TokenName are the node token the node connected with;
	// nil for rows written before the registry kept them.
	TokenID   *int64  `json:"token_id"`
	TokenName *string `json:"token_name"`
}

// UnsupportedDomain is a domain an xDS node cannot run, and why.
type UnsupportedDomain struct {
	Domain  string   `json:"domain"`
	Reasons []string `json:"reasons"`
}

// NodeRates are a node's per-rule decisions per second over its latest
// stats interval, summed over its rules.
type NodeRates struct {
	At            time.Time `json:"at"`
	Decisions     float64   `json:"decisions_per_second"`
	Allowed       float64   `json:"allowed_per_second"`
	Limited       float64   `json:"limited_per_second"`
	ShadowLimited float64   `json:"shadow_limited_per_second"`
	StoreErrors   float64   `json:"store_errors_per_second"`
}

type nodeRow struct {
	ID             string `gorm:"primaryKey"`
	AppliedVersion int64
	Status         string
	Labels         string `gorm:"type:jsonb"`
	Build          string
	Address        string
	Protocol       int
	ConnectedSince *time.Time
	LastSeen       time.Time
	NackVersion    *int64
	NackError      string
	NackedAt       *time.Time
	SessionID      string
	ConsoleID      string
	Rates          *string `gorm:"type:jsonb"`
	Region         string
	Kind           string
	// UnsupportedDomains is JSON; the column is named unsupported_domains.
	UnsupportedDomains *string `gorm:"type:jsonb"`
	TokenID            *int64
	TokenName          *string `gorm:"->;-:migration"` // read only, joined from api_tokens
}

func (nodeRow) TableName() string { return "nodes" }

// nodeColumns are the columns SaveNodes writes, in order, with their types.
var nodeColumns = []struct{ name, typ string }{
	{"id", "text"}, {"applied_version", "bigint"}, {"status", "text"}, {"labels", "jsonb"}, {"build", "text"},
	{"address", "text"}, {"protocol", "integer"}, {"connected_since", "timestamptz"}, {"last_seen", "timestamptz"},
	{"nack_version", "bigint"}, {"nack_error", "text"}, {"nacked_at", "timestamptz"}, {"session_id", "text"},
	{"console_id", "text"}, {"rates", "jsonb"}, {"region", "text"}, {"kind", "text"}, {"unsupported_domains", "jsonb"}, {"token_id", "bigint"},
}

// saveNodesBatch bounds the rows of one INSERT, and so the rows written
// one by one when Postgres refuses a statement for its content, and the
// buffer each pooled connection keeps for the largest statement it sent
// (about 100 KB).
const saveNodesBatch = 250

// RefusedNodesError is returned by SaveNodes when Postgres refused some rows
// for their content (a data exception or an integrity violation, SQLSTATE
// class 22 or 23, such as a NUL byte in a text column): every other row was
// written, and writing these again would fail the same way.
type RefusedNodesError struct {
	IDs []string // the refused rows' node ids
	Err error    // the first refused row's error
}

func (e *RefusedNodesError) Error() string {
	return fmt.Sprintf("save nodes: %d rows refused: %v", len(e.IDs), e.Err)
}

func (e *RefusedNodesError) Unwrap() error { return e.Err }

// SaveNodes upserts registry rows, many per statement. A row is written
// unless the registry holds a newer connection of the same node: it is
// replaced when the session is the same, when the stored row is not
// connected or has not been seen for staleAfter, or when the new session
// started later. That way a replica that lost a node, or that learns of a
// disconnect late, never overwrites the replica that now holds it. Of
// several rows with one id, the last wins.
//
// One bad row never blocks the others: when Postgres refuses a statement
// for its content, its rows are written one by one, and the ones refused on
// their own are reported in a *RefusedNodesError after the rest are
// written. Any other error (the database unreachable) is returned as is.
func (s *Store) SaveNodes(ctx context.Context, nodes []Node, staleAfter time.Duration) error {
	if len(nodes) == 0 {
		return nil
	}
	// ON CONFLICT cannot touch one row twice in a statement.
	last := make(map[string]int, len(nodes))
	for i, n := range nodes {
		last[n.ID] = i
	}
	rows := make([]Node, 0, len(last))
	for i, n := range nodes {
		if last[n.ID] == i {
			rows = append(rows, n)
		}
	}
	var refused *RefusedNodesError
	for start := 0; start < len(rows); {
		size := min(saveNodesBatch, len(rows)-start)
		chunk := rows[start : start+size]
		start += size
		err := s.saveNodes(ctx, chunk, staleAfter)
		if err == nil {
			continue
		}
		if !refusedContent(err) {
			return err
		}
		for _, n := range chunk {
			err := s.saveNodes(ctx, []Node{n}, staleAfter)
			switch {
			case err == nil:
			case refusedContent(err):
				if refused == nil {
					refused = &RefusedNodesError{Err: err}
				}
				refused.IDs = append(refused.IDs, n.ID)
			default:
				return err
			}
		}
	}
	if refused != nil {
		return refused
	}
	return nil
}

// refusedContent reports whether Postgres refused a statement for the data
// it carries (SQLSTATE class 22, data exception, or 23, integrity
// constraint violation), which retrying cannot fix.
func refusedContent(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return strings.HasPrefix(pe.Code, "22") || strings.HasPrefix(pe.Code, "23")
	}
	return errors.Is(err, gorm.ErrDuplicatedKey) || errors.Is(err, gorm.ErrForeignKeyViolated) ||
		errors.Is(err, gorm.ErrCheckConstraintViolated)
}

// upsertNodesSQL upserts rows given as one array per column (parameters
// $1..$N, N = len(nodeColumns)) and updates an existing row where (its
// alias n, the new row EXCLUDED, $N+1 free for where's own use).
func upsertNodesSQL(where string) string {
	names := make([]string, len(nodeColumns))
	arrays := make([]string, len(nodeColumns))
	var set []string
	for i, c := range nodeColumns {
		names[i], arrays[i] = c.name, fmt.Sprintf("$%d::%s[]", i+1, c.typ)
		if i > 0 {
			set = append(set, c.name+" = EXCLUDED."+c.name)
		}
	}
	return "INSERT INTO nodes AS n (" + strings.Join(names, ", ") + ")\n" +
		"SELECT * FROM unnest(" + strings.Join(arrays, ", ") + ")\n" +
		"ON CONFLICT (id) DO UPDATE SET " + strings.Join(set, ", ") + "\n" + where
}

// saveNodesSQL upserts rows given as one array per column: one statement,
// prepared once per connection, whatever the row count, with one parameter
// per column (and the staleness bound) rather than one per column per row.
var saveNodesSQL = upsertNodesSQL(fmt.Sprintf(`	WHERE n.session_id = EXCLUDED.session_id
		OR n.status <> 'connected'
		OR n.connected_since IS NULL
		OR EXCLUDED.connected_since > n.connected_since
		OR n.last_seen < now() - make_interval(secs => $%d)`, len(nodeColumns)+1))

// claimNodeSQL writes one connected row unless the registry shows the node
// connected to another replica and seen since $N+1, or the row is the
// writing replica's own (its hub decides then).
var claimNodeSQL = upsertNodesSQL(fmt.Sprintf(`	WHERE n.console_id <> EXCLUDED.console_id AND NOT (n.status = 'connected' AND n.last_seen >= $%d)
	RETURNING n.id`, len(nodeColumns)+1))

// ClaimNode outcomes.
const (
	NodeClaimed       = iota // the row is n's now
	NodeLiveElsewhere        // another replica holds the node; n's row was not written
	NodeOwnReplica           // the row is n.Console's own; not written, its hub decides
)

// ClaimNodeRow writes n (a connected node of n.Console) to the registry in
// one statement unless another replica holds the node: its row says
// connected and it was seen at or after since. Two replicas claiming one
// id at once are serialized on its row, so exactly one wins. A fleet
// token's nodes claim their id this way, so no two nodes share one.
func (s *Store) ClaimNodeRow(ctx context.Context, n Node, since time.Time) (int, error) {
	args, err := nodeArgs([]Node{n})
	if err != nil {
		return 0, err
	}
	var id string
	err = s.sql.QueryRowContext(ctx, claimNodeSQL, append(args, since.UTC())...).Scan(&id)
	switch {
	case err == nil:
		return NodeClaimed, nil
	case !errors.Is(err, sql.ErrNoRows):
		return 0, fmt.Errorf("claim node %q: %w", n.ID, err)
	}
	var console string
	if err := s.sql.QueryRowContext(ctx, "SELECT console_id FROM nodes WHERE id = $1", n.ID).Scan(&console); err != nil {
		return 0, fmt.Errorf("claim node %q: %w", n.ID, err)
	}
	if console == n.Console {
		return NodeOwnReplica, nil
	}
	return NodeLiveElsewhere, nil
}

func (s *Store) saveNodes(ctx context.Context, nodes []Node, staleAfter time.Duration) error {
	args, err := nodeArgs(nodes)
	if err != nil {
		return err
	}
	if _, err := s.sql.ExecContext(ctx, saveNodesSQL, append(args, staleAfter.Seconds())...); err != nil {
		return fmt.Errorf("save %d nodes: %w", len(nodes), err)
	}
	return nil
}

// nodeArgs are nodes as one array per column of nodeColumns, in order.
func nodeArgs(nodes []Node) ([]any, error) {
	k := len(nodes)
	ids, statuses, labels, builds, addrs := make([]string, k), make([]string, k), make([]string, k), make([]string, k), make([]string, k)
	nackErrs, sessions, consoles := make([]string, k), make([]string, k), make([]string, k)
	versions, nackVersions, protocols := make([]int64, k), make([]*int64, k), make([]int32, k)
	since, seen, nacked := make([]*time.Time, k), make([]time.Time, k), make([]*time.Time, k)
	rates, regions, kinds, unsupported, tokens := make([]*string, k), make([]string, k), make([]string, k), make([]*string, k), make([]*int64, k)
	for i, n := range nodes {
		regions[i] = n.Region
		labels[i] = "{}"
		if len(n.Labels) > 0 {
			b, err := json.Marshal(n.Labels)
			if err != nil {
				return nil, fmt.Errorf("save node %q: encode labels: %w", n.ID, err)
			}
			labels[i] = string(b)
		}
		var err error
		if rates[i], err = encodeRates(n); err != nil {
			return nil, fmt.Errorf("save node %q: %w", n.ID, err)
		}
		kinds[i] = cmp.Or(n.Kind, NodeSluice)
		if len(n.UnsupportedDomains) > 0 {
			b, err := json.Marshal(n.UnsupportedDomains)
			if err != nil {
				return nil, fmt.Errorf("save node %q: encode unsupported domains: %w", n.ID, err)
			}
			u := string(b)
			unsupported[i] = &u
		}
		ids[i], versions[i], statuses[i], builds[i], addrs[i], protocols[i] = n.ID, n.AppliedVersion, n.Status, n.Build, n.Address, int32(n.Protocol)
		since[i], seen[i], nackVersions[i], nackErrs[i], nacked[i] = utcPtr(n.ConnectedSince), n.LastSeen.UTC(), n.NackVersion, n.NackError, utcPtr(n.NackedAt)
		sessions[i], consoles[i], tokens[i] = n.Session, n.Console, n.TokenID
	}
	return []any{ids, versions, statuses, labels, builds, addrs, protocols,
		since, seen, nackVersions, nackErrs, nacked, sessions, consoles, rates, regions, kinds, unsupported, tokens}, nil
}

// updateNodesSQL rewrites the columns a connected node's messages change
// (acks, nacks, stats, heartbeats) in rows its connection wrote, given as
// one array per column, and returns the ids it rewrote.
const updateNodesSQL = `UPDATE nodes AS n SET applied_version = u.applied_version, last_seen = u.last_seen,
	nack_version = u.nack_version, nack_error = u.nack_error, nacked_at = u.nacked_at, rates = u.rates
FROM unnest($1::text[], $2::text[], $3::bigint[], $4::timestamptz[], $5::bigint[], $6::text[], $7::timestamptz[], $8::jsonb[])
	AS u(id, session_id, applied_version, last_seen, nack_version, nack_error, nacked_at, rates)
WHERE n.id = u.id AND n.session_id = u.session_id AND n.status = 'connected'
RETURNING n.id`

// UpdateNodes writes the rows of connected nodes whose connection already
// wrote its row with SaveNodes and changed since only what the node's
// messages change: the applied version, the last nack, last_seen and
// rates. It is cheaper than SaveNodes (8 columns rather than 15, no
// conflict handling). It returns the nodes whose row no longer belongs to
// that connection (another replica holds the node, or the row says it is
// not connected); write those with SaveNodes, which decides whether they
// may overwrite the row. The nodes of a chunk Postgres refused are
// returned the same way, for SaveNodes to write or report one by one.
// Each id may appear once (the hub holds one connection per node).
func (s *Store) UpdateNodes(ctx context.Context, nodes []Node) (rest []Node, err error) {
	for start := 0; start < len(nodes); start += saveNodesBatch {
		chunk := nodes[start:min(start+saveNodesBatch, len(nodes))]
		left, err := s.updateNodes(ctx, chunk)
		if err != nil && !refusedContent(err) {
			return nil, err
		}
		rest = append(rest, left...)
	}
	return rest, nil
}

func (s *Store) updateNodes(ctx context.Context, nodes []Node) ([]Node, error) {
	k := len(nodes)
	ids, sessions, nackErrs := make([]string, k), make([]string, k), make([]string, k)
	versions, nackVersions := make([]int64, k), make([]*int64, k)
	seen, nacked := make([]time.Time, k), make([]*time.Time, k)
	rates := make([]*string, k)
	for i, n := range nodes {
		var err error
		if rates[i], err = encodeRates(n); err != nil {
			return nil, fmt.Errorf("update node %q: %w", n.ID, err)
		}
		ids[i], sessions[i], versions[i], seen[i] = n.ID, n.Session, n.AppliedVersion, n.LastSeen.UTC()
		nackVersions[i], nackErrs[i], nacked[i] = n.NackVersion, n.NackError, utcPtr(n.NackedAt)
	}
	rows, err := s.sql.QueryContext(ctx, updateNodesSQL, ids, sessions, versions, seen, nackVersions, nackErrs, nacked, rates)
	if err != nil {
		return nodes, fmt.Errorf("update %d nodes: %w", k, err)
	}
	defer rows.Close()
	written := make(map[string]bool, k)
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nodes, fmt.Errorf("update %d nodes: %w", k, err)
		}
		written[id] = true
	}
	if err := rows.Err(); err != nil {
		return nodes, fmt.Errorf("update %d nodes: %w", k, err)
	}
	var rest []Node
	for _, n := range nodes {
		if !written[n.ID] {
			rest = append(rest, n)
		}
	}
	return rest, nil
}

// encodeRates returns n's rates as JSON for the rates column, or nil.
func encodeRates(n Node) (*string, error) {
	if n.Rates == nil {
		return nil, nil
	}
	b, err := json.Marshal(n.Rates)
	if err != nil {
		return nil, fmt.Errorf("encode rates: %w", err)
	}
	r := string(b)
	return &r, nil
}

func utcPtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

// ListNodes returns every known node, by id, as stored.
func (s *Store) ListNodes(ctx context.Context) ([]Node, error) {
	var rows []nodeRow
	err := s.db.WithContext(ctx).Table("nodes AS n").Select("n.*, t.name AS token_name").
		Joins("LEFT JOIN api_tokens t ON t.id = n.token_id").Order("n.id").Find(&rows).Error
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	out := make([]Node, len(rows))
	for i, r := range rows {
		n := Node{ID: r.ID, AppliedVersion: r.AppliedVersion, Status: r.Status, Build: r.Build, Address: r.Address,
			Protocol: r.Protocol, ConnectedSince: r.ConnectedSince, LastSeen: r.LastSeen, NackVersion: r.NackVersion,
			NackError: r.NackError, NackedAt: r.NackedAt, Session: r.SessionID, Console: r.ConsoleID, Region: r.Region,
			Kind: cmp.Or(r.Kind, NodeSluice), TokenID: r.TokenID, TokenName: r.TokenName}
		if err := json.Unmarshal([]byte(r.Labels), &n.Labels); err != nil {
			return nil, fmt.Errorf("list nodes: node %q labels: %w", r.ID, err)
		}
		if r.UnsupportedDomains != nil {
			if err := json.Unmarshal([]byte(*r.UnsupportedDomains), &n.UnsupportedDomains); err != nil {
				return nil, fmt.Errorf("list nodes: node %q unsupported domains: %w", r.ID, err)
			}
		}
		if r.Rates != nil {
			n.Rates = &NodeRates{}
			if err := json.Unmarshal([]byte(*r.Rates), n.Rates); err != nil {
				return nil, fmt.Errorf("list nodes: node %q rates: %w", r.ID, err)
			}
		}
		out[i] = n
	}
	return out, nil
}

// VersionCounts says how many connected nodes run each version.
type VersionCounts struct {
	Connected int
	ByVersion map[int64]int // applied version → nodes running it
}

// RegionCount counts the distinct regions named by the nodes connected
// and seen at or after seenAfter.
func (s *Store) RegionCount(ctx context.Context, seenAfter time.Time) (int, error) {
	var n int
	err := s.db.WithContext(ctx).Raw(`SELECT count(DISTINCT region) FROM nodes
		WHERE status = ? AND last_seen >= ? AND region <> ''`, NodeConnected, seenAfter.UTC()).Scan(&n).Error
	if err != nil {
		return 0, fmt.Errorf("count node regions: %w", err)
	}
	return n, nil
}

// AppliedCounts counts the connected nodes by the version they run. A node
// counts as connected when its row says so and it was seen at or after
// seenAfter (a replica that died cannot mark its nodes disconnected).
func (s *Store) AppliedCounts(ctx context.Context, seenAfter time.Time) (VersionCounts, error) {
	var rows []struct {
		AppliedVersion int64
		Nodes          int
	}
	err := s.db.WithContext(ctx).Raw(`SELECT applied_version, count(*) AS nodes FROM nodes
		WHERE status = ? AND last_seen >= ? GROUP BY applied_version`, NodeConnected, seenAfter.UTC()).Scan(&rows).Error
	if err != nil {
		return VersionCounts{}, fmt.Errorf("count nodes by version: %w", err)
	}
	out := VersionCounts{ByVersion: make(map[int64]int, len(rows))}
	for _, r := range rows {
		out.ByVersion[r.AppliedVersion] = r.Nodes
		out.Connected += r.Nodes
	}
	return out, nil
}

// DeleteNodesSeenBefore forgets nodes not seen since before and returns how
// many it removed.
func (s *Store) DeleteNodesSeenBefore(ctx context.Context, before time.Time) (int64, error) {
	res := s.db.WithContext(ctx).Exec("DELETE FROM nodes WHERE last_seen < ?", before.UTC())
	if res.Error != nil {
		return 0, fmt.Errorf("delete old nodes: %w", res.Error)
	}
	return res.RowsAffected, nil
}
