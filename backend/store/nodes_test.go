package store_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/crypto/bcrypt"

	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/internal/testenv"
)

const staleAfter = time.Minute

func openNodes(t *testing.T) *store.Store {
	t.Helper()
	st, err := store.Open(context.Background(), testenv.PostgresURL(t), store.PasswordCost(bcrypt.MinCost)) // fast hashing
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func findNode(t *testing.T, st *store.Store, id string) store.Node {
	t.Helper()
	nodes, err := st.ListNodes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if n.ID == id {
			return n
		}
	}
	t.Fatalf("node %q not in the registry", id)
	return store.Node{}
}

func TestSaveNodesRoundTrip(t *testing.T) {
	t.Parallel()
	st := openNodes(t)
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Microsecond)
	nack := int64(4)
	want := store.Node{ID: "n1", AppliedVersion: 3, Status: store.NodeConnected, Labels: map[string]string{"zone": "a"},
		Build: "v1", Address: "10.0.0.1:5000", Protocol: 1, ConnectedSince: &now, LastSeen: now,
		NackVersion: &nack, NackError: "bad yaml", NackedAt: &now, Console: "c1", Session: "s1",
		Rates: &store.NodeRates{At: now, Decisions: 12.5, Allowed: 10, Limited: 2.5}, Kind: store.NodeSluice}
	bare := store.Node{ID: "n2", Status: store.NodeDisconnected, LastSeen: now, Session: "s2"}
	lyft := store.Node{ID: "n3", Status: store.NodeConnected, LastSeen: now, Session: "s3", Kind: store.NodeXDS, Labels: map[string]string{"ring": "canary"},
		UnsupportedDomains: []store.UnsupportedDomain{{Domain: "api", Reasons: []string{"descriptors[0]: counts with token_bucket"}}}}
	if err := st.SaveNodes(ctx, []store.Node{want, bare, lyft}, staleAfter); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, findNode(t, st, "n1")); diff != "" {
		t.Errorf("n1 (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(lyft, findNode(t, st, "n3")); diff != "" {
		t.Errorf("n3 (-want +got):\n%s", diff)
	}
	got := findNode(t, st, "n2")
	if got.Rates != nil || got.NackVersion != nil || got.ConnectedSince != nil || len(got.Labels) != 0 {
		t.Errorf("n2 = %+v, want no rates, nack, connected_since or labels", got)
	}
}

// TestSaveNodesSessions checks that a write from an older connection of a
// node never overwrites a newer one.
func TestSaveNodesSessions(t *testing.T) {
	t.Parallel()
	st := openNodes(t)
	ctx := context.Background()
	t0 := time.Now().UTC().Truncate(time.Microsecond)
	t1, t2 := t0.Add(time.Second), t0.Add(2*time.Second)
	node := func(session string, since time.Time, status string, applied int64, seen time.Time) store.Node {
		return store.Node{ID: "n", Session: session, ConnectedSince: &since, Status: status, AppliedVersion: applied, LastSeen: seen}
	}
	// Each step writes one row and states which session's row is stored after it.
	steps := []struct {
		name        string
		write       store.Node
		wantSession string
		wantStatus  string
	}{
		{"first connection", node("a", t0, store.NodeConnected, 1, t0), "a", store.NodeConnected},
		{"same session updates", node("a", t0, store.NodeConnected, 2, t1), "a", store.NodeConnected},
		{"newer session takes over", node("b", t1, store.NodeConnected, 2, t1), "b", store.NodeConnected},
		{"late disconnect of the old session is ignored", node("a", t0, store.NodeDisconnected, 2, t2), "b", store.NodeConnected},
		{"late update of the old session is ignored", node("a", t0, store.NodeConnected, 9, t2), "b", store.NodeConnected},
		{"current session disconnects", node("b", t1, store.NodeDisconnected, 2, t2), "b", store.NodeDisconnected},
		{"any session takes a disconnected row", node("c", t0, store.NodeConnected, 3, t2), "c", store.NodeConnected},
		// A replica that died leaves its row connected; once the row is
		// stale, another session takes it even with an older start time.
		{"stale row is taken", node("d", t0.Add(-time.Hour), store.NodeConnected, 3, t2), "c", store.NodeConnected},
	}
	for _, s := range steps[:len(steps)-1] {
		if err := st.SaveNodes(ctx, []store.Node{s.write}, staleAfter); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if got := findNode(t, st, "n"); got.Session != s.wantSession || got.Status != s.wantStatus {
			t.Errorf("%s: stored session %q status %q, want %q %q", s.name, got.Session, got.Status, s.wantSession, s.wantStatus)
		}
	}
	// The last step: not stale yet, then stale.
	last := steps[len(steps)-1].write
	if err := st.SaveNodes(ctx, []store.Node{last}, staleAfter); err != nil {
		t.Fatal(err)
	}
	if got := findNode(t, st, "n"); got.Session != "c" {
		t.Errorf("fresh row taken by an older session: stored %q", got.Session)
	}
	old := node("c", t0, store.NodeConnected, 3, time.Now().Add(-2*staleAfter))
	if err := st.SaveNodes(ctx, []store.Node{old}, staleAfter); err != nil {
		t.Fatal(err)
	}
	if err := st.SaveNodes(ctx, []store.Node{last}, staleAfter); err != nil {
		t.Fatal(err)
	}
	if got := findNode(t, st, "n"); got.Session != "d" {
		t.Errorf("stale row not taken over: stored session %q, want d", got.Session)
	}
}

