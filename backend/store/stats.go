package store

import (
	"context"
	"crypto/rand"
	"database/sql/driver"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/sluicehq/sluice/rules/wire"
)

// Counts are one rule's decisions over some time.
type Counts struct {
	Allowed       int64 `json:"allowed"`
	Limited       int64 `json:"limited"`
	ShadowLimited int64 `json:"shadow_limited"`
	StoreErrors   int64 `json:"store_errors"`
}

// Add adds o to c.
func (c *Counts) Add(o Counts) {
	c.Allowed += o.Allowed
	c.Limited += o.Limited
	c.ShadowLimited += o.ShadowLimited
	c.StoreErrors += o.StoreErrors
}

// Zero reports whether every count is zero.
func (c Counts) Zero() bool { return c == Counts{} }

// RuleKey names a rule in stats: its domain and its limit's name.
type RuleKey struct {
	Domain string `json:"domain"`
	Rule   string `json:"rule"`
}

// RuleCounts is one rule's counts.
type RuleCounts struct {
	RuleKey
	Counts
}

// FrameRule is one rule's counts in one second of a frame, with the values
// it limited most.
type FrameRule struct {
	Domain string            `json:"d"`
	Rule   string            `json:"r"`
	A      int64             `json:"a,omitempty"`
	L      int64             `json:"l,omitempty"`
	S      int64             `json:"s,omitempty"`
	E      int64             `json:"e,omitempty"`
	Top    []wire.ValueCount `json:"top,omitempty"`
	// CA and CL are the canary cohort's share of A and L: the nodes that
	// run a staged rollout's version.
	CA int64 `json:"ca,omitempty"`
	CL int64 `json:"cl,omitempty"`
}

// Frame is what one console replica's nodes decided in one second.
type Frame struct {
	ID      int64
	Replica string
	T       int64 // Unix second
	Rules   []FrameRule
}

type frameRow struct {
	ID      int64
	Replica string
	T       int64
	Payload []byte
}

func (r frameRow) frame() (Frame, error) {
	f := Frame{ID: r.ID, Replica: r.Replica, T: r.T}
	if err := json.Unmarshal(r.Payload, &f.Rules); err != nil {
		return Frame{}, fmt.Errorf("decode stats frame %d: %w", r.ID, err)
	}
	return f, nil
}

// WriteFrames stores frames of replica in one statement.
func (s *Store) WriteFrames(ctx context.Context, replica string, frames []Frame) error {
	if len(frames) == 0 {
		return nil
	}
	var q strings.Builder
	q.WriteString("INSERT INTO stats_frames (replica, t, payload) VALUES ")
	args := make([]any, 0, 3*len(frames))
	for i, f := range frames {
		payload, err := json.Marshal(f.Rules)
		if err != nil {
			return fmt.Errorf("encode stats frame: %w", err)
		}
		if i > 0 {
			q.WriteString(", ")
		}
		q.WriteString("(?, ?, ?)")
		args = append(args, replica, f.T, string(payload))
	}
	if err := s.db.WithContext(ctx).Exec(q.String(), args...).Error; err != nil {
		return fmt.Errorf("write stats frames: %w", err)
	}
	return nil
}

// RecentFrameIDs returns the ids of the frames other replicas than replica
// wrote within the last window, by Postgres' clock.
func (s *Store) RecentFrameIDs(ctx context.Context, replica string, window time.Duration) ([]int64, error) {
	var ids []int64
	err := s.db.WithContext(ctx).Raw(
		"SELECT id FROM stats_frames WHERE created_at > now() - make_interval(secs => ?) AND replica <> ? ORDER BY id",
		window.Seconds(), replica).Scan(&ids).Error
	if err != nil {
		return nil, fmt.Errorf("list stats frames: %w", err)
	}
	return ids, nil
}

// FindFrames returns the frames with the given ids (those that still exist).
func (s *Store) FindFrames(ctx context.Context, ids []int64) ([]Frame, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	var rows []frameRow
	if err := s.db.WithContext(ctx).Raw("SELECT id, replica, t, payload FROM stats_frames WHERE id IN ?", ids).Scan(&rows).Error; err != nil {
		return nil, fmt.Errorf("read stats frames: %w", err)
	}
	return decodeFrames(rows)
}

