package store

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// listenPoll is how long a LISTEN session waits for a notification before
// it pings its connection and reports a quiet channel.
const listenPoll = 30 * time.Second

// ListenVersions runs one LISTEN session on VersionsChannel, on a Postgres
// connection of its own (LISTEN needs a session, not a pooled connection).
// It calls fn with each version announced by any replica, and with 0 once
// LISTEN is in place and whenever the channel has been quiet for a while and
// the session still answers: a version may have been published while
// nobody listened, so fn(0) asks the caller to check for the latest. fn runs
// on the session's goroutine. ListenVersions returns nil when ctx ends, or
// the error that ended the session; reconnecting is the caller's choice.
func (s *Store) ListenVersions(ctx context.Context, fn func(version int64)) error {
	conn, err := pgx.Connect(ctx, s.url)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		conn.Close(cctx)
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{VersionsChannel}.Sanitize()); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("listen: %w", err)
	}
	fn(0)
	for {
		wctx, cancel := context.WithTimeout(ctx, listenPoll)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return nil
		case err == nil:
			v, _ := strconv.ParseInt(n.Payload, 10, 64) // not a number: 0, check the latest
			fn(max(v, 0))
		case wctx.Err() != nil && !conn.IsClosed():
			// Quiet for a while: make sure the session is still alive and
			// nothing was missed.
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := conn.Ping(pctx)
			cancel()
			if err != nil {
				return fmt.Errorf("ping: %w", err)
			}
			fn(0)
		default:
			return fmt.Errorf("wait for notification: %w", err)
		}
	}
}
