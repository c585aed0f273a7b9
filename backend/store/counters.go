package store

import (
	"context"

	"gorm.io/gorm"
)

// ResetCounters records that actor reset the counters of some limits of
// domain (audit event counter.reset, target "domain:NAME", with detail and
// message) and runs reset, which deletes them from the counter store, in
// one transaction: the event is appended first (so a failing audit trail
// deletes nothing), then reset runs, and the event commits only if reset
// succeeded. A reset that fails part way leaves what it deleted deleted and
// nothing audited; it only ever gives counters back and may be repeated.
func (s *Store) ResetCounters(ctx context.Context, actor Actor, domain, message string, detail any, reset func(context.Context) error) error {
	return s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := appendAudit(tx, actor, "counter.reset", "domain:"+domain, message, nil, detail); err != nil {
			return err
		}
		return reset(ctx)
	})
}
