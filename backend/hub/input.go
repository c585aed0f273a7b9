package hub

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/rules/wire"
)

// What a node may make the console hold and write.
//
// Each stats report and quota batch is checked against the catalogs
// (wire.Catalog) of the versions the console sent that node: the version
// it said it runs at hello, the one it runs and the one it ran before, and
// the newest catalogsAhead versions offered to it since. A row naming a
// domain or rule none of them has, or that Postgres could not store, is
// dropped and counted (sluice_console_node_rows_dropped_total), and the
// rest of the message is taken: so the rules the live series track are the
// published rules (a node cannot make up more of them), and one bad row
// never costs the others. A catalog is built once per version and shared by
// every node that runs it; a node holds a few pointers to them.
//
// Log lines a node's messages cause are limited per node id (logBurst at
// once, then one every logEvery); the lines held back are counted in
// sluice_console_node_log_lines_suppressed_total, and the next line
// written for that node says how many.

const (
	// catalogsAhead is how many versions offered to a node beyond the one
	// it runs keep their catalogs on its connection.
	catalogsAhead = 4
	// keepCatalogs is how many versions' catalogs the hub caches.
	keepCatalogs = 8

	logBurst = 10
	logEvery = 6 * time.Second
)

// metrics are the hub's Prometheus metrics.
type metrics struct {
	dropped    *prometheus.CounterVec
	cleaned    *prometheus.CounterVec
	suppressed prometheus.Counter
}

func newMetrics() metrics {
	return metrics{
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_console_node_rows_dropped_total",
			Help: "Rows of node messages (stats rules and previews, quota usage) dropped by the console, by message and reason: invalid, unknown_rule, over_limit.",
		}, []string{"message", "reason"}),
		cleaned: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_console_node_values_cleaned_total",
			Help: "Descriptor values in node messages the console rewrote to store them (NUL, invalid UTF-8, too long), by message.",
		}, []string{"message"}),
		suppressed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_console_node_log_lines_suppressed_total",
			Help: "Log lines about nodes not written because the node's log budget was spent.",
		}),
	}
}

// Collectors returns the hub's metrics, for the console's /metrics.
func (h *Hub) Collectors() []prometheus.Collector {
	return []prometheus.Collector{h.metrics.dropped, h.metrics.cleaned, h.metrics.suppressed}
}

// catalogEntry is a cached catalog and when it was last used.
type catalogEntry struct {
	cat  *wire.Catalog
	used uint64
}

// emptyCatalog lets a node report nothing.
var emptyCatalog = wire.NewCatalog(nil)

// catalog returns version v's catalog, from the cache or built from
// Postgres; a version Postgres does not have gets an empty one.
func (h *Hub) catalog(ctx context.Context, v int64) (*wire.Catalog, error) {
	h.catMu.Lock()
	defer h.catMu.Unlock()
	if e := h.catalogs[v]; e != nil {
		h.catUse++
		e.used = h.catUse
		return e.cat, nil
	}
	// No version, or one Postgres does not have: nothing to report, and
	// nothing cached (made-up versions must not evict real catalogs).
	if v <= 0 {
		return emptyCatalog, nil
	}
	snap, err := h.store.FindSnapshot(ctx, v)
	if errors.Is(err, rules.ErrNotFound) {
		return emptyCatalog, nil
	}
	if err != nil {
		return nil, err
	}
	return h.cacheCatalogLocked(v, h.compileCatalog(&wire.Snapshot{Version: snap.Version, Checksum: snap.Checksum, Domains: snap.WireDomains()})), nil
}

// compileCatalog returns the catalog of snap (empty when it does not
// compile: nodes refuse it too, and run something else) and tells the
// stats sink its domains, before any node can report under it.
func (h *Hub) compileCatalog(snap *wire.Snapshot) *wire.Catalog {
	if h.stats != nil {
		names := make([]string, len(snap.Domains))
		for i, d := range snap.Domains {
			names[i] = d.Name
		}
		h.stats.AddDomains(names...)
	}
	set, err := wire.Compile(snap)
	if err != nil {
		return wire.NewCatalog(nil)
	}
	return wire.NewCatalog(set)
}

// cacheCatalogLocked caches cat as version v's, evicting the least
// recently used beyond keepCatalogs; caller holds catMu.
func (h *Hub) cacheCatalogLocked(v int64, cat *wire.Catalog) *wire.Catalog {
	h.catUse++
	h.catalogs[v] = &catalogEntry{cat: cat, used: h.catUse}
	for len(h.catalogs) > keepCatalogs {
		oldest := slices.MinFunc(slices.Collect(maps.Keys(h.catalogs)), func(a, b int64) int {
			return cmp.Compare(h.catalogs[a].used, h.catalogs[b].used)
		})
		delete(h.catalogs, oldest)
	}
	return cat
}

