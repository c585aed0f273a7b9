-- +goose Up

-- Nodes fed over xDS (sluice console --xds-listen: stock envoyproxy/ratelimit
-- processes) share the registry with Sluice enforcers. kind tells them
-- apart; unsupported_domains lists, for an xDS node, the domains of the
-- version it was last sent that it cannot run and why
-- ([{"domain": "...", "reasons": ["..."]}]).
ALTER TABLE nodes ADD COLUMN kind text NOT NULL DEFAULT 'sluice' CHECK (kind IN ('sluice', 'xds'));
ALTER TABLE nodes ADD COLUMN unsupported_domains jsonb;

-- +goose Down
ALTER TABLE nodes DROP COLUMN unsupported_domains;
ALTER TABLE nodes DROP COLUMN kind;
