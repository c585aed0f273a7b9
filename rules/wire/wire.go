// Package wire defines the messages the console and the enforcers exchange
// over the push websocket (/api/v1/nodes/stream). Both sides import this one
// definition. Every message is a JSON object with a "type" field.
//
// The conversation: the node sends Hello; the console answers with a
// Snapshot whenever the node is behind; the node answers each snapshot with
// Ack or Nack and sends Stats every second. Websocket ping/pong keeps the
// connection alive both ways. The console closes a connection with one of
// the Close* codes (or a standard websocket code) and a human-readable
// reason.
//
// Compatibility: ProtocolVersion is the protocol's major version; the
// console refuses a Hello with a major version it does not speak. Within one
// major version, new optional fields and new message types may be added:
// receivers ignore unknown fields, and Decode reports unknown types with
// ErrUnknownType so a receiver can skip them.
package wire

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"unicode/utf8"
)

// ProtocolVersion is the major version of this protocol, sent in Hello.
const ProtocolVersion = 1

// Message size limits, enforced by the receiving side as its websocket
// read limit.
const (
	// MaxMessageBytes bounds a message from the console to a node (a
	// snapshot holds every domain's YAML).
	MaxMessageBytes = 16 << 20
	// MaxNodeMessageBytes bounds a message from a node to the console
	// (hello, ack, nack, stats).
	MaxNodeMessageBytes = 1 << 20
	// MaxSnapshotBytes bounds the encoded Snapshot of a version the
	// console may publish: MaxMessageBytes less 64 KiB of headroom for
	// what changes from one send to the next (node_count) and for older
	// nodes' margins. The console refuses a publish whose snapshot would
	// be larger, so every version fits what nodes read; a node that is
	// sent a larger one anyway nacks it.
	MaxSnapshotBytes = MaxMessageBytes - 64<<10
)

// Websocket close codes (RFC 6455 private range) the console uses, beside
// the standard ones (1001 going away, 1008 policy violation for a malformed
// message, 1009 message too big, 1013 try again later for a node that fell
// too far behind).
const (
	// CloseUnsupportedProtocol: Hello carried a protocol major version the
	// console does not speak.
	CloseUnsupportedProtocol = 4001
	// CloseReplaced: another connection with the same node id reached this
	// console; the newer one wins.
	CloseReplaced = 4002
	// CloseNodeBound: the node token is bound to another node id, or the
	// node id to another token (the reason says which); one token per node.
	CloseNodeBound = 4003
	// CloseRevoked: the connection's credential stopped working (a token
	// disabled, rotated or expired, or its owner disabled; a session
	// signed out or expired, or its user disabled or their role changed).
	// Reconnecting with the same credential is refused.
	CloseRevoked = 4004
	// CloseDuplicateNode: a node connected with a fleet node token as a
	// node id that is connected already; node ids must be unique.
	CloseDuplicateNode = 4005
)

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
	Type     string `json:"type"`
	Protocol int    `json:"protocol"`
	NodeID   string `json:"node_id"`
	// AppliedVersion is the version the node enforces (0: none); the
	// console sends a snapshot only when it has a newer one.
	AppliedVersion int64             `json:"applied_version"`
	Labels         map[string]string `json:"labels,omitempty"`
	Build          string            `json:"build,omitempty"`
	// Region is the node's region (sluice enforcer --region); "" for a
	// node that runs in no named region. The console counts the regions
	// of the connected nodes for Snapshot.RegionCount.
	Region string `json:"region,omitempty"`
}

// Limits on what a Hello may carry, checked by Hello.Validate.
const (
	MaxNodeIDBytes = 256
	MaxLabels      = 64
	MaxLabelBytes  = 256 // per key and per value
	MaxBuildBytes  = 256
	MaxRegionBytes = 64
)

