package store

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/rules/wire"
)

// Bounds of the quota tables.
const (
	// quotaRowsPerStatement bounds one INSERT of a batch (8 parameters a
	// row, far below Postgres' 65535).
	quotaRowsPerStatement = 500
	// quotaEpochsKept is how long the last seq of a node process is kept:
	// a node process that resends after that long has been gone for weeks.
	quotaEpochsKept = 30 * 24 * time.Hour
)

// QuotaUsage is one descriptor value's usage of one quota in one calendar
// period, summed over every node.
type QuotaUsage struct {
	Domain      string
	Rule        string
	Unit        rules.Unit
	Value       string
	PeriodStart time.Time
	PeriodEnd   time.Time
	Used        int64
	Limit       int64
}

// RecordQuota adds node nodeID's batch q (cleaned by the caller:
// wire.Quota.Clean) to the usage, each sum saturating at math.MaxInt64, in one transaction with q's seq, unless a batch of the same node
// epoch with this seq or a later one was applied already: then it is a
// resend and adds nothing (applied false). Rows are written in key order,
// at most quotaRowsPerStatement per statement, so two replicas writing at
// once never deadlock.
func (s *Store) RecordQuota(ctx context.Context, nodeID string, q *wire.Quota) (applied bool, err error) {
	type row struct {
		key   [4]string // domain, rule, unit, value
		start int64
		used  int64
		limit int64
	}
	merged := make(map[[4]string]map[int64]*row, len(q.Usage))
	var rows []*row
	for _, u := range q.Usage {
		k := [4]string{u.Domain, u.Rule, u.Unit, u.Value}
		byStart := merged[k]
		if byStart == nil {
			byStart = map[int64]*row{}
			merged[k] = byStart
		}
		if r := byStart[u.Start]; r != nil {
			r.used = addSaturating(r.used, u.Hits)
			r.limit = u.Limit
			continue
		}
		r := &row{key: k, start: u.Start, used: u.Hits, limit: u.Limit}
		byStart[u.Start] = r
		rows = append(rows, r)
	}
	slices.SortFunc(rows, func(a, b *row) int {
		return cmp.Or(strings.Compare(a.key[0], b.key[0]), strings.Compare(a.key[1], b.key[1]),
			strings.Compare(a.key[2], b.key[2]), cmp.Compare(a.start, b.start), strings.Compare(a.key[3], b.key[3]))
	})
	err = s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var seqs []int64
		if err := tx.Raw(`INSERT INTO quota_batches (node_id, epoch, last_seq, updated_at) VALUES (?, ?, ?, now())
			ON CONFLICT (node_id, epoch) DO UPDATE SET last_seq = EXCLUDED.last_seq, updated_at = now()
			WHERE quota_batches.last_seq < EXCLUDED.last_seq
			RETURNING last_seq`, nodeID, q.Epoch, q.Seq).Scan(&seqs).Error; err != nil {
			return err
		}
		if len(seqs) == 0 {
			return nil // a resend
		}
		applied = true
		if q.Seq == 1 {
			if err := tx.Exec("DELETE FROM quota_batches WHERE node_id = ? AND updated_at < ?",
				nodeID, time.Now().Add(-quotaEpochsKept)).Error; err != nil {
				return err
			}
		}
		for len(rows) > 0 {
			chunk := rows[:min(len(rows), quotaRowsPerStatement)]
			rows = rows[len(chunk):]
			var b strings.Builder
			b.WriteString("INSERT INTO quota_usage (domain, rule, unit, period_start, value, period_end, used, quota_limit) VALUES ")
			args := make([]any, 0, 8*len(chunk))
			for i, r := range chunk {
				if i > 0 {
					b.WriteString(", ")
				}
				b.WriteString("(?, ?, ?, ?, ?, ?, ?, ?)")
				start, end := rules.Unit(r.key[2]).Window(time.Unix(r.start, 0))
				args = append(args, r.key[0], r.key[1], r.key[2], start, r.key[3], end, r.used, r.limit)
			}
			// The sum saturates at bigint's largest value: no batch can
			// make the row unwritable for every later one.
			b.WriteString(` ON CONFLICT (domain, rule, unit, period_start, value) DO UPDATE SET
				used = LEAST(quota_usage.used::numeric + EXCLUDED.used, 9223372036854775807)::bigint,
				quota_limit = EXCLUDED.quota_limit, updated_at = now()`)
			if err := tx.Exec(b.String(), args...).Error; err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("record quota batch %d of node %q: %w", q.Seq, nodeID, err)
	}
	return applied, nil
}

