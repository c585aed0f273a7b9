package hub_test

// Faults on the console side: the console SIGKILLed during a
// burst of publishes, and Postgres restarted under a running console. The
// figures these tests log are in RELIABILITY.md.

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules/wire"
)

// faultClient gives up quickly: a dead console must not hold a publisher.
var faultClient = &http.Client{Timeout: 5 * time.Second}

// faultPut sends a JSON PUT with the admin token and returns the status and the
// published version (0 unless 200). A transport error is status 0.
func (e *env) faultPut(baseURL, path string, body any) (int, int64, error) {
	data, err := json.Marshal(body)
	if err != nil {
		return 0, 0, err
	}
	req, err := http.NewRequest("PUT", baseURL+path, bytes.NewReader(data))
	if err != nil {
		return 0, 0, err
	}
	req.Header.Set("Authorization", "Bearer "+e.adminTok)
	req.Header.Set("Content-Type", "application/json")
	resp, err := faultClient.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, 0, fmt.Errorf("PUT %s: %d %s", path, resp.StatusCode, raw)
	}
	var out struct {
		Version int64 `json:"version"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return resp.StatusCode, 0, err
	}
	return resp.StatusCode, out.Version, nil
}

// published is what a publisher got a 200 for: the version and the domains
// it set in it, with their YAML.
type published struct {
	version int64
	domains map[string]string
}

// publisher publishes to domains it alone writes, one request at a time,
// through PUT /api/v1/domains/{d} (one domain) or PUT /api/v1/ruleset (two
// domains in one version). base is the version its domains last changed.
type publisher struct {
	e       *env
	name    string
	ruleset bool
	base    int64
	n       int
}

// next sends the publisher's next change to baseURL.
func (p *publisher) next(baseURL string) (published, int, error) {
	p.n++
	limit := 1 + p.n%1000
	var (
		doms = map[string]string{}
		code int
		v    int64
		err  error
	)
	if p.ruleset {
		for _, s := range []string{"a", "b"} {
			d := p.name + "-" + s
			doms[d] = domainYAML(d, limit)
		}
		code, v, err = p.e.faultPut(baseURL, "/api/v1/ruleset", map[string]any{"domains": doms, "message": "burst", "base_version": p.base})
	} else {
		doms[p.name] = domainYAML(p.name, limit)
		code, v, err = p.e.faultPut(baseURL, "/api/v1/domains/"+p.name, map[string]any{"yaml": doms[p.name], "message": "burst", "base_version": p.base})
	}
	if err == nil {
		p.base = v
	}
	return published{version: v, domains: doms}, code, err
}

// checkHistory asserts the database holds whole versions only: versions
// 1..N without a gap, the head at N, every version with its revisions and
// its audit events, every audited publish with its version, every acked
// publish present with the content sent, and the audit chain verifying
// through the API of the console at baseURL. It returns N.
func (e *env) checkHistory(baseURL string, acked []published) int64 {
	e.t.Helper()
	db, err := sql.Open("pgx", e.dbURL)
	if err != nil {
		e.t.Fatal(err)
	}
	defer db.Close()
	var versions []int64
	rows, err := db.Query("SELECT version FROM versions ORDER BY version")
	if err != nil {
		e.t.Fatal(err)
	}
	for rows.Next() {
		var v int64
		if err := rows.Scan(&v); err != nil {
			e.t.Fatal(err)
		}
		versions = append(versions, v)
	}
	rows.Close()
	for i, v := range versions {
		if v != int64(i+1) {
			e.t.Fatalf("versions are not contiguous: %v", versions)
		}
	}
	n := int64(len(versions))
	var head int64
	if err := db.QueryRow("SELECT version FROM ruleset_head").Scan(&head); err != nil {
		e.t.Fatal(err)
	}
	if head != n {
		e.t.Errorf("ruleset_head is %d, newest version %d", head, n)
	}
	var partial []int64
	rows, err = db.Query(`SELECT v.version FROM versions v
		WHERE NOT EXISTS (SELECT 1 FROM domain_revisions r WHERE r.version = v.version)
		   OR NOT EXISTS (SELECT 1 FROM audit_events a WHERE a.after->>'version' = v.version::text)
		ORDER BY 1`)
	if err != nil {
		e.t.Fatal(err)
	}
	for rows.Next() {
		var v int64
		rows.Scan(&v)
		partial = append(partial, v)
	}
	rows.Close()
	if len(partial) > 0 {
		e.t.Errorf("versions without revisions or audit events: %v", partial)
	}
	var orphans int
	if err := db.QueryRow(`SELECT count(*) FROM audit_events a WHERE a.action LIKE 'domain.%'
		AND NOT EXISTS (SELECT 1 FROM versions v WHERE v.version::text = a.after->>'version')`).Scan(&orphans); err != nil {
		e.t.Fatal(err)
	}
	var stray int
	if err := db.QueryRow(`SELECT count(*) FROM domain_revisions r
		WHERE NOT EXISTS (SELECT 1 FROM versions v WHERE v.version = r.version)`).Scan(&stray); err != nil {
		e.t.Fatal(err)
	}
	if orphans > 0 || stray > 0 {
		e.t.Errorf("%d audited publishes and %d revisions without their version", orphans, stray)
	}
	for _, a := range acked {
		for d, yaml := range a.domains {
			var got string
			err := db.QueryRow("SELECT yaml FROM domain_revisions WHERE version = $1 AND domain = $2", a.version, d).Scan(&got)
			if err != nil {
				e.t.Errorf("acked version %d, domain %s: %v", a.version, d, err)
			} else if got != yaml {
				e.t.Errorf("acked version %d, domain %s: stored %q, sent %q", a.version, d, got, yaml)
			}
		}
	}
	var verify struct {
		OK     bool  `json:"ok"`
		Events int64 `json:"events"`
	}
	e.getJSON(baseURL+"/api/v1/audit/verify", &verify)
	if !verify.OK {
		e.t.Errorf("audit chain does not verify (%d events)", verify.Events)
	}
	return n
}

// TestConsoleKilledDuringPublishes SIGKILLs a console process while eight
// publishers (single domains and two-domain rulesets) publish as fast as it
// answers, restarts it on the same database and port, and checks that no
// partial version exists, versions are contiguous, every publish that got a
// 200 is there, the audit chain verifies, and nodes converge on the newest
// version.
func TestConsoleKilledDuringPublishes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.publish("seed", domainYAML("seed", 1))
	p := e.startConsoleProcess("127.0.0.1:0")
	nodes := make([]*node, 3)
	for i := range nodes {
		nodes[i] = e.connect(p.url, wire.Hello{NodeID: fmt.Sprintf("kill-node-%d", i)})
		if s := nodes[i].snapshot(); s.Version != 1 {
			t.Fatalf("first snapshot %d, want 1", s.Version)
		}
		nodes[i].ack(1)
	}

	var (
		mu       sync.Mutex
		acked    []published
		killed   atomic.Bool
		lost     atomic.Int64 // requests cut by the kill: no answer
		wg       sync.WaitGroup
		pubs     []*publisher
		enough   = make(chan struct{})
		enoughMu sync.Once
	)
	for i := range 8 {
		pubs = append(pubs, &publisher{e: e, name: fmt.Sprintf("burst-%d", i), ruleset: i >= 6, base: 0})
	}
	for _, pb := range pubs {
		if pb.ruleset {
			pb.base = 1
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !killed.Load() {
				got, code, err := pb.next(p.url)
				switch {
				case err == nil:
					mu.Lock()
					acked = append(acked, got)
					if len(acked) >= 40 {
						enoughMu.Do(func() { close(enough) })
					}
					mu.Unlock()
				case code == 0:
					lost.Add(1)
					return
				default:
					t.Errorf("%s: %v", pb.name, err)
					return
				}
			}
		}()
	}
	select {
	case <-enough:
	case <-time.After(30 * time.Second):
		t.Fatal("fewer than 40 publishes in 30s")
	}
	p.kill()
	killed.Store(true)
	wg.Wait()
	mu.Lock()
	before := len(acked)
	mu.Unlock()
	for _, n := range nodes {
		n.closed()
	}

	p2 := e.startConsoleProcess(p.addr)
	n := e.checkHistory(p2.url, acked)
	t.Logf("%d publishes answered 200 before the kill, %d cut by it; %d versions after the restart", before, lost.Load(), n)
	if n < int64(before)+1 {
		t.Errorf("%d versions, but %d publishes were answered 200 (plus the seed)", n, before)
	}

	// Nodes converge: each comes back with the version it had.
	for i := range nodes {
		nd := e.connect(p2.url, wire.Hello{NodeID: fmt.Sprintf("kill-node-%d", i), AppliedVersion: 1})
		if s := nd.snapshot(); s.Version != n {
			t.Errorf("node %d got version %d after the restart, want %d", i, s.Version, n)
		}
	}
	// Publishing resumes where the history left off.
	for _, pb := range pubs {
		var d struct {
			Version int64 `json:"version"`
		}
		name := pb.name
		if pb.ruleset {
			var rs struct {
				Version int64 `json:"version"`
			}
			e.getJSON(p2.url+"/api/v1/ruleset", &rs)
			pb.base = rs.Version
			continue
		}
		e.getJSON(p2.url+"/api/v1/domains/"+name, &d)
		pb.base = d.Version
	}
	got, _, err := pubs[0].next(p2.url)
	if err != nil || got.version != n+1 {
		t.Errorf("publish after the restart: version %d, %v; want %d", got.version, err, n+1)
	}
}

// TestPostgresRestartUnderConsole restarts a private Postgres (fast
// shutdown, then start) under an in-process console while publishes and
// node stats flow, and checks that the console reconnects by itself:
// /readyz unready during the outage and ready after, publishes resume,
// LISTEN/NOTIFY push resumes (a node gets the next version), and the
// history has no gap and verifies.
func TestPostgresRestartUnderConsole(t *testing.T) {
	t.Parallel()
	pg := testenv.StartPostgres(t)
	e := newEnvAt(t, pg.CreateDatabase())
	e.publish("seed", domainYAML("seed", 1))
	c := e.startConsole()
	nd := e.connect(c.url, wire.Hello{NodeID: "pg-node"})
	if s := nd.snapshot(); s.Version != 1 {
		t.Fatalf("first snapshot %d, want 1", s.Version)
	}
	nd.ack(1)

	// Stats flow from the node every 50 ms; publishes from one publisher.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		for ctx.Err() == nil {
			nd.statsOnce()
			time.Sleep(50 * time.Millisecond)
		}
	}()
	type result struct {
		at  time.Time
		ok  bool
		got published
	}
	var (
		mu      sync.Mutex
		results []result
	)
	pb := &publisher{e: e, name: "pg-burst"}
	pubDone := make(chan struct{})
	go func() {
		defer close(pubDone)
		for ctx.Err() == nil {
			got, code, err := pb.next(c.url)
			if err != nil && code == http.StatusConflict {
				// The outage cut a publish whose commit we never heard of.
				var d struct {
					Version int64 `json:"version"`
				}
				e.getJSON(c.url+"/api/v1/domains/"+pb.name, &d)
				pb.base = d.Version
			}
			mu.Lock()
			results = append(results, result{at: time.Now(), ok: err == nil, got: got})
			mu.Unlock()
			time.Sleep(20 * time.Millisecond)
		}
	}()
	ready := func() int {
		resp, err := faultClient.Get(c.url + "/readyz")
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	waitFor(t, "publishes before the restart", func() bool { mu.Lock(); defer mu.Unlock(); return len(results) >= 5 })
	if got := ready(); got != http.StatusOK {
		t.Fatalf("/readyz %d before the restart", got)
	}

	stopAt := time.Now()
	pg.Stop()
	stoppedAt := time.Now()
	unready := ready()
	time.Sleep(500 * time.Millisecond) // an outage publishes run into
	pg.Start()
	upAt := time.Now()
	if unready == http.StatusOK {
		t.Errorf("/readyz 200 with Postgres stopped")
	}
	waitFor(t, "/readyz after the restart", func() bool { return ready() == http.StatusOK })
	readyAt := time.Now()
	waitFor(t, "a publish after the restart", func() bool {
		mu.Lock()
		defer mu.Unlock()
		r := results[len(results)-1]
		return r.ok && r.at.After(upAt)
	})
	resumedAt := time.Now()
	cancel()
	<-pubDone

	// Push resumed: a version published now reaches the node through
	// LISTEN/NOTIFY (the node, still connected, drains older snapshots).
	v := e.publish("after", domainYAML("after", 2))
	deadline := time.After(30 * time.Second)
	for got := int64(0); got < v; {
		select {
		case msg, ok := <-nd.in:
			if !ok {
				t.Fatalf("node connection closed: %v", nd.err)
			}
			if s, isSnap := msg.(*wire.Snapshot); isSnap {
				got = s.Version
				nd.ack(got)
			}
		case <-deadline:
			t.Fatalf("node did not get version %d within 30s of the restart", v)
		}
	}
	pushedAt := time.Now()

	mu.Lock()
	var acked []published
	var firstErr, lastErr time.Time
	errs := 0
	for _, r := range results {
		if r.ok {
			acked = append(acked, r.got)
			continue
		}
		errs++
		if firstErr.IsZero() {
			firstErr = r.at
		}
		lastErr = r.at
	}
	mu.Unlock()
	e.checkHistory(c.url, acked)
	window := time.Duration(0)
	if errs > 0 {
		window = lastErr.Sub(firstErr)
	}
	t.Logf("postgres stopped in %v, down %v until started; ready %v after start; publishes failed %d times over %v, ok again %v after start; node had the next version %v after start; %d publishes acked, none lost",
		stoppedAt.Sub(stopAt).Round(time.Millisecond), upAt.Sub(stopAt).Round(time.Millisecond), readyAt.Sub(upAt).Round(time.Millisecond),
		errs, window.Round(time.Millisecond), resumedAt.Sub(upAt).Round(time.Millisecond), pushedAt.Sub(upAt).Round(time.Millisecond), len(acked))
}

// statsOnce sends one stats report with decisions in it, ignoring a
// failed write (the test only needs stats to keep arriving).
func (n *node) statsOnce() {
	data, _ := json.Marshal(wire.Stats{Type: wire.TypeStats, IntervalMS: 50,
		Rules: []wire.RuleStats{{Domain: "seed", Rule: "k", Allowed: 5, Limited: 1}}})
	n.sendRawLenient(data)
}

// newEnvAt is newEnv on the database at dbURL.
func newEnvAt(t *testing.T, dbURL string) *env {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	e := &env{t: t, dbURL: dbURL, st: st, tokens: map[string]string{}}
	if _, e.adminTok, err = st.CreateToken(ctx, "admin", store.RoleAdmin, nil, store.Actor{Name: "test"}); err != nil {
		t.Fatal(err)
	}
	return e
}
