package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/enforcer"
	"github.com/sluicehq/sluice/enforcer/node"
	"github.com/sluicehq/sluice/internal/consoletest"
	"github.com/sluicehq/sluice/internal/testenv"
)

// rollDomain admits every user at limit 1000000 and rejects every one at
// limit 0 (without asking Redis): a node's answer tells which version it
// enforces.
func rollDomain(limit int) string {
	return fmt.Sprintf("domain: roll\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: %d, name: per-user}\n", limit)
}

const (
	rollOpen   = 1000000
	rollClosed = 0
)

// rollFleet is two console replicas on one database and the enforcers
// started on them.
type rollFleet struct {
	t        *testing.T
	ctx      context.Context
	wg       *sync.WaitGroup
	consoles []string
	admin    *client // signed in to consoles[0]
	redis    string
	prefix   string
	nodes    map[string]string // node id → HTTP address
}

func startRollFleet(t *testing.T, ctx context.Context, wg *sync.WaitGroup) *rollFleet {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	dbURL := testenv.PostgresURL(t)
	f := &rollFleet{t: t, ctx: ctx, wg: wg, redis: testenv.RedisURL(t), prefix: testenv.KeyPrefix(t), nodes: map[string]string{}}
	for range 2 {
		f.consoles = append(f.consoles, consoletest.Start(t, ctx, wg, backend.Config{DatabaseURL: dbURL, AdminPassword: "roll-password"}, log))
	}
	f.admin = login(t, f.consoles[0], "admin", "roll-password")
	return f
}

// start runs enforcer id with labels on console i and waits until it answers.
func (f *rollFleet) start(id string, console int, labels map[string]string) string {
	t := f.t
	t.Helper()
	var tok struct {
		Token string `json:"token"`
	}
	f.admin.MustDo(t, "POST", "/api/v1/tokens", map[string]string{"name": "roll-" + id, "role": "node"}, 201, &tok)
	ready := make(chan string, 1)
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		cfg := enforcer.Config{Config: node.Config{ConsoleURL: f.consoles[console], NodeToken: tok.Token, NodeID: id, RedisURL: f.redis, Labels: labels, StateDir: t.TempDir(), KeyPrefix: f.prefix},
			HTTPAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0"}
		err := enforcer.Run(f.ctx, cfg, slog.New(slog.DiscardHandler), func(a enforcer.Addrs) { ready <- a.HTTP.String() })
		if err != nil && f.ctx.Err() == nil {
			t.Errorf("enforcer %s: %v", id, err)
		}
	}()
	select {
	case addr := <-ready:
		f.nodes[id] = addr
		waitUntil(t, 10*time.Second, id+" to load the rules", func() bool { return rollCheck(t, addr) != 0 })
		return addr
	case <-time.After(10 * time.Second):
		t.Fatalf("enforcer %s did not start", id)
	}
	return ""
}

