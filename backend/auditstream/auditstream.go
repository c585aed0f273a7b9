// Package auditstream delivers the audit trail to a SIEM webhook, so that
// auditors keep a copy the console's own database administrators cannot
// rewrite.
//
// Every audit event is POSTed, in id order, as one JSON line of a batch
// (Content-Type application/x-ndjson; the line is the event as GET
// /api/v1/audit shows it to admins, with its hashes, so the receiver can
// verify the chain itself). Each request carries
// X-Sluice-Signature: sha256=HEX, the HMAC-SHA-256 of the body under the
// stream's secret, and X-Sluice-First-ID / X-Sluice-Last-ID.
//
// Delivery is at least once and in order: one console replica, the holder
// of a Postgres advisory lock, delivers; a batch is sent until the
// receiver answers 2xx (retried with capped exponential backoff and
// jitter, the same batch each time, nothing after it meanwhile), and only
// then the cursor in Postgres moves past it. A restart or a new leader
// starts from that cursor: what was acknowledged is never sent again, and
// nothing is lost; a batch whose acknowledgement was not recorded is sent
// again (receivers drop ids they have).
package auditstream

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/backend/store"
)

// leaderLock is the advisory lock of the delivering replica ("sluice"
// and 2).
const leaderLock int64 = 0x736c756963650002

// SignatureHeader carries the HMAC of a delivery's body.
const SignatureHeader = "X-Sluice-Signature"

// Config tunes a Streamer; zero fields take the defaults.
type Config struct {
	Store *store.Store
	Log   *slog.Logger
	// Client sends the deliveries (default: 10 s timeout).
	Client *http.Client
	// Batch is the most events per request (default 100).
	Batch int
	// Poll is how often an idle or disabled stream looks for new events
	// (default 1 s).
	Poll time.Duration
	// MinBackoff and MaxBackoff bound the wait between retries of a failed
	// delivery (default 1 s and 1 min).
	MinBackoff, MaxBackoff time.Duration
}

// Streamer delivers the audit stream while its replica leads.
type Streamer struct {
	cfg Config
}

// New returns a streamer; Run starts it.
func New(cfg Config) *Streamer {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{Timeout: 10 * time.Second}
	}
	if cfg.Batch <= 0 {
		cfg.Batch = 100
	}
	if cfg.Poll <= 0 {
		cfg.Poll = time.Second
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = time.Second
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = time.Minute
	}
	return &Streamer{cfg: cfg}
}

// Run delivers while this replica holds the lead, until ctx ends.
func (s *Streamer) Run(ctx context.Context) {
	s.cfg.Store.Lead(ctx, leaderLock, 5*time.Second, s.lead)
}

// Sign returns the signature header value of body under secret.
func Sign(secret string, body []byte) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

func (s *Streamer) lead(ctx context.Context) {
	failures := 0
	for ctx.Err() == nil {
		wait, err := s.step(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			failures++
			wait = s.backoff(failures)
			s.cfg.Log.Warn("audit stream delivery failed; retrying", "retry_in", wait.Round(time.Millisecond).String(), "error", err)
			if rerr := s.cfg.Store.RecordAuditStreamError(context.WithoutCancel(ctx), err.Error()); rerr != nil {
				s.cfg.Log.Warn("record audit stream error", "error", rerr)
			}
		case err == nil:
			failures = 0
		}
		if wait > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(wait):
			}
		}
	}
}

// step delivers the next batch, if any; it returns how long to wait
// before the next step (0: go on at once).
func (s *Streamer) step(ctx context.Context) (time.Duration, error) {
	cfg, err := s.cfg.Store.FindAuditStream(ctx)
	if err != nil {
		return 0, err
	}
	if !cfg.Enabled || cfg.URL == "" || cfg.Secret == "" {
		return s.cfg.Poll, nil
	}
	events, err := s.cfg.Store.AuditAfter(ctx, cfg.DeliveredID, s.cfg.Batch)
	if err != nil {
		return 0, err
	}
	if len(events) == 0 {
		return s.cfg.Poll, nil
	}
	var body bytes.Buffer
	for _, ev := range events {
		line, err := json.Marshal(ev)
		if err != nil {
			return 0, fmt.Errorf("encode audit event %d: %w", ev.ID, err)
		}
		body.Write(line)
		body.WriteByte('\n')
	}
	first, last := events[0].ID, events[len(events)-1].ID
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, cfg.URL, bytes.NewReader(body.Bytes()))
	if err != nil {
		return 0, fmt.Errorf("audit stream request: %w", err)
	}
	req.Header.Set("Content-Type", "application/x-ndjson")
	req.Header.Set("User-Agent", "sluice-audit-stream")
	req.Header.Set(SignatureHeader, Sign(cfg.Secret, body.Bytes()))
	req.Header.Set("X-Sluice-First-ID", strconv.FormatInt(first, 10))
	req.Header.Set("X-Sluice-Last-ID", strconv.FormatInt(last, 10))
	resp, err := s.cfg.Client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("deliver events %d..%d: %w", first, last, err)
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return 0, fmt.Errorf("deliver events %d..%d: receiver answered %d", first, last, resp.StatusCode)
	}
	moved, err := s.cfg.Store.AdvanceAuditStream(ctx, cfg.DeliveredID, last)
	if err != nil {
		return 0, err
	}
	if !moved {
		s.cfg.Log.Warn("audit stream cursor moved meanwhile; reading it again", "from", cfg.DeliveredID)
	}
	return 0, nil
}

// backoff is the wait after the n-th failure in a row: capped exponential
// with full jitter, at least MinBackoff.
func (s *Streamer) backoff(n int) time.Duration {
	ceiling := s.cfg.MaxBackoff
	if d := s.cfg.MinBackoff << min(n-1, 20); d < ceiling {
		ceiling = d
	}
	return s.cfg.MinBackoff + rand.N(max(ceiling-s.cfg.MinBackoff, 0)+1)
}
