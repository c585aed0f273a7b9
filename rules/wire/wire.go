// Package wire defines the messages the console and the enforcers exchange
// over the push websocket (/api/v1/nodes/stream). Both sides import this one
// definition. Every message is a JSON object with a "type" field.
package wire

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// ProtocolVersion is the version of this protocol a node speaks in Hello.
const ProtocolVersion = 1

// MaxMessageBytes bounds one websocket message in either direction.
const MaxMessageBytes = 16 << 20

// Message types.
const (
	TypeHello    = "hello"
	TypeSnapshot = "snapshot"
	TypeAck      = "ack"
	TypeNack     = "nack"
	TypeStats    = "stats"
)

// Hello is the first message a node sends after connecting.
type Hello struct {
	Type           string            `json:"type"`
	Protocol       int               `json:"protocol"`
	NodeID         string            `json:"node_id"`
	AppliedVersion int64             `json:"applied_version"`
	Labels         map[string]string `json:"labels,omitempty"`
	Build          string            `json:"build,omitempty"`
}

// DomainConfig is one domain's YAML source inside a snapshot.
type DomainConfig struct {
	Name string `json:"name"`
	YAML string `json:"yaml"`
}

// Snapshot carries a whole ruleset version to a node.
type Snapshot struct {
	Type      string         `json:"type"`
	Version   int64          `json:"version"`
	Checksum  string         `json:"checksum"`
	Domains   []DomainConfig `json:"domains"`
	NodeCount int            `json:"node_count"`
}

// Ack reports that a node applied a version.
type Ack struct {
	Type    string `json:"type"`
	Version int64  `json:"version"`
}

// Nack reports that a node could not apply a version and kept its old one.
type Nack struct {
	Type    string `json:"type"`
	Version int64  `json:"version"`
	Error   string `json:"error"`
}

// RuleStats counts one rule's decisions over one stats interval.
type RuleStats struct {
	Domain        string `json:"domain"`
	Rule          string `json:"rule"`
	Allowed       int64  `json:"allowed"`
	Limited       int64  `json:"limited"`
	ShadowLimited int64  `json:"shadow_limited"`
	StoreErrors   int64  `json:"store_errors"`
}

// Stats is a node's periodic report of its decisions.
type Stats struct {
	Type       string      `json:"type"`
	IntervalMS int64       `json:"interval_ms"`
	Rules      []RuleStats `json:"rules,omitempty"`
}

// Checksum is the SHA-256 over a ruleset's domains, independent of their order.
func Checksum(domains []DomainConfig) string {
	sorted := slices.Clone(domains)
	slices.SortFunc(sorted, func(a, b DomainConfig) int { return strings.Compare(a.Name, b.Name) })
	h := sha256.New()
	for _, d := range sorted {
		fmt.Fprintf(h, "%d:%s\n%d:%s\n", len(d.Name), d.Name, len(d.YAML), d.YAML)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// ErrUnknownType is returned by Decode for a message whose type is unknown.
var ErrUnknownType = errors.New("unknown message type")

// Decode parses one message into *Hello, *Snapshot, *Ack, *Nack or *Stats.
func Decode(data []byte) (any, error) {
	var head struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return nil, fmt.Errorf("decode message: %w", err)
	}
	var msg any
	switch head.Type {
	case TypeHello:
		msg = &Hello{}
	case TypeSnapshot:
		msg = &Snapshot{}
	case TypeAck:
		msg = &Ack{}
	case TypeNack:
		msg = &Nack{}
	case TypeStats:
		msg = &Stats{}
	default:
		return nil, fmt.Errorf("decode message: %w %q", ErrUnknownType, head.Type)
	}
	if err := json.Unmarshal(data, msg); err != nil {
		return nil, fmt.Errorf("decode %s message: %w", head.Type, err)
	}
	return msg, nil
}