func TestSaveNodesBatches(t *testing.T) {
	t.Parallel()
	st := openNodes(t)
	ctx := context.Background()
	now := time.Now().UTC()
	const n = 2500 // more than one statement's worth
	nodes := make([]store.Node, 0, n+1)
	for i := range n {
		nodes = append(nodes, store.Node{ID: fmt.Sprintf("node-%04d", i), Status: store.NodeConnected, AppliedVersion: int64(i % 3),
			LastSeen: now, ConnectedSince: &now, Session: "s"})
	}
	// A duplicate id in one call: the last row wins.
	nodes = append(nodes, store.Node{ID: "node-0000", Status: store.NodeConnected, AppliedVersion: 7, LastSeen: now, ConnectedSince: &now, Session: "s"})
	if err := st.SaveNodes(ctx, nodes, staleAfter); err != nil {
		t.Fatal(err)
	}
	list, err := st.ListNodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != n {
		t.Fatalf("%d nodes stored, want %d", len(list), n)
	}
	if list[0].ID != "node-0000" || list[0].AppliedVersion != 7 {
		t.Errorf("first node %s applied %d, want node-0000 applied 7", list[0].ID, list[0].AppliedVersion)
	}
}

func TestAppliedCounts(t *testing.T) {
	t.Parallel()
	st := openNodes(t)
	ctx := context.Background()
	now := time.Now().UTC()
	old := now.Add(-time.Hour)
	nodes := []store.Node{
		{ID: "a", Status: store.NodeConnected, AppliedVersion: 2, LastSeen: now},
		{ID: "b", Status: store.NodeConnected, AppliedVersion: 2, LastSeen: now},
		{ID: "c", Status: store.NodeConnected, AppliedVersion: 1, LastSeen: now},
		{ID: "d", Status: store.NodeDisconnected, AppliedVersion: 2, LastSeen: now}, // gone
		{ID: "e", Status: store.NodeConnected, AppliedVersion: 2, LastSeen: old},    // its console died
	}
	if err := st.SaveNodes(ctx, nodes, staleAfter); err != nil {
		t.Fatal(err)
	}
	got, err := st.AppliedCounts(ctx, now.Add(-staleAfter))
	if err != nil {
		t.Fatal(err)
	}
	want := store.VersionCounts{Connected: 3, ByVersion: map[int64]int{2: 2, 1: 1}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("AppliedCounts (-want +got):\n%s", diff)
	}

	removed, err := st.DeleteNodesSeenBefore(ctx, now.Add(-time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if removed != 1 {
		t.Errorf("DeleteNodesSeenBefore removed %d, want 1 (node e)", removed)
	}
}

// TestSaveNodesRefusedRowsDoNotBlockTheOthers: rows Postgres refuses (a NUL
// in a text or jsonb column) are reported, and every other row of the batch
// is written.
func TestSaveNodesRefusedRowsDoNotBlockTheOthers(t *testing.T) {
	t.Parallel()
	st := openNodes(t)
	ctx := context.Background()
	now := time.Now().UTC()
	row := func(id string) store.Node {
		return store.Node{ID: id, Status: store.NodeConnected, ConnectedSince: &now, LastSeen: now, Session: "s-" + id}
	}
	badLabel := row("bad-label")
	badLabel.Labels = map[string]string{"zone": "a\x00"}
	badBuild := row("bad-build")
	badBuild.Build = "v1\x00"
	badNack := row("bad-nack")
	v := int64(2)
	badNack.NackVersion, badNack.NackError, badNack.NackedAt = &v, "boom\x00", &now
	batch := []store.Node{row("good-1"), row("bad\x00id"), badLabel, badBuild, badNack, row("good-2")}

	err := st.SaveNodes(ctx, batch, staleAfter)
	var refused *store.RefusedNodesError
	if !errors.As(err, &refused) {
		t.Fatalf("SaveNodes = %v, want a *store.RefusedNodesError", err)
	}
	if want := []string{"bad\x00id", "bad-label", "bad-build", "bad-nack"}; !cmp.Equal(refused.IDs, want) {
		t.Errorf("refused %q, want %q", refused.IDs, want)
	}
	nodes, err := st.ListNodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, n := range nodes {
		ids = append(ids, n.ID)
	}
	if want := []string{"good-1", "good-2"}; !cmp.Equal(ids, want) {
		t.Errorf("registry holds %q, want %q", ids, want)
	}
	// A later batch of good rows is written as usual.
	if err := st.SaveNodes(ctx, []store.Node{row("good-3")}, staleAfter); err != nil {
		t.Fatalf("next batch: %v", err)
	}
}

// TestUpdateNodes checks that UpdateNodes rewrites what a node's messages
// change in its own connection's row, leaves the other columns alone, and
// hands back the nodes whose row belongs to another session or is not
// connected, without touching those rows.
func TestUpdateNodes(t *testing.T) {
	t.Parallel()
	st := openNodes(t)
	ctx := context.Background()
	t0 := time.Now().UTC().Truncate(time.Microsecond)
	t1 := t0.Add(time.Second)
	base := func(id, session, status string) store.Node {
		return store.Node{ID: id, Session: session, Status: status, ConnectedSince: &t0, LastSeen: t0, AppliedVersion: 1,
			Labels: map[string]string{"zone": "a"}, Build: "v1", Address: "10.0.0.1:1", Protocol: 1, Console: "c1", Kind: store.NodeSluice}
	}
	if err := st.SaveNodes(ctx, []store.Node{base("mine", "s1", store.NodeConnected), base("taken", "s9", store.NodeConnected),
		base("gone", "s1", store.NodeDisconnected)}, staleAfter); err != nil {
		t.Fatal(err)
	}
	nack := int64(3)
	update := func(id string) store.Node {
		n := base(id, "s1", store.NodeConnected)
		n.AppliedVersion, n.LastSeen, n.NackVersion, n.NackError, n.NackedAt = 2, t1, &nack, "bad", &t1
		n.Rates = &store.NodeRates{At: t1, Decisions: 5, Allowed: 4, Limited: 1}
		n.Build, n.Labels = "ignored", map[string]string{"zone": "ignored"} // not a column UpdateNodes writes
		return n
	}
	rest, err := st.UpdateNodes(ctx, []store.Node{update("mine"), update("taken"), update("gone"), update("unknown")})
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, n := range rest {
		left = append(left, n.ID)
	}
	if diff := cmp.Diff([]string{"taken", "gone", "unknown"}, left); diff != "" {
		t.Errorf("nodes handed back (-want +got):\n%s", diff)
	}
	want := base("mine", "s1", store.NodeConnected)
	want.AppliedVersion, want.LastSeen, want.NackVersion, want.NackError, want.NackedAt = 2, t1, &nack, "bad", &t1
	want.Rates = &store.NodeRates{At: t1, Decisions: 5, Allowed: 4, Limited: 1}
	if diff := cmp.Diff(want, findNode(t, st, "mine")); diff != "" {
		t.Errorf("updated row (-want +got):\n%s", diff)
	}
	for id, session := range map[string]string{"taken": "s9", "gone": "s1"} {
		if got := findNode(t, st, id); got.AppliedVersion != 1 || got.Session != session || !got.LastSeen.Equal(t0) {
			t.Errorf("row %s changed: %+v", id, got)
		}
	}
	// A refused chunk is handed back whole for SaveNodes to sort out.
	bad := update("mine")
	bad.NackError = "nul \x00 byte"
	rest, err = st.UpdateNodes(ctx, []store.Node{bad})
	if err != nil || len(rest) != 1 {
		t.Errorf("refused update: rest %d, err %v; want the node back and no error", len(rest), err)
	}
}
