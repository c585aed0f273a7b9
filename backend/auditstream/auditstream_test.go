package auditstream_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/sluicehq/sluice/backend/auditstream"
	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/internal/testenv"
)

// receiver is a SIEM endpoint that refuses its first failFirst requests.
type receiver struct {
	mu        sync.Mutex
	failFirst int
	requests  int
	badSig    int
	ids       []int64
	hashes    map[int64]string
}

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.requests++
	if r.requests <= r.failFirst {
		http.Error(w, "down", http.StatusServiceUnavailable)
		return
	}
	if req.Header.Get(auditstream.SignatureHeader) != auditstream.Sign(secret, body) {
		r.badSig++
		http.Error(w, "bad signature", http.StatusUnauthorized)
		return
	}
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		var ev store.AuditEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.ids = append(r.ids, ev.ID)
		r.hashes[ev.ID] = ev.Hash
	}
}

func (r *receiver) received() []int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]int64(nil), r.ids...)
}

const secret = "a-signing-key-of-some-length"

// start runs a streamer (one console replica's) until the returned stop.
func start(t *testing.T, st *store.Store) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		auditstream.New(auditstream.Config{Store: st, Batch: 3, Poll: 20 * time.Millisecond,
			MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}).Run(ctx)
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return stop
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestAuditStream: every event reaches the receiver once, in order, with a
// valid signature, after the receiver's failures are retried; replicas
// restarting or running side by side neither lose nor repeat events.
func TestAuditStream(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, err := store.Open(ctx, testenv.PostgresURL(t), store.PasswordCost(bcrypt.MinCost)) // fast hashing
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	rcv := &receiver{failFirst: 3, hashes: map[int64]string{}}
	srv := httptest.NewServer(rcv)
	t.Cleanup(srv.Close)
	sys := store.Actor{Name: "test"}
	sec := secret
	if _, err := st.UpdateAuditStream(ctx, store.AuditStreamUpdate{URL: srv.URL, Secret: &sec, Enabled: true}, sys); err != nil {
		t.Fatal(err)
	}
	events := func(n, from int) {
		for i := range n {
			if _, err := st.CreateUser(ctx, fmt.Sprintf("user%d", from+i), "password1", "viewer", sys); err != nil {
				t.Fatal(err)
			}
		}
	}
	total := func() int {
		n, err := st.CountAuditAfter(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		return int(n)
	}
	events(7, 0)
	stop := start(t, st)
	waitFor(t, "every event delivered", func() bool { return len(rcv.received()) == total() })
	stop()

	// Two replicas from now on, and more events.
	start(t, st)
	start(t, st)
	events(8, 100)
	waitFor(t, "the later events delivered", func() bool { return len(rcv.received()) == total() })

	got := rcv.received()
	for i, id := range got {
		if id != int64(i+1) {
			t.Fatalf("received ids %v, want 1..%d in order, each once", got, total())
		}
	}
	rcv.mu.Lock()
	requests, bad := rcv.requests, rcv.badSig
	rcv.mu.Unlock()
	if requests <= rcv.failFirst || bad != 0 {
		t.Errorf("requests %d (first %d refused), bad signatures %d", requests, rcv.failFirst, bad)
	}
	page, _, err := st.ListAudit(ctx, store.AuditFilter{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range page {
		if rcv.hashes[ev.ID] != ev.Hash {
			t.Errorf("event %d delivered with hash %q, trail has %q", ev.ID, rcv.hashes[ev.ID], ev.Hash)
		}
	}
	s, err := st.FindAuditStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if s.DeliveredID != int64(total()) || s.LastError != "" {
		t.Errorf("stream state %+v, want cursor at %d and no error", s, total())
	}
}
