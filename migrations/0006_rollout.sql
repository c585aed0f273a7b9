-- +goose Up

-- Staged rollouts (issue 19). A version published with a rollout goes first
-- to the nodes whose labels match; the other nodes stay on base_version (the
-- version before it) until it is promoted (state promoted: every node gets
-- it) or rolled back (a new version, sent to every node: rolled_back, or
-- halted when the console did it by itself). At most one rollout is staged
-- at a time; while one is, other publishes are refused (409).
CREATE TABLE rollouts (
    version      bigint      PRIMARY KEY REFERENCES versions (version),
    base_version bigint      NOT NULL,
    labels       jsonb       NOT NULL,
    auto_halt    jsonb,
    state        text        NOT NULL DEFAULT 'staged'
                 CHECK (state IN ('staged', 'promoted', 'rolled_back', 'halted')),
    created_at   timestamptz NOT NULL DEFAULT now(),
    created_by   text        NOT NULL,
    ended_at     timestamptz,
    ended_by     text        NOT NULL DEFAULT '',
    ended_in     bigint      REFERENCES versions (version),
    reason       text        NOT NULL DEFAULT '',  -- the promote's message, or why it was halted
    CHECK ((state = 'staged') = (ended_at IS NULL)),
    CHECK (base_version < version)
);
CREATE UNIQUE INDEX rollouts_one_staged ON rollouts (state) WHERE state = 'staged';
CREATE INDEX rollouts_ended_at ON rollouts (ended_at) WHERE state = 'promoted';

-- A rollout that ends changes what every node should run: tell every
-- replica on the versions channel (payload: the rollout's version), as a
-- new version does.
CREATE TRIGGER rollouts_notify AFTER UPDATE ON rollouts
    FOR EACH ROW EXECUTE FUNCTION versions_notify();

-- +goose Down
SELECT 'forward-only';
