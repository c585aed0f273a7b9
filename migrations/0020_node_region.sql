-- +goose Up

-- The region an enforcer runs in (sluice enforcer --region), from its
-- hello: GET /api/v1/nodes shows it, and the console counts the regions of
-- the connected nodes for the snapshots it sends (region_count), which
-- share a scope: global limit between regions while the global store is
-- unreachable. '' for a node that names no region.
ALTER TABLE nodes ADD COLUMN region text NOT NULL DEFAULT '';

-- +goose Down
SELECT 'forward-only';