// FramesSince returns every frame counting second t or later, oldest
// first: what a starting replica loads.
func (s *Store) FramesSince(ctx context.Context, t int64) ([]Frame, error) {
	var rows []frameRow
	if err := s.db.WithContext(ctx).Raw("SELECT id, replica, t, payload FROM stats_frames WHERE t >= ? ORDER BY id", t).Scan(&rows).Error; err != nil {
		return nil, fmt.Errorf("read stats frames: %w", err)
	}
	return decodeFrames(rows)
}

func decodeFrames(rows []frameRow) ([]Frame, error) {
	out := make([]Frame, 0, len(rows))
	for _, r := range rows {
		f, err := r.frame()
		if err != nil {
			return nil, err
		}
		out = append(out, f)
	}
	return out, nil
}

// DeleteFramesBefore drops frames written before t.
func (s *Store) DeleteFramesBefore(ctx context.Context, t time.Time) (int64, error) {
	res := s.db.WithContext(ctx).Exec("DELETE FROM stats_frames WHERE created_at < ?", t)
	if res.Error != nil {
		return 0, fmt.Errorf("delete old stats frames: %w", res.Error)
	}
	return res.RowsAffected, nil
}

// MinuteCounts is one rule's counts in one minute.
type MinuteCounts struct {
	Minute time.Time
	RuleCounts
}

// AddMinutes adds counts to the per-minute rollups, in one statement. Each
// (minute, domain, rule) must appear once.
func (s *Store) AddMinutes(ctx context.Context, rows []MinuteCounts) error {
	if len(rows) == 0 {
		return nil
	}
	var q strings.Builder
	q.WriteString("INSERT INTO stats_minutes (minute, domain, rule, allowed, limited, shadow_limited, store_errors) VALUES ")
	args := make([]any, 0, 7*len(rows))
	for i, r := range rows {
		if i > 0 {
			q.WriteString(", ")
		}
		q.WriteString("(?, ?, ?, ?, ?, ?, ?)")
		args = append(args, r.Minute.UTC(), r.Domain, r.Rule, r.Allowed, r.Limited, r.ShadowLimited, r.StoreErrors)
	}
	q.WriteString(` ON CONFLICT (domain, rule, minute) DO UPDATE SET
		allowed = stats_minutes.allowed + EXCLUDED.allowed,
		limited = stats_minutes.limited + EXCLUDED.limited,
		shadow_limited = stats_minutes.shadow_limited + EXCLUDED.shadow_limited,
		store_errors = stats_minutes.store_errors + EXCLUDED.store_errors`)
	if err := s.db.WithContext(ctx).Exec(q.String(), args...).Error; err != nil {
		return fmt.Errorf("write stats rollups: %w", err)
	}
	return nil
}

// StatsQuery selects rollups: a domain ("" for all), a rule ("" for all of
// the domain's) and the minutes in [From, To).
type StatsQuery struct {
	Domain, Rule string
	From, To     time.Time
}

func (q StatsQuery) where(db *gorm.DB) *gorm.DB {
	db = db.Where("minute >= ? AND minute < ?", q.From.UTC(), q.To.UTC())
	if q.Domain != "" {
		db = db.Where("domain = ?", q.Domain)
	}
	if q.Rule != "" {
		db = db.Where("rule = ?", q.Rule)
	}
	return db
}

// SeriesPoint is one bucket of a rule's series.
type SeriesPoint struct {
	T int64 `json:"t"` // Unix second the bucket starts at
	Counts
}

// MinuteSeries returns each selected rule's rollups summed into buckets of
// step seconds (a multiple of 60) aligned to the Unix epoch, buckets with
// counts only, oldest first.
func (s *Store) MinuteSeries(ctx context.Context, q StatsQuery, step int64) (map[RuleKey][]SeriesPoint, error) {
	var rows []struct {
		Domain, Rule                                 string
		T                                            int64
		Allowed, Limited, ShadowLimited, StoreErrors int64
	}
	db := q.where(s.db.WithContext(ctx).Table("stats_minutes")).
		Select(`domain, rule, (floor(extract(epoch FROM minute) / ?) * ?)::bigint AS t,
			sum(allowed) AS allowed, sum(limited) AS limited, sum(shadow_limited) AS shadow_limited, sum(store_errors) AS store_errors`, step, step).
		Group("domain, rule, t").Order("domain, rule, t")
	if err := db.Scan(&rows).Error; err != nil {
		return nil, fmt.Errorf("read stats history: %w", err)
	}
	out := make(map[RuleKey][]SeriesPoint)
	for _, r := range rows {
		k := RuleKey{r.Domain, r.Rule}
		out[k] = append(out[k], SeriesPoint{T: r.T, Counts: Counts{r.Allowed, r.Limited, r.ShadowLimited, r.StoreErrors}})
	}
	return out, nil
}

