-- +goose Up

-- Every ack rewrites a node's row with a new applied_version, so the
-- partial index on that column made each ack a non-HOT update: a new
-- entry in both indexes and a page for the new row version. Counting the
-- connected nodes per version (GET /api/v1/versions) also filters on
-- last_seen and reads every connected row, which a scan of this small
-- table does as well. Without the index, and with room left in each page,
-- registry writes stay on their page (HOT) and touch no index: at 10,000
-- acks, Postgres's CPU per row fell from 23 to 14 µs (BENCHMARKS.md).
-- (Rows written before this move to such pages as they are updated and
-- vacuumed.)
DROP INDEX nodes_connected_version;
ALTER TABLE nodes SET (fillfactor = 70);

-- +goose Down
ALTER TABLE nodes RESET (fillfactor);
CREATE INDEX nodes_connected_version ON nodes (applied_version) WHERE status = 'connected';
