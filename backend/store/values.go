package store

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"gorm.io/gorm"
)

// ValueLimited is one descriptor value's limited requests under one rule in
// one minute, as one replica adds them.
type ValueLimited struct {
	Value   string
	Limited int64
	// Sure is set, in a lossy write, for a value the write counted
	// completely.
	Sure bool
}

// ValueWrite is what one replica adds for one rule-minute: the values its
// nodes named and, when Untracked is positive (a lossy write), how many
// limited requests it could not attribute to a value it writes.
type ValueWrite struct {
	Minute time.Time
	RuleKey
	Values    []ValueLimited
	Untracked int64
}

// valueRowsPerStatement keeps one INSERT of value rows under Postgres'
// 65,535 parameters.
const valueRowsPerStatement = 10000

// AddValueMinutes adds replica writes to the per-value rollups, in one
// transaction (ON CONFLICT adds). Each (minute, domain, rule) must appear
// once and each value once within it.
func (s *Store) AddValueMinutes(ctx context.Context, writes []ValueWrite) error {
	if len(writes) == 0 {
		return nil
	}
	type row struct {
		w *ValueWrite
		v ValueLimited
	}
	var rows []row
	var gaps []*ValueWrite
	for i := range writes {
		w := &writes[i]
		for _, v := range w.Values {
			rows = append(rows, row{w, v})
		}
		if w.Untracked > 0 {
			gaps = append(gaps, w)
		}
	}
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		for chunk := range slices.Chunk(rows, valueRowsPerStatement) {
			var q strings.Builder
			q.WriteString("INSERT INTO value_minutes (domain, value, minute, rule, limited, sure) VALUES ")
			args := make([]any, 0, 6*len(chunk))
			for i, r := range chunk {
				if i > 0 {
					q.WriteString(", ")
				}
				q.WriteString("(?, ?, ?, ?, ?, ?)")
				sure := 0
				if r.v.Sure {
					sure = 1
				}
				args = append(args, r.w.Domain, r.v.Value, r.w.Minute.UTC(), r.w.Rule, r.v.Limited, sure)
			}
			q.WriteString(` ON CONFLICT (domain, value, minute, rule) DO UPDATE SET
				limited = value_minutes.limited + EXCLUDED.limited, sure = value_minutes.sure + EXCLUDED.sure`)
			if err := tx.Exec(q.String(), args...).Error; err != nil {
				return err
			}
		}
		for chunk := range slices.Chunk(gaps, valueRowsPerStatement) {
			var q strings.Builder
			q.WriteString("INSERT INTO value_minute_gaps (domain, minute, rule, lossy, untracked) VALUES ")
			args := make([]any, 0, 4*len(chunk))
			for i, w := range chunk {
				if i > 0 {
					q.WriteString(", ")
				}
				q.WriteString("(?, ?, ?, 1, ?)")
				args = append(args, w.Domain, w.Minute.UTC(), w.Rule, w.Untracked)
			}
			q.WriteString(` ON CONFLICT (domain, minute, rule) DO UPDATE SET
				lossy = value_minute_gaps.lossy + 1, untracked = value_minute_gaps.untracked + EXCLUDED.untracked`)
			if err := tx.Exec(q.String(), args...).Error; err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("write value rollups: %w", err)
	}
	return nil
}

// ValueMinute is one value's figure under one rule in one minute.
type ValueMinute struct {
	Rule    string
	Minute  time.Time
	Limited int64
	// Complete is false when Limited is only a lower bound: some writes of
	// the rule-minute left limited requests without their value, and not
	// all of them counted this one completely.
	Complete bool
}

// ValueMinutes returns value's per-minute figures in domain for the
// minutes in [from, to), by rule then minute: the minutes its limited
// requests were recorded in, and (with Limited 0, not Complete) the
// lossy minutes of a rule in which it was not.
func (s *Store) ValueMinutes(ctx context.Context, domain, value string, from, to time.Time) ([]ValueMinute, error) {
	var rows []struct {
		Rule    string
		Minute  time.Time
		Limited int64
		Sure    int
		Lossy   *int
	}
	// Every lossy rule-minute of the range, joined to the value's rows,
	// and every row of the value.
	err := s.db.WithContext(ctx).Raw(`
		SELECT coalesce(v.rule, g.rule) AS rule, coalesce(v.minute, g.minute) AS minute,
			coalesce(v.limited, 0) AS limited, coalesce(v.sure, 0) AS sure, g.lossy
		FROM (SELECT rule, minute, limited, sure FROM value_minutes
			WHERE domain = ? AND value = ? AND minute >= ? AND minute < ?) v
		FULL JOIN (SELECT rule, minute, lossy FROM value_minute_gaps
			WHERE domain = ? AND minute >= ? AND minute < ?) g
		ON v.rule = g.rule AND v.minute = g.minute
		ORDER BY 1, 2`, domain, value, from.UTC(), to.UTC(), domain, from.UTC(), to.UTC()).Scan(&rows).Error
	if err != nil {
		return nil, fmt.Errorf("read value history: %w", err)
	}
	out := make([]ValueMinute, len(rows))
	for i, r := range rows {
		out[i] = ValueMinute{Rule: r.Rule, Minute: r.Minute.UTC(), Limited: r.Limited, Complete: r.Lossy == nil || r.Sure >= *r.Lossy}
	}
	return out, nil
}