// MinuteTotals returns each selected rule's rollups summed.
func (s *Store) MinuteTotals(ctx context.Context, q StatsQuery) ([]RuleCounts, error) {
	var rows []struct {
		Domain, Rule                                 string
		Allowed, Limited, ShadowLimited, StoreErrors int64
	}
	db := q.where(s.db.WithContext(ctx).Table("stats_minutes")).
		Select("domain, rule, sum(allowed) AS allowed, sum(limited) AS limited, sum(shadow_limited) AS shadow_limited, sum(store_errors) AS store_errors").
		Group("domain, rule").Order("domain, rule")
	if err := db.Scan(&rows).Error; err != nil {
		return nil, fmt.Errorf("read stats totals: %w", err)
	}
	out := make([]RuleCounts, len(rows))
	for i, r := range rows {
		out[i] = RuleCounts{RuleKey{r.Domain, r.Rule}, Counts{r.Allowed, r.Limited, r.ShadowLimited, r.StoreErrors}}
	}
	return out, nil
}

// DeleteMinutesBefore drops rollups of minutes before t (retention).
func (s *Store) DeleteMinutesBefore(ctx context.Context, t time.Time) (int64, error) {
	res := s.db.WithContext(ctx).Exec("DELETE FROM stats_minutes WHERE minute < ?", t.UTC())
	if res.Error != nil {
		return 0, fmt.Errorf("delete old stats rollups: %w", res.Error)
	}
	return res.RowsAffected, nil
}

// Spike is a period in which a rule's 429s rose far above their baseline.
type Spike struct {
	ID              int64      `json:"id"`
	Domain          string     `json:"domain"`
	Rule            string     `json:"rule"`
	Start           time.Time  `json:"-"`
	End             *time.Time `json:"-"`
	PeakLimitedPerS float64    `json:"peak_limited_per_s"`
	BaselinePerS    float64    `json:"baseline_per_s"`
	UpdatedAt       time.Time  `json:"-"`
}

type spikeRow struct {
	ID              int64
	Domain          string
	Rule            string
	StartedAt       time.Time
	EndedAt         *time.Time
	PeakLimitedPerS float64
	BaselinePerS    float64
	UpdatedAt       time.Time
}

func (spikeRow) TableName() string { return "stats_spikes" }

func (r spikeRow) spike() Spike {
	return Spike{ID: r.ID, Domain: r.Domain, Rule: r.Rule, Start: r.StartedAt, End: r.EndedAt,
		PeakLimitedPerS: r.PeakLimitedPerS, BaselinePerS: r.BaselinePerS, UpdatedAt: r.UpdatedAt}
}

// OpenSpike records a spike that started and queues its deliveries, in
// one transaction. A rule has at most one open spike: opening a second
// one is ErrConflict.
func (s *Store) OpenSpike(ctx context.Context, sp Spike, deliveries []Delivery) (Spike, error) {
	row := spikeRow{Domain: sp.Domain, Rule: sp.Rule, StartedAt: sp.Start.UTC(), PeakLimitedPerS: sp.PeakLimitedPerS,
		BaselinePerS: sp.BaselinePerS, UpdatedAt: time.Now().UTC()}
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Create(&row).Error; err != nil {
			return err
		}
		return queueDeliveries(tx, deliveries)
	})
	if err != nil {
		return Spike{}, fmt.Errorf("record spike: %w", err)
	}
	return row.spike(), nil
}

// CloseSpike ends spike id at end with its final peak and queues its
// deliveries, in one transaction.
func (s *Store) CloseSpike(ctx context.Context, id int64, end time.Time, peak float64, deliveries []Delivery) error {
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		res := tx.Model(&spikeRow{}).Where("id = ? AND ended_at IS NULL", id).
			Updates(map[string]any{"ended_at": end.UTC(), "peak_limited_per_s": peak, "updated_at": time.Now().UTC()})
		if res.Error != nil {
			return res.Error
		}
		if res.RowsAffected == 0 {
			return nil // closed already
		}
		return queueDeliveries(tx, deliveries)
	})
	if err != nil {
		return fmt.Errorf("close spike %d: %w", id, err)
	}
	return nil
}