// rollCheck sends one real check to an enforcer: 200, 429, or 0 while it
// has no rules for the domain yet.
func rollCheck(t *testing.T, node string) int {
	t.Helper()
	body := `{"domain":"roll","descriptors":[{"entries":[{"key":"user","value":"u1"}]}]}`
	resp, err := http.Post("http://"+node+"/json", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusTooManyRequests {
		return 0
	}
	return resp.StatusCode
}

// enforces waits until every named node answers want.
func (f *rollFleet) enforces(want int, ids ...string) {
	f.t.Helper()
	for _, id := range ids {
		waitUntil(f.t, 10*time.Second, fmt.Sprintf("%s to answer %d", id, want), func() bool { return rollCheck(f.t, f.nodes[id]) == want })
	}
}

type nodeView struct {
	ID             string            `json:"id"`
	AppliedVersion int64             `json:"applied_version"`
	Labels         map[string]string `json:"labels"`
}

func (f *rollFleet) applied(c *client) map[string]nodeView {
	f.t.Helper()
	var out struct {
		Nodes []nodeView `json:"nodes"`
	}
	c.MustDo(f.t, "GET", "/api/v1/nodes", nil, 200, &out)
	m := map[string]nodeView{}
	for _, n := range out.Nodes {
		m[n.ID] = n
	}
	return m
}

type rolloutView struct {
	State       string            `json:"state"`
	Labels      map[string]string `json:"labels"`
	BaseVersion int64             `json:"base_version"`
	EndedIn     *int64            `json:"ended_in"`
	EndedBy     string            `json:"ended_by"`
	Reason      string            `json:"reason"`
}

type versionOut struct {
	Version    int64        `json:"version"`
	Author     string       `json:"author"`
	Message    string       `json:"message"`
	RollbackOf *int64       `json:"rollback_of"`
	Rollout    *rolloutView `json:"rollout"`
}

func (f *rollFleet) version(c *client, n int64) versionOut {
	f.t.Helper()
	var out struct {
		Version versionOut `json:"version"`
	}
	c.MustDo(f.t, "GET", fmt.Sprintf("/api/v1/versions/%d", n), nil, 200, &out)
	return out.Version
}

// TestStagedRollout runs five real enforcers on two console replicas, two of
// them labelled canary: a staged version is enforced by the canaries only
// (also by one that connects later), the others keep the version they run;
// promote sends it to all; then a staged version whose canaries limit far
// more than the others is halted and rolled back by the console itself.
func TestStagedRollout(t *testing.T) {
	// Not parallel: the halt is judged on paced traffic; other tests' load skews the rates.
	if testing.Short() {
		t.Skip("five enforcers and about 15 s of traffic")
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	f := startRollFleet(t, ctx, &wg)
	other := login(t, f.consoles[1], "admin", "roll-password")

	var v struct {
		Version int64 `json:"version"`
	}
	f.admin.MustDo(t, "PUT", "/api/v1/domains/roll", map[string]any{"yaml": rollDomain(rollOpen), "message": "open", "base_version": 0}, 200, &v)
	v1 := v.Version
	// The canary is on the replica that does not take the publish: what it
	// gets comes through Postgres.
	f.start("canary-1", 1, map[string]string{"canary": "true", "zone": "a"})
	f.start("plain-1", 0, map[string]string{"zone": "a"})
	f.start("plain-2", 1, nil)
	f.enforces(200, "canary-1", "plain-1", "plain-2")

	// Stage v2 (every request limited) to canary=true.
	f.admin.MustDo(t, "PUT", "/api/v1/domains/roll", map[string]any{"yaml": rollDomain(rollClosed), "message": "close, canary first",
		"base_version": v1, "rollout": map[string]any{"labels": map[string]string{"canary": "true"}}}, 200, &v)
	v2 := v.Version
	f.enforces(429, "canary-1")
	// The registry is written in batches: wait until the other replica
	// shows every node (plain-1 is on the replica that took the publish).
	waitUntil(t, 10*time.Second, "the registry to show canary-1 on v2 and the plain nodes on v1", func() bool {
		n := f.applied(other)
		return n["canary-1"].AppliedVersion == v2 && n["plain-1"].AppliedVersion == v1 && n["plain-2"].AppliedVersion == v1
	})
	// The other nodes were offered nothing: they still enforce v1.
	f.enforces(200, "plain-1", "plain-2")
	nodes := f.applied(other)
	for id, want := range map[string]int64{"canary-1": v2, "plain-1": v1, "plain-2": v1} {
		if got := nodes[id].AppliedVersion; got != want {
			t.Errorf("%s applied_version = %d, want %d", id, got, want)
		}
	}
	if nodes["canary-1"].Labels["canary"] != "true" || nodes["plain-1"].Labels["zone"] != "a" {
		t.Errorf("labels not shown: %+v", nodes)
	}
	if r := f.version(other, v2).Rollout; r == nil || r.State != "staged" || r.Labels["canary"] != "true" || r.BaseVersion != v1 {
		t.Errorf("version %d rollout = %+v, want staged to canary=true from %d", v2, r, v1)
	}
	if r := f.version(other, v1).Rollout; r != nil {
		t.Errorf("version %d was never staged, rollout = %+v", v1, r)
	}

	// Nodes that connect later get what their labels say.
	f.start("canary-2", 0, map[string]string{"canary": "true"})
	f.start("plain-3", 0, map[string]string{"canary": "false"})
	f.enforces(429, "canary-2")
	f.enforces(200, "plain-3", "plain-1", "plain-2")

	// While v2 is staged, another publish is refused; promoting a version
	// that was not staged or does not exist fails.
	f.admin.MustDo(t, "PUT", "/api/v1/domains/roll", map[string]any{"yaml": rollDomain(5), "message": "more", "base_version": v2}, 409, nil)
	f.admin.MustDo(t, "POST", fmt.Sprintf("/api/v1/versions/%d/promote", v1), map[string]string{"message": "x"}, 409, nil)
	f.admin.MustDo(t, "POST", "/api/v1/versions/999/promote", map[string]string{"message": "x"}, 404, nil)

	// Promote (on the other replica) → every node on v2.
	other.MustDo(t, "POST", fmt.Sprintf("/api/v1/versions/%d/promote", v2), map[string]string{"message": "canary looks fine"}, 200, &v)
	if v.Version != v2 {
		t.Errorf("promote answered version %d, want %d", v.Version, v2)
	}
	f.enforces(429, "canary-1", "canary-2", "plain-1", "plain-2", "plain-3")
	if r := f.version(f.admin, v2).Rollout; r == nil || r.State != "promoted" || r.EndedBy != "user:admin" {
		t.Errorf("after promote, rollout = %+v", r)
	}
	other.MustDo(t, "POST", fmt.Sprintf("/api/v1/versions/%d/promote", v2), map[string]string{"message": "again"}, 409, nil)
	if !hasAudit(t, f.admin, "version.promote", "user:admin") {
		t.Error("no version.promote audit event")
	}
	var live struct {
		Markers []struct {
			Version int64  `json:"version"`
			Kind    string `json:"kind"`
		} `json:"markers"`
	}
	f.admin.MustDo(t, "GET", "/api/v1/stats/live?domain=roll", nil, 200, &live)
	if !slices.ContainsFunc(live.Markers, func(m struct {
		Version int64  `json:"version"`
		Kind    string `json:"kind"`
	}) bool {
		return m.Kind == "promote" && m.Version == v2
	}) {
		t.Errorf("no promote marker for %d in %+v", v2, live.Markers)
	}

	// Open again for everyone, then stage a closing version with an
	// automatic halt and send traffic everywhere.
	f.admin.MustDo(t, "PUT", "/api/v1/domains/roll", map[string]any{"yaml": rollDomain(rollOpen), "message": "open again", "base_version": v2}, 200, &v)
	v3 := v.Version
	f.enforces(200, "canary-1", "canary-2", "plain-1", "plain-2", "plain-3")
	// A node's next stats report still holds v2's 429s of the seconds
	// before it applied v3; let those arrive before v4's window opens.
	time.Sleep(1500 * time.Millisecond)
	f.admin.MustDo(t, "PUT", "/api/v1/domains/roll", map[string]any{"yaml": rollDomain(rollClosed), "message": "close again",
		"base_version": v3, "rollout": map[string]any{"labels": map[string]string{"canary": "true"},
			"auto_halt": map[string]any{"factor": 3, "min_limited_per_s": 5, "for_s": 2}}}, 200, &v)
	v4 := v.Version
	f.enforces(429, "canary-1", "canary-2")
	trafficStart := time.Now()
	tctx, stop := context.WithCancel(ctx)
	var traffic sync.WaitGroup
	for _, addr := range f.nodes {
		traffic.Go(func() {
			for tctx.Err() == nil {
				rollCheck(t, addr)
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
	var halted versionOut
	waitUntil(t, 30*time.Second, "the console to halt the rollout", func() bool {
		halted = f.version(f.admin, v4)
		return halted.Rollout != nil && halted.Rollout.State != "staged"
	})
	stop()
	traffic.Wait()
	t.Logf("halted %s after the canary's traffic started (for_s 2)", time.Since(trafficStart).Round(10*time.Millisecond))
	r := halted.Rollout
	if r.State != "halted" || r.EndedIn == nil || r.EndedBy != "system" || !strings.Contains(r.Reason, "automatic halt") {
		t.Fatalf("rollout of %d = %+v, want halted by system", v4, r)
	}
	back := f.version(f.admin, *r.EndedIn)
	if back.Author != "system" || back.RollbackOf == nil || *back.RollbackOf != v3 {
		t.Errorf("halt version = %+v, want a rollback to %d by system", back, v3)
	}
	if !hasAudit(t, f.admin, "version.halt", "system") {
		t.Error("no version.halt audit event by system")
	}
	f.enforces(200, "canary-1", "canary-2", "plain-1", "plain-2", "plain-3")

	// The version's cohorts show the canary limiting and the rest not.
	var coh struct {
		Points []struct {
			CanaryAllowed int64 `json:"canary_allowed"`
			CanaryLimited int64 `json:"canary_limited"`
			RestAllowed   int64 `json:"rest_allowed"`
			RestLimited   int64 `json:"rest_limited"`
		} `json:"points"`
	}
	other.MustDo(t, "GET", fmt.Sprintf("/api/v1/versions/%d/cohorts", v4), nil, 200, &coh)
	var cl, ra, rl int64
	for _, p := range coh.Points {
		cl, ra, rl = cl+p.CanaryLimited, ra+p.RestAllowed, rl+p.RestLimited
	}
	if cl == 0 || ra == 0 || rl != 0 {
		t.Logf("points %+v, rollout %+v", coh.Points, r)
		t.Errorf("cohorts: canary limited %d, rest allowed %d, rest limited %d; want >0, >0, 0", cl, ra, rl)
	}
	other.MustDo(t, "GET", fmt.Sprintf("/api/v1/versions/%d/cohorts", v3), nil, 404, nil)
}

// hasAudit reports whether the audit trail has an action by actor.
func hasAudit(t *testing.T, c *client, action, actor string) bool {
	t.Helper()
	var out struct {
		Events []struct {
			Actor  string `json:"actor"`
			Action string `json:"action"`
		} `json:"events"`
	}
	c.MustDo(t, "GET", "/api/v1/audit?action="+action, nil, 200, &out)
	for _, e := range out.Events {
		if e.Action == action && e.Actor == actor {
			return true
		}
	}
	return false
}

// TestEnforcerLabels: --labels and SLUICE_LABELS are checked when the
// enforcer starts, with the bad label named.
func TestEnforcerLabels(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, flag, env, want string
	}{
		{"flag", "canary=true,zone=eu-1", "", "labels=canary=true,zone=eu-1"},
		{"env", "", "canary=true", "labels=canary=true"},
		{"bad key", "bad key=1", "", `--labels (SLUICE_LABELS): label key "bad key"`},
		{"no value", "", "canary", `"canary" is not key=value`},
		{"twice", "a=1,a=2", "", `key "a" is given twice`},
		{"empty value", "canary=", "", "values are 1-63"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut strings.Builder
			args := []string{"enforcer", "--print-config"}
			if tc.flag != "" {
				args = append(args, "--labels", tc.flag)
			}
			env := map[string]string{"SLUICE_LABELS": tc.env}
			err := run(context.Background(), args, func(k string) string { return env[k] }, &out, &errOut)
			got := out.String()
			if err != nil {
				got = err.Error()
			}
			if !strings.Contains(got, tc.want) {
				t.Errorf("got %q (err %v), want it to contain %q", got, err, tc.want)
			}
		})
	}
}