// addSaturating returns a+b for non-negative a and b, or math.MaxInt64
// when that overflows.
func addSaturating(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// QuotaFilter selects quota usage. Empty fields match everything. With a
// zero Start, the periods that hold At (now when zero) match; otherwise the
// periods of Unit that start at Start.
type QuotaFilter struct {
	Domain, Rule, Value string
	Unit                rules.Unit
	Start               time.Time
	At                  time.Time
	// Limit and Offset page ListQuotaUsage; Limit must be positive.
	Limit, Offset int
}

func (f QuotaFilter) where(db *gorm.DB) *gorm.DB {
	if f.Domain != "" {
		db = db.Where("domain = ?", f.Domain)
	}
	if f.Rule != "" {
		db = db.Where("rule = ?", f.Rule)
	}
	if f.Value != "" {
		db = db.Where("value = ?", f.Value)
	}
	if f.Unit != "" {
		db = db.Where("unit = ?", string(f.Unit))
	}
	if !f.Start.IsZero() {
		return db.Where("period_start = ?", f.Start.UTC())
	}
	at := f.At
	if at.IsZero() {
		at = time.Now()
	}
	return db.Where("period_start <= ? AND period_end > ?", at.UTC(), at.UTC())
}

type quotaRow struct {
	Domain      string
	Rule        string
	Unit        string
	Value       string
	PeriodStart time.Time
	PeriodEnd   time.Time
	Used        int64
	QuotaLimit  int64
}

func (r quotaRow) usage() QuotaUsage {
	return QuotaUsage{Domain: r.Domain, Rule: r.Rule, Unit: rules.Unit(r.Unit), Value: r.Value,
		PeriodStart: r.PeriodStart.UTC(), PeriodEnd: r.PeriodEnd.UTC(), Used: r.Used, Limit: r.QuotaLimit}
}

// ListQuotaUsage returns the usage f selects, the most used first (then by
// domain, rule, period and value), f.Limit rows from f.Offset on.
func (s *Store) ListQuotaUsage(ctx context.Context, f QuotaFilter) ([]QuotaUsage, error) {
	var rows []quotaRow
	err := f.where(s.db.WithContext(ctx).Table("quota_usage")).
		Order("used DESC, domain, rule, unit, period_start, value").Limit(f.Limit).Offset(f.Offset).Find(&rows).Error
	if err != nil {
		return nil, fmt.Errorf("list quota usage: %w", err)
	}
	out := make([]QuotaUsage, len(rows))
	for i, r := range rows {
		out[i] = r.usage()
	}
	return out, nil
}

// QuotaCursor is the key of the last row of an export page.
type QuotaCursor struct {
	Domain, Rule, Unit, Value string
	Start                     time.Time
}

// ExportQuotaUsage returns up to n rows of the usage f selects in key order
// (domain, rule, unit, period, value), after cursor when it is not nil, and
// the cursor of the last row returned (nil after the last page). f's Limit
// and Offset are ignored.
func (s *Store) ExportQuotaUsage(ctx context.Context, f QuotaFilter, after *QuotaCursor, n int) ([]QuotaUsage, *QuotaCursor, error) {
	db := f.where(s.db.WithContext(ctx).Table("quota_usage"))
	if after != nil {
		db = db.Where("(domain, rule, unit, period_start, value) > (?, ?, ?, ?, ?)",
			after.Domain, after.Rule, after.Unit, after.Start.UTC(), after.Value)
	}
	var rows []quotaRow
	if err := db.Order("domain, rule, unit, period_start, value").Limit(n).Find(&rows).Error; err != nil {
		return nil, nil, fmt.Errorf("export quota usage: %w", err)
	}
	out := make([]QuotaUsage, len(rows))
	for i, r := range rows {
		out[i] = r.usage()
	}
	if len(rows) < n {
		return out, nil, nil
	}
	last := rows[len(rows)-1]
	return out, &QuotaCursor{Domain: last.Domain, Rule: last.Rule, Unit: last.Unit, Value: last.Value, Start: last.PeriodStart}, nil
}

// CountQuotaUsage counts the rows f selects, up to most.
func (s *Store) CountQuotaUsage(ctx context.Context, f QuotaFilter, most int) (int64, error) {
	var n int64
	sub := f.where(s.db.WithContext(ctx).Table("quota_usage")).Select("1").Limit(most)
	if err := s.db.WithContext(ctx).Table("(?) AS q", sub).Count(&n).Error; err != nil {
		return 0, fmt.Errorf("count quota usage: %w", err)
	}
	return n, nil
}