// UpdateSpikePeak raises an open spike's peak.
func (s *Store) UpdateSpikePeak(ctx context.Context, id int64, peak float64) error {
	err := s.db.WithContext(ctx).Model(&spikeRow{}).Where("id = ? AND peak_limited_per_s < ?", id, peak).
		Updates(map[string]any{"peak_limited_per_s": peak, "updated_at": time.Now().UTC()}).Error
	if err != nil {
		return fmt.Errorf("update spike %d: %w", id, err)
	}
	return nil
}

// ListSpikes returns the spikes of domain ("" for all) that overlap
// [from, to), oldest first, at most 1000.
func (s *Store) ListSpikes(ctx context.Context, domain string, from, to time.Time) ([]Spike, error) {
	q := s.db.WithContext(ctx).Where("started_at < ? AND (ended_at IS NULL OR ended_at >= ?)", to.UTC(), from.UTC())
	if domain != "" {
		q = q.Where("domain = ?", domain)
	}
	var rows []spikeRow
	if err := q.Order("started_at").Limit(1000).Find(&rows).Error; err != nil {
		return nil, fmt.Errorf("list spikes: %w", err)
	}
	return spikes(rows), nil
}

// SpikesUpdatedSince returns the spikes opened, raised or closed after t,
// oldest change first.
func (s *Store) SpikesUpdatedSince(ctx context.Context, t time.Time) ([]Spike, error) {
	var rows []spikeRow
	if err := s.db.WithContext(ctx).Where("updated_at > ?", t.UTC()).Order("updated_at").Limit(1000).Find(&rows).Error; err != nil {
		return nil, fmt.Errorf("list changed spikes: %w", err)
	}
	return spikes(rows), nil
}

// OpenSpikes returns every spike that has not ended.
func (s *Store) OpenSpikes(ctx context.Context) ([]Spike, error) {
	var rows []spikeRow
	if err := s.db.WithContext(ctx).Where("ended_at IS NULL").Find(&rows).Error; err != nil {
		return nil, fmt.Errorf("list open spikes: %w", err)
	}
	return spikes(rows), nil
}

func spikes(rows []spikeRow) []Spike {
	out := make([]Spike, len(rows))
	for i, r := range rows {
		out[i] = r.spike()
	}
	return out
}

// Webhook is an alert target.
type Webhook struct {
	URL    string   `json:"url"`
	Events []string `json:"events"`
}

// SpikeSettings tune spike detection: a spike starts when a rule's 429/s
// stays above both FloorPerS and Factor times its baseline for ForS
// seconds, and ends when it stays below for ForS seconds.
type SpikeSettings struct {
	FloorPerS float64 `json:"floor_per_s"`
	Factor    float64 `json:"factor"`
	ForS      int     `json:"for_s"`
}

// DomainStatsSettings are one domain's overrides of the spike defaults
// (zero fields take the default) and its privacy setting.
type DomainStatsSettings struct {
	FloorPerS float64 `json:"floor_per_s,omitempty"`
	Factor    float64 `json:"factor,omitempty"`
	ForS      int     `json:"for_s,omitempty"`
	// MaskValues shows viewers a stable masked form of the domain's
	// descriptor values instead of the values.
	MaskValues bool `json:"mask_values"`
}

// AlertConfig is the console-wide stats and alert configuration.
type AlertConfig struct {
	Webhooks      []Webhook                      `json:"webhooks"`
	SpikeDefaults SpikeSettings                  `json:"spike_defaults"`
	Domains       map[string]DomainStatsSettings `json:"domains"`
	UpdatedAt     time.Time                      `json:"updated_at"`
	UpdatedBy     string                         `json:"updated_by"`
}

type statsSettingsRow struct {
	ID        bool `gorm:"primaryKey"`
	Config    []byte
	MaskKey   []byte
	UpdatedAt time.Time
	UpdatedBy string
}

func (statsSettingsRow) TableName() string { return "stats_settings" }

func (r statsSettingsRow) config() (AlertConfig, error) {
	var c AlertConfig
	if err := json.Unmarshal(r.Config, &c); err != nil {
		return AlertConfig{}, fmt.Errorf("decode alert settings: %w", err)
	}
	c.UpdatedAt, c.UpdatedBy = r.UpdatedAt, r.UpdatedBy
	return c, nil
}

// FindAlertConfig returns the stats and alert configuration as stored
// (defaults are the caller's business).
func (s *Store) FindAlertConfig(ctx context.Context) (AlertConfig, error) {
	var row statsSettingsRow
	if err := s.db.WithContext(ctx).Take(&row).Error; err != nil {
		return AlertConfig{}, fmt.Errorf("read alert settings: %w", err)
	}
	return row.config()
}