// DeleteValueMinutesBefore drops per-value rollups of minutes before t
// (retention).
func (s *Store) DeleteValueMinutesBefore(ctx context.Context, t time.Time) (int64, error) {
	var n int64
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		res := tx.Exec("DELETE FROM value_minutes WHERE minute < ?", t.UTC())
		if res.Error != nil {
			return res.Error
		}
		n = res.RowsAffected
		return tx.Exec("DELETE FROM value_minute_gaps WHERE minute < ?", t.UTC()).Error
	})
	if err != nil {
		return 0, fmt.Errorf("delete old value rollups: %w", err)
	}
	return n, nil
}

// RecentValue is a value of a domain seen recently: limited (Limited and
// LastLimited, the start of its latest limited minute) or using a quota in
// a current period (QuotaUsed).
type RecentValue struct {
	Value       string
	Limited     int64
	LastLimited *time.Time
	QuotaUsed   int64
}

// recentScan bounds the rows each source of RecentValues reads.
const recentScan = 10000

// likePrefix is a LIKE pattern matching the strings that start with p.
func likePrefix(p string) string {
	return strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`).Replace(p) + "%"
}

// RecentValues returns up to limit values of domain starting with prefix
// that were limited since since or use a quota in a current period:
// limited ones first (latest first), then quota users (most used first).
// Each source reads at most recentScan rows, in value order.
func (s *Store) RecentValues(ctx context.Context, domain, prefix string, since time.Time, limit int) ([]RecentValue, error) {
	pattern := likePrefix(prefix)
	var limited []struct {
		Value   string
		Limited int64
		Last    time.Time
	}
	err := s.db.WithContext(ctx).Raw(`
		SELECT value, sum(limited) AS limited, max(minute) AS last FROM (
			SELECT value, limited, minute FROM value_minutes
			WHERE domain = ? AND value LIKE ? ESCAPE '\' AND minute >= ?
			ORDER BY value LIMIT ?) s
		GROUP BY value`, domain, pattern, since.UTC(), recentScan).Scan(&limited).Error
	if err != nil {
		return nil, fmt.Errorf("search limited values: %w", err)
	}
	var quota []struct {
		Value string
		Used  int64
	}
	err = s.db.WithContext(ctx).Raw(`
		SELECT value, sum(used) AS used FROM (
			SELECT value, used FROM quota_usage
			WHERE domain = ? AND value LIKE ? ESCAPE '\' AND period_end > now()
			ORDER BY value LIMIT ?) s
		GROUP BY value`, domain, pattern, recentScan).Scan(&quota).Error
	if err != nil {
		return nil, fmt.Errorf("search quota values: %w", err)
	}
	byValue := make(map[string]*RecentValue, len(limited)+len(quota))
	out := make([]*RecentValue, 0, len(limited)+len(quota))
	for _, r := range limited {
		last := r.Last.UTC()
		v := &RecentValue{Value: r.Value, Limited: r.Limited, LastLimited: &last}
		byValue[r.Value] = v
		out = append(out, v)
	}
	for _, q := range quota {
		if v := byValue[q.Value]; v != nil {
			v.QuotaUsed = q.Used
			continue
		}
		v := &RecentValue{Value: q.Value, QuotaUsed: q.Used}
		byValue[q.Value] = v
		out = append(out, v)
	}
	slices.SortFunc(out, func(a, b *RecentValue) int {
		switch {
		case a.LastLimited != nil && b.LastLimited != nil:
			return cmp.Or(b.LastLimited.Compare(*a.LastLimited), cmp.Compare(b.Limited, a.Limited), strings.Compare(a.Value, b.Value))
		case a.LastLimited != nil:
			return -1
		case b.LastLimited != nil:
			return 1
		}
		return cmp.Or(cmp.Compare(b.QuotaUsed, a.QuotaUsed), strings.Compare(a.Value, b.Value))
	})
	res := make([]RecentValue, 0, min(limit, len(out)))
	for _, v := range out[:min(limit, len(out))] {
		res = append(res, *v)
	}
	return res, nil
}
