package hub

//lint:file-ignore SA1019 Sluice uses nhooyr.io/websocket, deprecated in favour of its maintained twin github.com/coder/websocket

import (
	"context"
	"encoding/json"
	"log/slog"
	"time"

	"nhooyr.io/websocket"

	"github.com/sluicehq/sluice/rules/wire"
)

// quotaTimeout bounds storing one quota batch. The node's read loop waits
// for it (batches come every few seconds, one at a time), so it stays well
// under the ping timeout.
const quotaTimeout = 5 * time.Second

// quota stores a node's quota batch and acknowledges it. A batch already
// applied (a resend after a lost ack) is acknowledged again and adds
// nothing. When the store fails, the batch is not acknowledged: the node
// keeps it and sends it again. Usage entries that are malformed, name a
// quota the node's versions do not have or count more than its limit are
// dropped and counted (input.go), and the rest of the batch is stored and
// acknowledged, so that no entry makes the node resend forever; a batch
// malformed as a whole (its epoch, seq or size) closes the connection.
func (h *Hub) quota(ctx context.Context, c *conn, q *wire.Quota) error {
	c.mu.Lock()
	cats := c.catView
	c.mu.Unlock()
	cl, err := q.Clean(cats...)
	if err != nil {
		return closeError{code: websocket.StatusPolicyViolation, reason: err.Error()}
	}
	sctx, cancel := context.WithTimeout(ctx, quotaTimeout)
	applied, err := h.store.RecordQuota(sctx, c.node.ID, q)
	cancel()
	if err != nil {
		h.nodeLog(c.node.ID, slog.LevelWarn, "cannot store quota usage; the node will send it again", "node_id", c.node.ID, "seq", q.Seq, "error", err)
		return nil
	}
	if applied { // a resend was counted when it was applied
		h.noteCleaning(c, "quota", cl)
	}
	if q.Dropped > 0 && applied {
		h.nodeLog(c.node.ID, slog.LevelWarn, "node dropped quota usage: it held the most entries it keeps", "node_id", c.node.ID, "dropped_hits", q.Dropped)
	}
	data, err := json.Marshal(wire.QuotaAck{Type: wire.TypeQuotaAck, Epoch: q.Epoch, Seq: q.Seq})
	if err != nil {
		return err
	}
	if err := h.send(c, textFrame(data), "send quota ack", "seq", q.Seq); err != nil {
		return closeError{code: websocket.StatusTryAgainLater, reason: "write failed"}
	}
	return nil
}
