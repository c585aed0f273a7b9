//lint:file-ignore SA1019 Sluice uses nhooyr.io/websocket, deprecated in favour of its maintained twin github.com/coder/websocket

package hub_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"nhooyr.io/websocket"

	"github.com/sluicehq/sluice/backend/hub"
	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/rules/wire"
)

// stored returns node id's row as Postgres holds it (not the hub's memory).
func (e *env) stored(id string) (nackError string, applied int64, ok bool) {
	e.t.Helper()
	nodes, err := e.st.ListNodes(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	for _, n := range nodes {
		if n.ID == id {
			return n.NackError, n.AppliedVersion, true
		}
	}
	return "", 0, false
}

// TestNULCannotPoisonTheRegistry: a hello with U+0000 in any
// stored field is refused with a policy-violation close and the reason; a
// nack whose error holds NUL or invalid UTF-8 is stored cleaned; and the
// other nodes' acks keep reaching Postgres.
func TestNULCannotPoisonTheRegistry(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.startConsole()
	v1 := e.publish("api", domainYAML("api", 10))

	for _, tt := range []struct {
		name   string
		hello  wire.Hello
		reason string
	}{
		{"node id", wire.Hello{NodeID: "evil\x00"}, "node_id must be valid UTF-8 without NUL"},
		{"label key", wire.Hello{NodeID: "evil", Labels: map[string]string{"zone\x00": "a"}}, "without NUL"},
		{"label value", wire.Hello{NodeID: "evil", Labels: map[string]string{"zone": "a\x00"}}, "without NUL"},
		{"build", wire.Hello{NodeID: "evil", Build: "b\x00"}, "build must be valid UTF-8 without NUL"},
	} {
		// No subtests: the node helpers fail the test they were made with.
		err := e.connect(c.url, tt.hello).closed()
		var ce websocket.CloseError
		if !errors.As(err, &ce) || ce.Code != websocket.StatusPolicyViolation || !strings.Contains(ce.Reason, tt.reason) {
			t.Errorf("NUL in the %s: closed with %v, want policy violation with reason containing %q", tt.name, err, tt.reason)
		}
	}

	bad := e.connect(c.url, wire.Hello{NodeID: "nacker"})
	if snap := bad.snapshot(); snap.Version != v1 {
		t.Fatalf("snapshot %d, want %d", snap.Version, v1)
	}
	bad.sendRaw([]byte(`{"type":"nack","version":1,"error":"bad\u0000yaml \ud800"}`))

	good := e.connect(c.url, wire.Hello{NodeID: "good", Labels: map[string]string{"zone": "a"}})
	if snap := good.snapshot(); snap.Version != v1 {
		t.Fatalf("snapshot %d, want %d", snap.Version, v1)
	}
	good.ack(v1)
	waitFor(t, "the good node's ack and the cleaned nack in Postgres", func() bool {
		_, applied, okGood := e.stored("good")
		nack, _, okBad := e.stored("nacker")
		return okGood && applied == v1 && okBad && nack == "bad\uFFFDyaml \uFFFD"
	})
	for id := range e.nodes(c.url) {
		if strings.HasPrefix(id, "evil") {
			t.Errorf("refused node %q is in the registry", id)
		}
	}
}

// TestNodeNacksOversizedSnapshot: a version whose snapshot is
// over what nodes read (written before the console refused such publishes)
// is nacked by a real node with the reason, which the registry shows; the
// node stays connected on its version and takes the next one that fits.
func TestNodeNacksOversizedSnapshot(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.startConsole()
	v1 := e.publish("api", domainYAML("api", 10))
	n := e.startNode(c.url, "n1", t.TempDir())
	waitFor(t, "n1 on v1", func() bool { return n.eng.Version() == v1 })

	// Version 2, as a console without the bound would have written it.
	db, err := sql.Open("pgx", e.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	domains := []wire.DomainConfig{{Name: "api", YAML: domainYAML("api", 10)}}
	for i := range 17 {
		d := wire.DomainConfig{Name: fmt.Sprintf("d%02d", i), YAML: domainYAML(fmt.Sprintf("d%02d", i), 1) + "# " + strings.Repeat("x", 1<<20)}
		domains = append(domains, d)
		if _, err := tx.Exec("INSERT INTO domain_revisions (version, domain, yaml) VALUES (2, $1, $2)", d.Name, d.YAML); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tx.Exec("INSERT INTO versions (version, author, message, checksum) VALUES (2, 'test', 'too big', $1)", wire.Checksum(domains)); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec("UPDATE ruleset_head SET version = 2"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}

	waitFor(t, "the nack of v2 in the registry", func() bool {
		got := e.nodes(c.url)["n1"]
		return got.NackVersion != nil && *got.NackVersion == 2 && strings.Contains(got.NackError, "this node accepts") &&
			got.Status == "connected" && got.AppliedVersion == v1
	})
	waitFor(t, "the nack's reason in Postgres", func() bool {
		nack, _, _ := e.stored("n1")
		return strings.Contains(nack, "snapshot of version 2 is")
	})
	if !n.sub.Connected() || n.eng.Version() != v1 {
		t.Errorf("node connected %v at version %d, want connected at %d", n.sub.Connected(), n.eng.Version(), v1)
	}

	v3, err := e.st.Publish(context.Background(), store.Change{Kind: store.KindRollback, RollbackTo: v1, Message: "back", Actor: store.Actor{Name: "test"}})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "n1 on v3", func() bool { return n.eng.Version() == v3 })
}

// TestNodeTokenBoundToOneNodeID: a node token is bound
// to the node id it first connects with. Its holder cannot connect as
// another node id, and a token bound elsewhere cannot take over a node id:
// both are closed with wire.CloseNodeBound and the reason, and the node that
// owns the id stays connected. Disabling the token frees the id for a new
// one, which is how an admin re-binds a node id.
func TestNodeTokenBoundToOneNodeID(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.startConsole()
	v1 := e.publish("api", domainYAML("api", 10))

	tok := e.nodeToken("edge-1")
	first := e.connect(c.url, wire.Hello{NodeID: "edge-1"})
	if snap := first.snapshot(); snap.Version != v1 {
		t.Fatalf("snapshot %d, want %d", snap.Version, v1)
	}
	refused := func(what string, n *node, reason string) {
		t.Helper()
		err := n.closed()
		var ce websocket.CloseError
		if !errors.As(err, &ce) || ce.Code != wire.CloseNodeBound || !strings.Contains(ce.Reason, reason) {
			t.Errorf("%s: closed with %v, want code %d with reason containing %q", what, err, wire.CloseNodeBound, reason)
		}
	}
	refused("edge-1's token as edge-2", e.connectWith(c.url, tok, wire.Hello{NodeID: "edge-2"}),
		`this node token is bound to node id "edge-1", not "edge-2"`)
	other := e.nodeToken("edge-2")
	refused("edge-2's fresh token as edge-1", e.connectWith(c.url, other, wire.Hello{NodeID: "edge-1"}),
		`node id "edge-1" is bound to another node token`)

	// edge-1 kept its connection: it gets the next version.
	v2 := e.publish("api", domainYAML("api", 20))
	if snap := first.snapshot(); snap.Version != v2 {
		t.Fatalf("edge-1 after the refused takeovers: snapshot %d, want %d", snap.Version, v2)
	}
	first.ack(v2)
	if n := e.nodes(c.url)["edge-1"]; n.Status != store.NodeConnected {
		t.Errorf("edge-1 is %q, want connected", n.Status)
	}
	// The refused fresh token was not bound by its failed claim.
	second := e.connectWith(c.url, other, wire.Hello{NodeID: "edge-2"})
	if snap := second.snapshot(); snap.Version != v2 {
		t.Fatalf("edge-2 with its own token: snapshot %d, want %d", snap.Version, v2)
	}

	// Re-binding: disable edge-1's token, and a new token may claim edge-1.
	ctx := context.Background()
	toks, err := e.st.ListTokens(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, tk := range toks {
		if tk.NodeID != nil && *tk.NodeID == "edge-1" {
			if _, err := e.st.DisableToken(ctx, tk.ID, store.Actor{Name: "test"}); err != nil {
				t.Fatal(err)
			}
		}
	}
	_, fresh, err := e.st.CreateToken(ctx, "edge-1 again", store.RoleNode, nil, store.Actor{Name: "test"})
	if err != nil {
		t.Fatal(err)
	}
	again := e.connectWith(c.url, fresh, wire.Hello{NodeID: "edge-1"})
	if snap := again.snapshot(); snap.Version != v2 {
		t.Fatalf("edge-1 with a new token after the old one was disabled: snapshot %d, want %d", snap.Version, v2)
	}
}

// metric returns the value of the sample of metric name whose labels
// include every labels pair ("k=v"), as console c serves /metrics; 0 when
// there is none.
func (e *env) metric(c *console, name string, labels ...string) float64 {
	e.t.Helper()
	resp, err := http.Get(c.url + "/metrics")
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	sum := 0.0
next:
	for _, line := range strings.Split(string(body), "\n") {
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (rest != "" && rest[0] != '{' && rest[0] != ' ') {
			continue
		}
		for _, l := range labels {
			k, v, _ := strings.Cut(l, "=")
			if !strings.Contains(rest, k+`="`+v+`"`) {
				continue next
			}
		}
		f, err := strconv.ParseFloat(rest[strings.LastIndexByte(rest, ' ')+1:], 64)
		if err != nil {
			e.t.Fatalf("metric line %q: %v", line, err)
		}
		sum += f
	}
	return sum
}

// quotaAck waits for the quota_ack of epoch/seq.
func (n *node) quotaAck(epoch string, seq int64) {
	n.t.Helper()
	msg := n.recv()
	if a, ok := msg.(*wire.QuotaAck); !ok || a.Epoch != epoch || a.Seq != seq {
		n.t.Fatalf("got %#v, want the quota ack of %s/%d", msg, epoch, seq)
	}
}

// TestQuotaRowsCannotStrandANode: a quota batch whose rows hold a NUL value
// (an anonymous client's api key), hits of 2^63-1, hits above the quota's
// limit or a higher limit than the quota's, or a rule or domain the node
// was never sent, is still stored and acknowledged: the good rows count
// (the NUL value cleaned by wire.Value), the others are dropped and counted
// in a metric, the node stays connected, and the next batch with the same
// values is taken too.
func TestQuotaRowsCannotStrandANode(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.startConsole()
	v := e.publish("bill", fmt.Sprintf(quotaDomainYAML, 100))
	n := e.connect(c.url, wire.Hello{NodeID: "raw"})
	if snap := n.snapshot(); snap.Version != v {
		t.Fatalf("snapshot %d, want %d", snap.Version, v)
	}
	n.ack(v)
	row := func(value string, hits, limit int64) wire.QuotaUsage {
		return wire.QuotaUsage{Domain: "bill", Rule: "monthly", Unit: "month", Value: value, Start: nov.Unix(), Hits: hits, Limit: limit}
	}
	madeUp, gone := row("x", 1, 100), row("x", 1, 100)
	madeUp.Rule, gone.Domain = "made-up", "gone"
	n.send(wire.Quota{Type: wire.TypeQuota, Epoch: "e1", Seq: 1, Usage: []wire.QuotaUsage{
		row("alice", 10, 100),
		row("\x00evil", 5, 100),
		row("bob", math.MaxInt64, 100),
		row("carol", 150, 100),
		row("dave", 500, 1000),
		madeUp, gone,
	}})
	n.quotaAck("e1", 1)
	n.send(wire.Quota{Type: wire.TypeQuota, Epoch: "e1", Seq: 2, Usage: []wire.QuotaUsage{
		row("alice", 1, 100), row("bob", math.MaxInt64, 100), row("\x00evil", 1, 100)}})
	n.quotaAck("e1", 2)

	want := map[string]int64{"alice@2026-11": 11, wire.Value("\x00evil") + "@2026-11": 6}
	if got := e.used(t); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("usage in Postgres %v, want %v", got, want)
	}
	for _, m := range []struct {
		labels []string
		want   float64
	}{
		{[]string{"message=quota", "reason=over_limit"}, 4},
		{[]string{"message=quota", "reason=unknown_rule"}, 2},
	} {
		if got := e.metric(c, "sluice_console_node_rows_dropped_total", m.labels...); got != m.want {
			t.Errorf("dropped rows %v: %v, want %v", m.labels, got, m.want)
		}
	}
	if got := e.metric(c, "sluice_console_node_values_cleaned_total", "message=quota"); got != 2 {
		t.Errorf("cleaned values: %v, want 2", got)
	}
	if got := e.nodes(c.url)["raw"]; got.Status != store.NodeConnected {
		t.Errorf("node is %q after the batches, want connected", got.Status)
	}
}

// liveRule is one rule of GET /api/v1/stats/live.
type liveRule struct {
	Rule   string `json:"rule"`
	Points []struct {
		Allowed int64 `json:"allowed"`
		Limited int64 `json:"limited"`
	} `json:"points"`
	TopLimited []wire.ValueCount `json:"top_limited"`
}

// live returns domain's live rules, by name, and their summed counts.
func (e *env) live(c *console, domain string) map[string]liveRule {
	e.t.Helper()
	var body struct {
		Rules []liveRule `json:"rules"`
	}
	e.getJSON(c.url+"/api/v1/stats/live?domain="+domain, &body)
	out := make(map[string]liveRule, len(body.Rules))
	for _, r := range body.Rules {
		out[r.Rule] = r
	}
	return out
}

func (r liveRule) sums() (allowed, limited int64) {
	for _, p := range r.Points {
		allowed += p.Allowed
		limited += p.Limited
	}
	return allowed, limited
}

// TestMadeUpRulesCannotBlindLiveStats: one node token reporting 30,000
// rules that no version has fills nothing: the rows are dropped and
// counted, and a rule published afterwards, reported by another node,
// reaches live traffic (the per-rule table did not fill up).
func TestMadeUpRulesCannotBlindLiveStats(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.startConsole()
	v1 := e.publish("api", domainYAML("api", 10))
	evil := e.connect(c.url, wire.Hello{NodeID: "evil"})
	if snap := evil.snapshot(); snap.Version != v1 {
		t.Fatalf("snapshot %d, want %d", snap.Version, v1)
	}
	evil.ack(v1)
	for r := range 3 {
		rs := make([]wire.RuleStats, wire.MaxStatsRules)
		for i := range rs {
			rs[i] = wire.RuleStats{Domain: "api", Rule: fmt.Sprintf("f%d-%05d", r, i), Limited: 1}
		}
		evil.send(wire.Stats{Type: wire.TypeStats, IntervalMS: 1000, Rules: rs})
	}
	// Its next report of a real rule is taken (after the three: one
	// connection's messages are handled in order).
	evil.send(wire.Stats{Type: wire.TypeStats, IntervalMS: 1000, Rules: []wire.RuleStats{{Domain: "api", Rule: "k", Allowed: 1}}})
	waitFor(t, "the real rule in live traffic", func() bool {
		a, _ := e.live(c, "api")["k"].sums()
		return a == 1
	})
	if got := e.metric(c, "sluice_console_node_rows_dropped_total", "message=stats", "reason=unknown_rule"); got != 3*wire.MaxStatsRules {
		t.Errorf("dropped made-up rules: %v, want %d", got, 3*wire.MaxStatsRules)
	}

	v2 := e.publish("api", domainYAML("api", 10)+"  - key: fresh\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	good := e.connect(c.url, wire.Hello{NodeID: "good", AppliedVersion: v1})
	if snap := good.snapshot(); snap.Version != v2 {
		t.Fatalf("snapshot %d, want %d", snap.Version, v2)
	}
	good.ack(v2)
	good.send(wire.Stats{Type: wire.TypeStats, IntervalMS: 1000, Rules: []wire.RuleStats{{Domain: "api", Rule: "fresh", Allowed: 3, Limited: 7}}})
	waitFor(t, "the new rule in live traffic", func() bool {
		a, l := e.live(c, "api")["fresh"].sums()
		return a == 3 && l == 7
	})
	for name := range e.live(c, "api") {
		if strings.HasPrefix(name, "f0-") || strings.HasPrefix(name, "f2-") {
			t.Fatalf("made-up rule %q in live traffic", name)
		}
	}
	if evil := e.nodes(c.url)["evil"]; evil.Status != store.NodeConnected {
		t.Errorf("the reporting node is %q, want connected (its snapshots keep coming)", evil.Status)
	}
}

// TestNULInALimitedValueKeepsTheReport: a stats report whose top limited
// value holds NUL (a client's descriptor value) is taken: its counts reach
// live traffic, the value cleaned by wire.Value.
func TestNULInALimitedValueKeepsTheReport(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.startConsole()
	v := e.publish("api", domainYAML("api", 10))
	n := e.connect(c.url, wire.Hello{NodeID: "n1"})
	if snap := n.snapshot(); snap.Version != v {
		t.Fatalf("snapshot %d, want %d", snap.Version, v)
	}
	n.ack(v)
	n.sendRaw([]byte(`{"type":"stats","interval_ms":1000,"rules":[{"domain":"api","rule":"k","allowed":200,"limited":13,` +
		`"top_limited":[{"value":"\u0000evil","count":12},{"value":"ok","count":1}]}]}`))
	waitFor(t, "the report in live traffic", func() bool {
		a, l := e.live(c, "api")["k"].sums()
		return a == 200 && l == 13
	})
	top := e.live(c, "api")["k"].TopLimited
	if len(top) != 2 || top[0] != (wire.ValueCount{Value: wire.Value("\x00evil"), Count: 12}) {
		t.Errorf("top limited %+v, want the NUL value cleaned first", top)
	}
}

// lockedBuffer is a log destination safe for concurrent writers.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.b.String(), s)
}

// TestNackFloodIsRateLimitedInTheLog: 2,000 nacks from one node write at
// most the node's log budget of lines; the rest are counted in a metric,
// and the node and its nack are still registered.
func TestNackFloodIsRateLimitedInTheLog(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var logs lockedBuffer
	c := e.startConsoleLog(slog.New(slog.NewTextHandler(&logs, nil)))
	v := e.publish("api", domainYAML("api", 10))
	n := e.connect(c.url, wire.Hello{NodeID: "flood"})
	if snap := n.snapshot(); snap.Version != v {
		t.Fatalf("snapshot %d, want %d", snap.Version, v)
	}
	const nacks = 2000
	began := time.Now()
	nack, _ := json.Marshal(wire.Nack{Type: wire.TypeNack, Version: v, Error: "refused"})
	for range nacks {
		n.sendRaw(nack)
	}
	const line = `msg="node rejected version"`
	waitFor(t, "every nack logged or counted", func() bool {
		return logs.count(line)+int(e.metric(c, "sluice_console_node_log_lines_suppressed_total")) == nacks
	})
	budget := hub.LogBurst + int(time.Since(began)/hub.LogEvery) + 1
	if got := logs.count(line); got > budget {
		t.Errorf("%d nack lines in the log, want at most %d", got, budget)
	}
	got := e.nodes(c.url)["flood"]
	if got.Status != store.NodeConnected || got.NackVersion == nil || *got.NackVersion != v {
		t.Errorf("node %+v, want connected with its nack of %d", got, v)
	}
}

// TestNULValueThroughARealNode: checks whose quota value holds NUL or
// invalid UTF-8 (what an anonymous /json, gRPC or gateway client may send)
// go through a real node's engine and subscription to the console: the
// usage is stored under the values' wire.Value form next to a plain value's,
// and the node stays connected, its batches acknowledged.
func TestNULValueThroughARealNode(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.startConsole()
	v := e.publish("bill", fmt.Sprintf(quotaDomainYAML, 100))
	eng, sub, closeRedis, err := quotaNode(c.url, e.nodeToken("q1"), "q1", testenv.RedisURL(t), testenv.KeyPrefix(t), 20*time.Millisecond, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer closeRedis()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx) }()
	defer func() { cancel(); <-done }()
	waitFor(t, "q1 on the quota version", func() bool { return eng.Version() == v })

	month, _ := rules.Month.Window(time.Now())
	want := map[string]int64{}
	for value, n := range map[string]int{"\x00evil": 3, "\xffevil": 2, "alice": 4} {
		for range n {
			res, err := eng.Check(context.Background(), engine.Request{Domain: "bill",
				Descriptors: []engine.Descriptor{{Entries: []rules.Entry{{Key: "key", Value: value}}}}})
			if err != nil || res.Code != engine.OK {
				t.Fatalf("check %q: %v %v", value, res.Code, err)
			}
		}
		want[wire.Value(value)+"@"+month.Format("2006-01")] = int64(n)
	}
	waitFor(t, "the usage in Postgres", func() bool { return fmt.Sprint(e.used(t)) == fmt.Sprint(want) })
	if !sub.Connected() {
		t.Error("the node is not connected")
	}
	if got := e.nodes(c.url)["q1"]; got.Status != store.NodeConnected {
		t.Errorf("q1 is %q, want connected", got.Status)
	}
}
