package hub

//lint:file-ignore SA1019 nhooyr.io/websocket is the websocket library the product card fixes (its maintained twin is github.com/coder/websocket)

import (
	"context"
	"encoding/json"
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
// keeps it and sends it again. An invalid batch closes the connection.
func (h *Hub) quota(ctx context.Context, c *conn, q *wire.Quota) error {
	if err := q.Validate(); err != nil {
		return closeError{code: websocket.StatusPolicyViolation, reason: err.Error()}
	}
	sctx, cancel := context.WithTimeout(ctx, quotaTimeout)
	applied, err := h.store.RecordQuota(sctx, c.node.ID, q)
	cancel()
	if err != nil {
		h.log.Warn("cannot store quota usage; the node will send it again", "node_id", c.node.ID, "seq", q.Seq, "error", err)
		return nil
	}
	if q.Dropped > 0 && applied {
		h.log.Warn("node dropped quota usage: it held the most entries it keeps", "node_id", c.node.ID, "dropped_hits", q.Dropped)
	}
	data, err := json.Marshal(wire.QuotaAck{Type: wire.TypeQuotaAck, Epoch: q.Epoch, Seq: q.Seq})
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, h.writeTimeout)
	defer cancel()
	if err := c.ws.Write(wctx, websocket.MessageText, data); err != nil {
		return closeError{code: websocket.StatusTryAgainLater, reason: "write timed out"}
	}
	return nil
}
