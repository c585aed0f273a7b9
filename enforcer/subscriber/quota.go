package subscriber

//lint:file-ignore SA1019 Sluice uses nhooyr.io/websocket, deprecated in favour of its maintained twin github.com/coder/websocket

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"sync"
	"time"

	"nhooyr.io/websocket"

	"github.com/sluicehq/sluice/rules/wire"
)

// Quota usage
//
// With a QuotaSource, the subscriber sends the engine's quota usage to the
// console in wire.Quota batches: every QuotaInterval (DefaultQuotaInterval,
// 10 s), as soon as the source signals QuotaFull, and once more when Run's
// context ends while connected (waiting up to quotaShutdownWait for the
// ack). One batch is outstanding at a time. It is kept, and sent again on
// the next interval or connection, until the console acknowledges its
// seq; the console applies a seq of this process's epoch at most once, so
// a resend after a lost ack counts nothing twice, and a console blip or
// replica change loses nothing. Meanwhile the engine keeps adding up usage
// (bounded by engine.QuotaMaxEntries).
//
// What a node loses: a node killed (SIGKILL, a crash, the machine) loses
// the usage it recorded since its last acknowledged batch was taken: at
// most one QuotaInterval of its admitted quota hits, plus the outstanding
// batch when the console had not stored it yet. A node stopped while it
// cannot reach the console loses what it has not sent. Nothing is counted
// twice.

// DefaultQuotaInterval is how often quota usage is sent.
const DefaultQuotaInterval = 10 * time.Second

// quotaShutdownWait bounds the last send at shutdown.
const quotaShutdownWait = 2 * time.Second

// QuotaSource removes and returns up to limit recorded quota usage entries,
// the hits it dropped since its previous call and whether entries remain
// (engine.Engine.TakeQuota).
type QuotaSource func(limit int) (usage []wire.QuotaUsage, dropped int64, more bool)

// quotaState is the node's side of the quota batches; it outlives sessions.
type quotaState struct {
	mu       sync.Mutex
	epoch    string
	seq      int64
	pending  *wire.Quota // outstanding until acknowledged
	data     []byte      // pending, encoded
	sentOn   *websocket.Conn
	sentAt   time.Time
	leftover []wire.QuotaUsage // taken from the source, not yet in a batch
	more     bool              // the source had more when last taken from
	acked    chan struct{}     // closed (and replaced) at each ack
}

func newQuotaState() *quotaState {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return &quotaState{epoch: hex.EncodeToString(b), acked: make(chan struct{})}
}

// nextQuota makes the next batch pending from leftover and the source; caller
// holds q.mu. It reports whether there is one.
func (s *Subscriber) nextQuota() bool {
	q := s.quota
	usage := q.leftover
	q.leftover = nil
	var dropped int64
	if len(usage) < wire.MaxQuotaUsage {
		got, d, m := s.cfg.QuotaSource(wire.MaxQuotaUsage - len(usage))
		usage, dropped, q.more = append(usage, got...), d, m
	}
	if len(usage) == 0 && dropped == 0 {
		return false
	}
	q.seq++
	batch := &wire.Quota{Type: wire.TypeQuota, Epoch: q.epoch, Seq: q.seq, Usage: usage, Dropped: dropped}
	for {
		data, err := json.Marshal(batch)
		if err != nil {
			// Cannot happen for these types; keep nothing rather than loop.
			s.log.Error("encode quota batch", "error", err)
			return false
		}
		if len(data) <= wire.MaxNodeMessageBytes || len(batch.Usage) <= 1 {
			q.pending, q.data, q.sentOn = batch, data, nil
			return true
		}
		// Long domain and rule names: send half now, the rest next.
		half := len(batch.Usage) / 2
		q.leftover = append(batch.Usage[half:len(batch.Usage):len(batch.Usage)], q.leftover...)
		batch.Usage = batch.Usage[:half]
	}
}

// sendQuota sends the pending batch on conn unless it was sent there less
// than half an interval ago (so the next tick resends it); with take, it first makes a new batch pending when
// none is. It returns a write error (the connection is then unusable).
func (s *Subscriber) sendQuota(ctx context.Context, conn *websocket.Conn, take bool) error {
	q := s.quota
	q.mu.Lock()
	if q.pending == nil && (!take || !s.nextQuota()) {
		q.mu.Unlock()
		return nil
	}
	if q.sentOn == conn && time.Since(q.sentAt) < s.cfg.QuotaInterval/2 {
		q.mu.Unlock()
		return nil // waiting for its ack
	}
	data := q.data
	q.sentOn, q.sentAt = conn, time.Now()
	q.mu.Unlock()
	wctx, cancel := context.WithTimeout(ctx, writeTimeout)
	defer cancel()
	return conn.Write(wctx, websocket.MessageText, data)
}

// quotaAcked handles a console's QuotaAck: the pending batch is done.
func (s *Subscriber) quotaAcked(a *wire.QuotaAck) {
	q := s.quota
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.pending == nil || a.Epoch != q.epoch || a.Seq != q.pending.Seq {
		return
	}
	q.pending, q.data, q.sentOn = nil, nil, nil
	close(q.acked)
	q.acked = make(chan struct{})
}

// quotaBacklog returns the channel the next ack closes, whether a batch is
// pending and whether usage waits beyond it.
func (s *Subscriber) quotaBacklog() (acked <-chan struct{}, pending, backlog bool) {
	q := s.quota
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.acked, q.pending != nil, q.more || len(q.leftover) > 0
}

// reportQuota sends quota batches on conn until ctx ends: every interval,
// when the source is full, and right after an ack while a backlog waits.
func (s *Subscriber) reportQuota(ctx context.Context, conn *websocket.Conn) {
	t := time.NewTicker(s.cfg.QuotaInterval)
	defer t.Stop()
	take := false // the first send on a connection resends what is pending
	for {
		// Taken before sending, so an ack that comes meanwhile wakes us.
		acked, _, _ := s.quotaBacklog()
		if err := s.sendQuota(ctx, conn, take); err != nil {
			if ctx.Err() == nil {
				conn.Close(websocket.StatusGoingAway, "cannot send quota usage")
			}
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			take = true
		case <-s.cfg.QuotaFull:
			take = true
		case <-acked:
			_, _, take = s.quotaBacklog()
		}
	}
}

// flushQuota sends what is recorded and waits for the acks, until nothing
// is left or quotaShutdownWait has passed: the node is shutting down.
func (s *Subscriber) flushQuota(ctx context.Context, conn *websocket.Conn) {
	deadline := time.NewTimer(quotaShutdownWait)
	defer deadline.Stop()
	for {
		acked, _, _ := s.quotaBacklog()
		if err := s.sendQuota(ctx, conn, true); err != nil {
			return
		}
		if _, pending, _ := s.quotaBacklog(); !pending {
			return
		}
		select {
		case <-deadline.C:
			s.log.Warn("quota usage not acknowledged at shutdown; the console never receives it")
			return
		case <-acked:
		}
	}
}
