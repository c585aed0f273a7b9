// Package consoletest starts real consoles (backend.Run on a free port) for
// the tests of other packages: one place for what every system test needs
// before it can talk to a console.
package consoletest

import (
	"cmp"
	"context"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"

	"github.com/sluicehq/sluice/backend"
)

// Start runs a console with cfg until ctx is done, counted in wg, and
// returns its base URL ("http://127.0.0.1:PORT") once it listens. Listen
// defaults to 127.0.0.1:0 and log, when nil, discards (as does the
// console's stdout: tests set AdminPassword). A console that fails
// to start, or stops with an error before ctx is done, fails t.
func Start(t testing.TB, ctx context.Context, wg *sync.WaitGroup, cfg backend.Config, log *slog.Logger) string {
	t.Helper()
	cfg.Listen = cmp.Or(cfg.Listen, "127.0.0.1:0")
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ready := make(chan net.Addr, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := backend.Run(ctx, cfg, log, io.Discard, func(a net.Addr) { ready <- a }); err != nil {
			t.Errorf("console: %v", err)
			ready <- nil
		}
	}()
	addr := <-ready
	if addr == nil {
		t.FailNow()
	}
	return "http://" + addr.String()
}