// CheckProtocol returns an error naming both versions when a node's
// protocol major version is not the one this build speaks.
func CheckProtocol(v int) error {
	if v != ProtocolVersion {
		return fmt.Errorf("unsupported protocol version %d: this console speaks version %d", v, ProtocolVersion)
	}
	return nil
}

// Validate checks a Hello's fields (not its protocol version; see
// CheckProtocol). The node id, label keys and values and build must be
// valid UTF-8 without NUL (U+0000): they are stored as Postgres text and
// jsonb, which refuse NUL, so one such hello must be refused here rather
// than fail the registry writes of every node.
func (h *Hello) Validate() error {
	switch {
	case h.NodeID == "":
		return errors.New("hello: node_id is required")
	case len(h.NodeID) > MaxNodeIDBytes:
		return fmt.Errorf("hello: node_id is over %d bytes", MaxNodeIDBytes)
	case !isText(h.NodeID):
		return errors.New("hello: node_id must be valid UTF-8 without NUL")
	case h.AppliedVersion < 0:
		return fmt.Errorf("hello: applied_version %d is negative", h.AppliedVersion)
	case len(h.Labels) > MaxLabels:
		return fmt.Errorf("hello: more than %d labels", MaxLabels)
	case len(h.Build) > MaxBuildBytes:
		return fmt.Errorf("hello: build is over %d bytes", MaxBuildBytes)
	case !isText(h.Build):
		return errors.New("hello: build must be valid UTF-8 without NUL")
	}
	if err := CheckRegion(h.Region); err != nil {
		return fmt.Errorf("hello: %w", err)
	}
	for k, v := range h.Labels {
		if k == "" || len(k) > MaxLabelBytes || len(v) > MaxLabelBytes {
			return fmt.Errorf("hello: label %q: keys must be 1-%d bytes, values at most %d", CleanText(abbrev(k, 40)), MaxLabelBytes, MaxLabelBytes)
		}
		if !isText(k) || !isText(v) {
			return fmt.Errorf("hello: label %q: keys and values must be valid UTF-8 without NUL", CleanText(abbrev(k, 40)))
		}
	}
	return nil
}

// CheckRegion checks a region name: at most MaxRegionBytes of letters,
// digits, '-', '_' and '.' ("" is no region).
func CheckRegion(r string) error {
	if len(r) > MaxRegionBytes {
		return fmt.Errorf("region is over %d bytes", MaxRegionBytes)
	}
	for _, c := range r {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return fmt.Errorf("region %q: only letters, digits, '-', '_' and '.' are allowed", CleanText(abbrev(r, 40)))
		}
	}
	return nil
}

// isText reports whether s is valid UTF-8 without NUL.
func isText(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsRune(s, 0)
}

// CleanText returns s with each NUL and each invalid UTF-8 sequence replaced
// by U+FFFD: free text from a node (a Nack's error) is kept, readable,
// in a form Postgres text columns accept.
func CleanText(s string) string {
	if isText(s) {
		return s
	}
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}

// DomainConfig is one domain's YAML source inside a snapshot.
type DomainConfig struct {
	Name string `json:"name"`
	YAML string `json:"yaml"`
}

// Snapshot carries a whole ruleset version to a node.
type Snapshot struct {
	Type     string         `json:"type"`
	Version  int64          `json:"version"`
	Checksum string         `json:"checksum"`
	Domains  []DomainConfig `json:"domains"`
	// NodeCount is how many nodes were connected to the console replicas
	// when this version was first sent; it is not updated as nodes come
	// and go.
	NodeCount int `json:"node_count"`
	// RegionCount is how many distinct regions those nodes reported in
	// their Hello (0 when none named one): a scope: global limit is shared
	// between them while the global store is unreachable.
	RegionCount int `json:"region_count,omitempty"`
}

// Ack reports that a node applied a version.
type Ack struct {
	Type    string `json:"type"`
	Version int64  `json:"version"`
}

// Nack reports that a node could not apply a version and kept its old one.
// Error is the node's free text; the console stores it through CleanText.
type Nack struct {
	Type    string `json:"type"`
	Version int64  `json:"version"`
	Error   string `json:"error"`
}