// versionCatalog is the catalog of one version sent to a node.
type versionCatalog struct {
	version int64
	cat     *wire.Catalog
}

// addCatalog records that version v (catalog cat) was sent to c, or that c
// runs it; caller holds c.mu.
func (c *conn) addCatalog(v int64, cat *wire.Catalog) {
	if cat == nil || slices.ContainsFunc(c.cats, func(vc versionCatalog) bool { return vc.version == v }) {
		return
	}
	c.cats = append(c.cats, versionCatalog{v, cat})
	c.pruneCatalogs()
}

// pruneCatalogs keeps the catalogs of the version c runs, the one it ran
// before and the newest catalogsAhead beyond it, and rebuilds c.catView;
// caller holds c.mu.
func (c *conn) pruneCatalogs() {
	applied := c.node.AppliedVersion
	slices.SortFunc(c.cats, func(a, b versionCatalog) int { return cmp.Compare(b.version, a.version) }) // newest first
	kept, ahead := c.cats[:0], 0
	for _, vc := range c.cats {
		switch {
		case vc.version > applied && ahead < catalogsAhead:
			ahead++
		case vc.version == applied, vc.version == c.ranBefore:
		default:
			continue
		}
		kept = append(kept, vc)
	}
	clear(c.cats[len(kept):])
	c.cats = kept
	view := make([]*wire.Catalog, len(kept))
	for i, vc := range kept {
		view[i] = vc.cat
	}
	c.catView = view // replaced, never modified: readers may keep it
}

// noteCleaning counts what Clean did to a message of c and says so in the
// log (within c's log budget).
func (h *Hub) noteCleaning(c *conn, message string, cl wire.Cleaning) {
	if cl.Cleaned > 0 {
		h.metrics.cleaned.WithLabelValues(message).Add(float64(cl.Cleaned))
	}
	if len(cl.Dropped) == 0 {
		return
	}
	for reason, n := range cl.Dropped {
		h.metrics.dropped.WithLabelValues(message, reason).Add(float64(n))
	}
	h.nodeLog(c.node.ID, slog.LevelWarn, "dropped rows of a node message", "node_id", c.node.ID, "message", message,
		"invalid", cl.Dropped[wire.DropInvalid], "unknown_rule", cl.Dropped[wire.DropUnknownRule],
		"over_limit", cl.Dropped[wire.DropOverLimit])
}

// logBudget is one node's token bucket of log lines.
type logBudget struct {
	tokens     float64
	at         time.Time // when tokens was computed
	suppressed int64     // lines held back since the last one written
}

// nodeLog writes a log line about node key (a node id, or a token for a
// node that said no valid hello) if key's budget allows, and counts it as
// suppressed otherwise.
func (h *Hub) nodeLog(key string, level slog.Level, msg string, args ...any) {
	ctx := context.Background()
	if !h.log.Enabled(ctx, level) {
		return
	}
	now := time.Now()
	h.logMu.Lock()
	b := h.logBudgets[key]
	if b == nil {
		if len(h.logBudgets) >= 10_000 && now.Sub(h.logPruned) >= time.Minute {
			h.pruneLogBudgetsLocked(now)
		}
		b = &logBudget{tokens: logBurst, at: now}
		h.logBudgets[key] = b
	}
	b.tokens = min(logBurst, b.tokens+now.Sub(b.at).Seconds()/logEvery.Seconds())
	b.at = now
	if b.tokens < 1 {
		b.suppressed++
		h.logMu.Unlock()
		h.metrics.suppressed.Inc()
		return
	}
	b.tokens--
	suppressed := b.suppressed
	b.suppressed = 0
	h.logMu.Unlock()
	if suppressed > 0 {
		args = append(args, "suppressed_lines", suppressed)
	}
	h.log.Log(ctx, level, msg, args...)
}

// pruneLogBudgetsLocked forgets the budgets that have refilled; caller
// holds logMu.
func (h *Hub) pruneLogBudgetsLocked(now time.Time) {
	h.logPruned = now
	maps.DeleteFunc(h.logBudgets, func(_ string, b *logBudget) bool {
		return b.suppressed == 0 && b.tokens+now.Sub(b.at).Seconds()/logEvery.Seconds() >= logBurst
	})
}

// tokenKey is the log budget key of a connection that has no node id yet.
func tokenKey(tokenID int64) string { return fmt.Sprintf("token %d", tokenID) }
