package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"gorm.io/gorm/clause"
)

// Node statuses.
const (
	NodeConnected    = "connected"
	NodeDisconnected = "disconnected"
)

// Node is an enforcer as the console last saw it.
type Node struct {
	ID             string            `json:"id"`
	AppliedVersion int64             `json:"applied_version"`
	Status         string            `json:"status"`
	Labels         map[string]string `json:"labels"`
	Build          string            `json:"build"`
	Address        string            `json:"address"`
	ConnectedSince *time.Time        `json:"connected_since"`
	LastSeen       time.Time         `json:"last_seen"`
	NackVersion    *int64            `json:"nack_version"`
	NackError      string            `json:"nack_error"`
}

type nodeRow struct {
	ID             string `gorm:"primaryKey"`
	AppliedVersion int64
	Status         string
	Labels         string `gorm:"type:jsonb"`
	Build          string
	Address        string
	ConnectedSince *time.Time
	LastSeen       time.Time
	NackVersion    *int64
	NackError      string
}

func (nodeRow) TableName() string { return "nodes" }

// SaveNode inserts or replaces a node's registry row.
func (s *Store) SaveNode(ctx context.Context, n Node) error {
	labels, err := json.Marshal(n.Labels)
	if err != nil || n.Labels == nil {
		labels = []byte("{}")
	}
	row := nodeRow{
		ID: n.ID, AppliedVersion: n.AppliedVersion, Status: n.Status, Labels: string(labels), Build: n.Build,
		Address: n.Address, ConnectedSince: n.ConnectedSince, LastSeen: n.LastSeen.UTC(),
		NackVersion: n.NackVersion, NackError: n.NackError,
	}
	err = s.db.WithContext(ctx).Clauses(clause.OnConflict{UpdateAll: true}).Create(&row).Error
	if err != nil {
		return fmt.Errorf("save node %q: %w", n.ID, err)
	}
	return nil
}

// ListNodes returns every known node, by id.
func (s *Store) ListNodes(ctx context.Context) ([]Node, error) {
	var rows []nodeRow
	if err := s.db.WithContext(ctx).Order("id").Find(&rows).Error; err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	out := make([]Node, len(rows))
	for i, r := range rows {
		n := Node{ID: r.ID, AppliedVersion: r.AppliedVersion, Status: r.Status, Build: r.Build, Address: r.Address,
			ConnectedSince: r.ConnectedSince, LastSeen: r.LastSeen, NackVersion: r.NackVersion, NackError: r.NackError}
		_ = json.Unmarshal([]byte(r.Labels), &n.Labels)
		out[i] = n
	}
	return out, nil
}