// ValueCount is a descriptor value and how many times a rule limited it.
type ValueCount struct {
	Value string `json:"value"`
	Count int64  `json:"count"`
}

// RuleStats counts one rule's decisions over one stats interval. Rule is the
// limit's name (rules.Limit.Name).
type RuleStats struct {
	Domain        string `json:"domain"`
	Rule          string `json:"rule"`
	Allowed       int64  `json:"allowed"`
	Limited       int64  `json:"limited"`
	ShadowLimited int64  `json:"shadow_limited"`
	StoreErrors   int64  `json:"store_errors"`
	// TopLimited lists the descriptor values this rule limited most in the
	// interval, most first (at most MaxTopValues), when the node tracks
	// them.
	TopLimited []ValueCount `json:"top_limited,omitempty"`
	// Values is the exact count of each descriptor value this rule limited
	// in the interval, as far as the node tracked them (at most MaxValues,
	// most first, each value once). Limited less their sum is what the
	// node limited without naming the value: the console then knows that
	// its per-value figures for the interval are only lower bounds. A node
	// that predates Values sends none (all of Limited is unnamed).
	Values []ValueCount `json:"values,omitempty"`
}

// Limits on a Stats message, checked by Stats.Validate.
const (
	MaxStatsRules = 10000
	MaxTopValues  = 10
	// MaxValues bounds one rule's Values in one report.
	MaxValues = 4096
)

// Stats is a node's periodic report of its decisions since its previous
// report. IntervalMS is the time that report covers.
type Stats struct {
	Type       string      `json:"type"`
	IntervalMS int64       `json:"interval_ms"`
	Rules      []RuleStats `json:"rules,omitempty"`
	// Preview holds the spans that ended since the previous report, per
	// rule (see RulePreview); at most MaxStatsRules.
	Preview []RulePreview `json:"preview,omitempty"`
}

// Validate checks a Stats message's bounds, the message's and every
// row's; Clean drops the rows that fail them instead.
func (s *Stats) Validate() error {
	if err := s.checkEnvelope(); err != nil {
		return err
	}
	for i, r := range s.Rules {
		if r.Allowed < 0 || r.Limited < 0 || r.ShadowLimited < 0 || r.StoreErrors < 0 {
			return fmt.Errorf("stats: rules[%d]: negative count", i)
		}
		if len(r.TopLimited) > MaxTopValues {
			return fmt.Errorf("stats: rules[%d]: more than %d top values", i, MaxTopValues)
		}
		if len(r.Values) > MaxValues {
			return fmt.Errorf("stats: rules[%d]: more than %d values", i, MaxValues)
		}
		sum := int64(0)
		for _, v := range r.Values {
			if v.Count <= 0 || v.Count > r.Limited {
				return fmt.Errorf("stats: rules[%d]: a value's count %d is not within 1..limited (%d)", i, v.Count, r.Limited)
			}
			// Compared before adding: the sum never overflows.
			if v.Count > r.Limited-sum {
				return fmt.Errorf("stats: rules[%d]: the values' counts add up to more than limited (%d)", i, r.Limited)
			}
			sum += v.Count
		}
	}
	return validatePreviews(s.Preview)
}

// checkEnvelope checks the bounds of the message as a whole.
func (s *Stats) checkEnvelope() error {
	switch {
	case s.IntervalMS <= 0:
		return fmt.Errorf("stats: interval_ms %d must be positive", s.IntervalMS)
	case len(s.Rules) > MaxStatsRules:
		return fmt.Errorf("stats: more than %d rules", MaxStatsRules)
	case len(s.Preview) > MaxStatsRules:
		return fmt.Errorf("stats: more than %d previews", MaxStatsRules)
	}
	return nil
}