// UpdateAlertConfig replaces the configuration and audits the change
// (before and after) in one transaction.
func (s *Store) UpdateAlertConfig(ctx context.Context, c AlertConfig, actor Actor) (AlertConfig, error) {
	c.UpdatedAt, c.UpdatedBy = time.Now().UTC().Truncate(time.Microsecond), actor.Name
	var out AlertConfig
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var row statsSettingsRow
		if err := tx.Clauses(clause.Locking{Strength: "UPDATE"}).Take(&row).Error; err != nil {
			return fmt.Errorf("read alert settings: %w", err)
		}
		before, err := row.config()
		if err != nil {
			return err
		}
		stored := c
		stored.UpdatedAt, stored.UpdatedBy = time.Time{}, ""
		data, err := json.Marshal(stored)
		if err != nil {
			return fmt.Errorf("encode alert settings: %w", err)
		}
		if err := tx.Model(&statsSettingsRow{}).Where("id").Updates(map[string]any{
			"config": string(data), "updated_at": c.UpdatedAt, "updated_by": c.UpdatedBy,
		}).Error; err != nil {
			return fmt.Errorf("write alert settings: %w", err)
		}
		before.UpdatedAt, before.UpdatedBy = time.Time{}, ""
		out = c
		return appendAudit(tx, actor, "alerts.update", "alerts", "", before, stored)
	})
	if err != nil {
		return AlertConfig{}, fmt.Errorf("update alert settings: %w", err)
	}
	return out, nil
}

// MaskKey returns the secret that masks descriptor values for viewers,
// creating it on first use. Every replica reads the same key, so a masked
// value looks the same whichever replica shows it.
func (s *Store) MaskKey(ctx context.Context) ([]byte, error) {
	key := make([]byte, 32)
	rand.Read(key)
	if err := s.db.WithContext(ctx).Exec("UPDATE stats_settings SET mask_key = ? WHERE mask_key IS NULL", key).Error; err != nil {
		return nil, fmt.Errorf("create mask key: %w", err)
	}
	var row statsSettingsRow
	if err := s.db.WithContext(ctx).Take(&row).Error; err != nil {
		return nil, fmt.Errorf("read mask key: %w", err)
	}
	return row.MaskKey, nil
}

// Delivery statuses.
const (
	DeliveryPending   = "pending"
	DeliveryDelivered = "delivered"
	DeliveryFailed    = "failed"
)

// Delivery is one webhook POST of one alert event.
type Delivery struct {
	ID          int64           `json:"id"`
	Event       string          `json:"event"`
	URL         string          `json:"url"`
	Domain      string          `json:"domain"`
	Rule        string          `json:"rule"`
	Payload     json.RawMessage `json:"-"`
	Status      string          `json:"status"`
	Attempts    int             `json:"attempts"`
	LastError   string          `json:"last_error"`
	CreatedAt   time.Time       `json:"created_at"`
	DeliveredAt *time.Time      `json:"delivered_at"`
}

type deliveryRow struct {
	ID            int64
	Event         string
	URL           string
	Domain        string
	Rule          string
	Payload       []byte
	Status        string
	Attempts      int
	LastError     string
	NextAttemptAt time.Time
	CreatedAt     time.Time
	DeliveredAt   *time.Time
}

func (deliveryRow) TableName() string { return "alert_deliveries" }

func (r deliveryRow) delivery() Delivery {
	return Delivery{ID: r.ID, Event: r.Event, URL: r.URL, Domain: r.Domain, Rule: r.Rule, Payload: r.Payload,
		Status: r.Status, Attempts: r.Attempts, LastError: r.LastError, CreatedAt: r.CreatedAt, DeliveredAt: r.DeliveredAt}
}

func queueDeliveries(tx *gorm.DB, ds []Delivery) error {
	if len(ds) == 0 {
		return nil
	}
	rows := make([]deliveryRow, len(ds))
	now := time.Now().UTC()
	for i, d := range ds {
		rows[i] = deliveryRow{Event: d.Event, URL: d.URL, Domain: d.Domain, Rule: d.Rule, Payload: d.Payload,
			Status: DeliveryPending, NextAttemptAt: now, CreatedAt: now}
	}
	return tx.Create(&rows).Error
}

