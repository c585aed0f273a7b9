-- +goose Up

-- The node registry as the push hub keeps it: which console replica holds
-- a node's connection (session_id changes on every connection, so a
-- replica that lost a node cannot overwrite the row of the replica that
-- has it now), the protocol version it speaks, when it last rejected a
-- version, and its latest decision rates.
ALTER TABLE nodes
    ADD COLUMN session_id text        NOT NULL DEFAULT '',
    ADD COLUMN console_id text        NOT NULL DEFAULT '',
    ADD COLUMN protocol   integer     NOT NULL DEFAULT 0,
    ADD COLUMN nacked_at  timestamptz,
    ADD COLUMN rates      jsonb;

-- How many connected nodes run each version (GET /api/v1/versions).
CREATE INDEX nodes_connected_version ON nodes (applied_version) WHERE status = 'connected';

-- Every new version notifies the console replicas on channel
-- sluice_versions with the version as payload. NOTIFY is delivered when
-- the publishing transaction commits and never if it rolls back, and a
-- trigger covers every way a version is written.
-- +goose StatementBegin
CREATE FUNCTION versions_notify() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('sluice_versions', NEW.version::text);
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;
-- +goose StatementEnd

CREATE TRIGGER versions_notify AFTER INSERT ON versions
    FOR EACH ROW EXECUTE FUNCTION versions_notify();

-- +goose Down
SELECT 'forward-only';