// Quota usage (billing). A node sends a Quota batch of the hits its calendar
// (day, week, month, year) limits admitted per descriptor value and
// period, at most every few seconds and on shutdown, and keeps it until
// the console answers with a QuotaAck of the same epoch and seq; it resends
// an unacknowledged batch, and the console applies a batch of one node and
// epoch at most once (seq must be above the last it applied), so a resend
// after a lost ack is not counted twice. Epoch names one run of the node
// process: seqs start again at 1 in a new epoch.
const (
	TypeQuota    = "quota"
	TypeQuotaAck = "quota_ack"
)

// Bounds of a Quota batch, checked by Quota.Validate.
const (
	MaxQuotaUsage      = 2000          // entries per batch: one console transaction
	MaxQuotaValueBytes = MaxValueBytes // a longer value is sent as a prefix and a hash (Value)
	MaxQuotaEpochBytes = 64
)

// QuotaUsage is the hits one limit admitted for one descriptor value in one
// calendar period since the node's previous batch. Start is the period's
// start in Unix seconds (UTC), Unit its length and Limit the limit's
// requests_per_unit when counted.
type QuotaUsage struct {
	Domain string `json:"domain"`
	Rule   string `json:"rule"`
	Unit   string `json:"unit"`
	Value  string `json:"value"`
	Start  int64  `json:"start"`
	Hits   int64  `json:"hits"`
	Limit  int64  `json:"limit"`
}

// Quota is one batch of a node's quota usage. Dropped is the hits the node
// could not record since its previous batch because it held the most
// distinct entries it keeps (engine.QuotaMaxEntries) while the console did
// not take them.
type Quota struct {
	Type    string       `json:"type"`
	Epoch   string       `json:"epoch"`
	Seq     int64        `json:"seq"`
	Usage   []QuotaUsage `json:"usage"`
	Dropped int64        `json:"dropped,omitempty"`
}

// QuotaAck tells a node that the console stored its batch Seq of Epoch.
type QuotaAck struct {
	Type  string `json:"type"`
	Epoch string `json:"epoch"`
	Seq   int64  `json:"seq"`
}

// Validate checks a Quota batch's bounds: every text field valid UTF-8
// without NUL (they are stored as Postgres text), units day, week, month or
// year, positive hits, limits from 0 to the largest requests_per_unit and
// no hits above the limit. Clean drops the rows that fail them instead.
func (q *Quota) Validate() error {
	if err := q.checkEnvelope(); err != nil {
		return err
	}
	for i := range q.Usage {
		if err := q.Usage[i].check(); err != nil {
			return fmt.Errorf("quota: usage[%d]: %w", i, err)
		}
	}
	return nil
}

// checkEnvelope checks the bounds of the batch as a whole.
func (q *Quota) checkEnvelope() error {
	switch {
	case q.Epoch == "" || len(q.Epoch) > MaxQuotaEpochBytes || !isText(q.Epoch):
		return fmt.Errorf("quota: epoch must be 1-%d bytes of UTF-8 text", MaxQuotaEpochBytes)
	case q.Seq <= 0:
		return fmt.Errorf("quota: seq %d must be positive", q.Seq)
	case len(q.Usage) > MaxQuotaUsage:
		return fmt.Errorf("quota: more than %d usage entries", MaxQuotaUsage)
	case q.Dropped < 0:
		return fmt.Errorf("quota: dropped %d is negative", q.Dropped)
	}
	return nil
}

