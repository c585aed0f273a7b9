package subscriber

import (
	"time"

	"github.com/sluicehq/sluice/rules/wire"
)

// Persist exposes persist to the crash test's helper process.
func (s *Subscriber) Persist(snap *wire.Snapshot) error { return s.persist(snap) }

// EncodeStats exposes encodeStats.
var EncodeStats = encodeStats

// Backoff exposes backoff.
func (s *Subscriber) Backoff(attempt int) time.Duration { return s.backoff(attempt) }

// Pings returns the keepalive pings the subscriber sent.
func (s *Subscriber) Pings() int64 { return s.pings.Load() }