// QueueDeliveries queues webhook deliveries.
func (s *Store) QueueDeliveries(ctx context.Context, ds []Delivery) error {
	if err := queueDeliveries(s.db.WithContext(ctx), ds); err != nil {
		return fmt.Errorf("queue alert deliveries: %w", err)
	}
	return nil
}

// DueDeliveries returns up to limit pending deliveries whose next attempt
// is due, oldest first.
func (s *Store) DueDeliveries(ctx context.Context, limit int) ([]Delivery, error) {
	var rows []deliveryRow
	if err := s.db.WithContext(ctx).Where("status = ? AND next_attempt_at <= now()", DeliveryPending).
		Order("next_attempt_at").Limit(limit).Find(&rows).Error; err != nil {
		return nil, fmt.Errorf("list due deliveries: %w", err)
	}
	out := make([]Delivery, len(rows))
	for i, r := range rows {
		out[i] = r.delivery()
	}
	return out, nil
}

// RecordAttempt records one delivery attempt: delivered when errText is
// empty, otherwise pending again at next, or failed when next is zero.
func (s *Store) RecordAttempt(ctx context.Context, id int64, errText string, next time.Time) error {
	now := time.Now().UTC()
	u := map[string]any{"attempts": gorm.Expr("attempts + 1"), "last_error": errText}
	switch {
	case errText == "":
		u["status"], u["delivered_at"] = DeliveryDelivered, now
	case next.IsZero():
		u["status"] = DeliveryFailed
	default:
		u["next_attempt_at"] = next.UTC()
	}
	if err := s.db.WithContext(ctx).Model(&deliveryRow{}).Where("id = ?", id).Updates(u).Error; err != nil {
		return fmt.Errorf("record delivery %d: %w", id, err)
	}
	return nil
}

// ListDeliveries returns the latest limit deliveries, newest first.
func (s *Store) ListDeliveries(ctx context.Context, limit int) ([]Delivery, error) {
	var rows []deliveryRow
	if err := s.db.WithContext(ctx).Order("id DESC").Limit(limit).Find(&rows).Error; err != nil {
		return nil, fmt.Errorf("list deliveries: %w", err)
	}
	out := make([]Delivery, len(rows))
	for i, r := range rows {
		out[i] = r.delivery()
	}
	return out, nil
}

// DeleteDeliveriesBefore drops deliveries created before t (retention).
func (s *Store) DeleteDeliveriesBefore(ctx context.Context, t time.Time) error {
	if err := s.db.WithContext(ctx).Exec("DELETE FROM alert_deliveries WHERE created_at < ? AND status <> ?", t.UTC(), DeliveryPending).Error; err != nil {
		return fmt.Errorf("delete old deliveries: %w", err)
	}
	return nil
}

// DeleteSpikesBefore drops spikes that ended before t (retention).
func (s *Store) DeleteSpikesBefore(ctx context.Context, t time.Time) error {
	if err := s.db.WithContext(ctx).Exec("DELETE FROM stats_spikes WHERE ended_at < ?", t.UTC()).Error; err != nil {
		return fmt.Errorf("delete old spikes: %w", err)
	}
	return nil
}

// Lead runs fn while this process holds the Postgres advisory lock key
// (one holder among all replicas), on a connection of its own; fn's
// context ends when that connection fails or ctx ends. While another
// replica holds the lock (or the database is unreachable), Lead tries
// again every retry. It returns when ctx ends.
func (s *Store) Lead(ctx context.Context, key int64, retry time.Duration, fn func(ctx context.Context)) {
	for ctx.Err() == nil {
		s.leadOnce(ctx, key, retry, fn)
		select {
		case <-ctx.Done():
		case <-time.After(retry):
		}
	}
}

func (s *Store) leadOnce(ctx context.Context, key int64, ping time.Duration, fn func(ctx context.Context)) {
	conn, err := s.sql.Conn(ctx)
	if err != nil {
		return
	}
	// The lock lives as long as the session: the connection is never
	// returned to the pool, so closing it releases the lock for sure.
	defer func() {
		_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		conn.Close()
	}()
	var got bool
	if err := conn.QueryRowContext(ctx, "SELECT pg_try_advisory_lock($1)", key).Scan(&got); err != nil || !got {
		return
	}
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(lctx)
	}()
	tick := time.NewTicker(ping)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return
		case <-tick.C:
			pctx, pcancel := context.WithTimeout(ctx, ping)
			err := conn.PingContext(pctx)
			pcancel()
			if err != nil {
				cancel()
				<-done
				return
			}
		}
	}
}