// check checks one usage entry's bounds.
func (u *QuotaUsage) check() error {
	switch {
	case u.Domain == "" || u.Rule == "" || len(u.Domain) > 1<<10 || len(u.Rule) > 1<<10:
		return errors.New("domain and rule must be 1-1024 bytes")
	case len(u.Value) > MaxQuotaValueBytes:
		return fmt.Errorf("value is over %d bytes", MaxQuotaValueBytes)
	case !isText(u.Domain) || !isText(u.Rule) || !isText(u.Value):
		return errors.New("domain, rule and value must be valid UTF-8 without NUL")
	case u.Unit != "day" && u.Unit != "week" && u.Unit != "month" && u.Unit != "year":
		return fmt.Errorf("unit %q is not day, week, month or year", abbrev(u.Unit, 20))
	case u.Hits <= 0 || u.Limit < 0:
		return errors.New("hits must be positive and limit non-negative")
	case u.Limit > math.MaxUint32 || u.Hits > u.Limit:
		// requests_per_unit is a uint32, and a quota never admits more
		// than its limit: this bounds what one batch adds to a bigint.
		return fmt.Errorf("hits %d over limit %d, or limit over %d", u.Hits, u.Limit, uint32(math.MaxUint32))
	case u.Start < 0 || u.Start > 253402300799: // 9999-12-31
		return fmt.Errorf("start %d is out of range", u.Start)
	}
	return nil
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

// Decode parses one message into *Hello, *Snapshot, *Ack, *Nack, *Stats,
// *Quota or *QuotaAck.
func Decode(data []byte) (any, error) {
	typ, err := messageType(data)
	if err != nil {
		return nil, fmt.Errorf("decode message: %w", err)
	}
	var msg any
	switch typ {
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
	case TypeQuota:
		msg = &Quota{}
	case TypeQuotaAck:
		msg = &QuotaAck{}
	default:
		return nil, fmt.Errorf("decode message: %w %q", ErrUnknownType, abbrev(typ, 40))
	}
	if err := json.Unmarshal(data, msg); err != nil {
		return nil, fmt.Errorf("decode %s message: %w", typ, err)
	}
	return msg, nil
}

// messageType reads the "type" member of a JSON object without decoding
// the rest when it comes first, as every message this package encodes has
// it: decoding a stats report then scans it once, not twice. Whether the
// whole message is valid JSON is left to the decode that follows.
func messageType(data []byte) (string, error) {
	if typ, ok := plainType(data); ok {
		return typ, nil
	}
	return decodedType(data)
}

// plainType reads the type of a message in the form json.Marshal writes
// this package's messages, without a decoder: the "type" member first, a
// string of lower-case letters and underscores. ok is false for any other
// form (decodedType reads those, with the same result for this one).
func plainType(data []byte) (typ string, ok bool) {
	rest, ok := bytes.CutPrefix(data, []byte(`{"type":"`))
	if !ok {
		return "", false
	}
	for i, b := range rest {
		switch {
		case b == '"':
			// A known type without allocating a copy (a map lookup by
			// string(bytes) copies nothing).
			if typ, known := knownTypes[string(rest[:i])]; known {
				return typ, true
			}
			return string(rest[:i]), true
		case b != '_' && (b < 'a' || b > 'z'):
			return "", false
		}
	}
	return "", false
}

// knownTypes maps each message type to itself, so that plainType returns
// the constant rather than a copy.
var knownTypes = map[string]string{TypeHello: TypeHello, TypeSnapshot: TypeSnapshot, TypeAck: TypeAck,
	TypeNack: TypeNack, TypeStats: TypeStats, TypeQuota: TypeQuota, TypeQuotaAck: TypeQuotaAck}

// decodedType is messageType with a JSON decoder.
func decodedType(data []byte) (string, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	if tok, err := dec.Token(); err != nil {
		return "", err
	} else if tok != json.Delim('{') {
		return "", errors.New("a message must be a JSON object")
	}
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return "", err
		}
		if key != "type" {
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return "", err
			}
			continue
		}
		var typ string
		if err := dec.Decode(&typ); err != nil {
			return "", fmt.Errorf("type: %w", err)
		}
		return typ, nil
	}
	return "", nil
}

// abbrev shortens s, quoted in an error message, to its first n bytes and
// an ellipsis; a character cut in two is left to %q or CleanText to show.
func abbrev(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return Cut(s, n) + "…"
}

// Cut returns s cut to at most n bytes, on a character boundary, so that
// cut text (a close reason, a stored message) stays valid UTF-8.
func Cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n]
}
