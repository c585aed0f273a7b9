package store

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/sluicehq/sluice/rules/wire"
)

// WritePreviews stores the impact preview's spans (one replica's nodes'
// reports, merged) in one statement.
func (s *Store) WritePreviews(ctx context.Context, spans []wire.RulePreview) error {
	if len(spans) == 0 {
		return nil
	}
	var q strings.Builder
	q.WriteString("INSERT INTO preview_spans (domain, rule, t, span_s, payload) VALUES ")
	args := make([]any, 0, 5*len(spans))
	for i, p := range spans {
		payload, err := json.Marshal(wire.RulePreview{Requests: p.Requests, Limited: p.Limited, Untracked: p.Untracked,
			Second: p.Second, Peak: p.Peak, Span: p.Span})
		if err != nil {
			return fmt.Errorf("encode preview span: %w", err)
		}
		if i > 0 {
			q.WriteString(", ")
		}
		q.WriteString("(?, ?, ?, ?, ?)")
		args = append(args, p.Domain, p.Rule, p.T, p.SpanS, string(payload))
	}
	if err := s.db.WithContext(ctx).Exec(q.String(), args...).Error; err != nil {
		return fmt.Errorf("write preview spans: %w", err)
	}
	return nil
}

// FindPreviews returns the stored spans of domain's rules starting at
// second since or later, oldest first (several rows may hold one span: sum
// them).
func (s *Store) FindPreviews(ctx context.Context, domain string, rules []string, since int64) ([]wire.RulePreview, error) {
	if len(rules) == 0 {
		return nil, nil
	}
	var rows []struct {
		Domain, Rule string
		T            int64
		SpanS        int64
		Payload      []byte
	}
	if err := s.db.WithContext(ctx).Raw(
		"SELECT domain, rule, t, span_s, payload FROM preview_spans WHERE domain = ? AND rule IN ? AND t >= ? ORDER BY t, id",
		domain, rules, since).Scan(&rows).Error; err != nil {
		return nil, fmt.Errorf("read preview spans: %w", err)
	}
	out := make([]wire.RulePreview, 0, len(rows))
	for _, r := range rows {
		var p wire.RulePreview
		if err := json.Unmarshal(r.Payload, &p); err != nil {
			return nil, fmt.Errorf("decode preview span: %w", err)
		}
		p.Domain, p.Rule, p.T, p.SpanS = r.Domain, r.Rule, r.T, r.SpanS
		out = append(out, p)
	}
	return out, nil
}

// DeletePreviewsBefore drops spans that start before second t.
func (s *Store) DeletePreviewsBefore(ctx context.Context, t int64) error {
	if err := s.db.WithContext(ctx).Exec("DELETE FROM preview_spans WHERE t < ?", t).Error; err != nil {
		return fmt.Errorf("delete old preview spans: %w", err)
	}
	return nil
}
