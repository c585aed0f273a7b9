-- +goose Up

-- ruleset_head is a single row holding the latest published version. Every
-- publish increments it inside its transaction, which serializes publishers
-- and keeps versions contiguous.
CREATE TABLE ruleset_head (
    id      boolean PRIMARY KEY DEFAULT true CHECK (id),
    version bigint  NOT NULL DEFAULT 0
);
INSERT INTO ruleset_head (id, version) VALUES (true, 0);

CREATE TABLE users (
    id            bigserial PRIMARY KEY,
    username      text        NOT NULL UNIQUE,
    password_hash text        NOT NULL,
    role          text        NOT NULL CHECK (role IN ('viewer', 'editor', 'admin')),
    disabled      boolean     NOT NULL DEFAULT false,
    created_at    timestamptz NOT NULL DEFAULT now()
);

-- versions: one row per published ruleset version, immutable.
CREATE TABLE versions (
    version     bigint      PRIMARY KEY CHECK (version > 0),
    created_at  timestamptz NOT NULL DEFAULT now(),
    author      text        NOT NULL,
    message     text        NOT NULL,
    rollback_of bigint      REFERENCES versions (version),
    checksum    text        NOT NULL
);

-- domain_revisions: the domains a version changed. A domain's content at
-- version n is its newest revision with version <= n; deleted marks removal.
CREATE TABLE domain_revisions (
    version bigint  NOT NULL REFERENCES versions (version) DEFERRABLE INITIALLY DEFERRED,
    domain  text    NOT NULL,
    yaml    text    NOT NULL DEFAULT '',
    deleted boolean NOT NULL DEFAULT false,
    PRIMARY KEY (domain, version)
);
CREATE INDEX domain_revisions_version ON domain_revisions (version);

CREATE TABLE sessions (
    id_hash    text        PRIMARY KEY,
    user_id    bigint      NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    csrf_token text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    last_seen  timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
CREATE INDEX sessions_user ON sessions (user_id);

-- api_tokens are stored as SHA-256 of the secret; only the last four
-- characters are kept in clear to help people tell them apart.
CREATE TABLE api_tokens (
    id         bigserial   PRIMARY KEY,
    name       text        NOT NULL,
    role       text        NOT NULL CHECK (role IN ('viewer', 'editor', 'admin', 'node')),
    hash       text        NOT NULL UNIQUE,
    last4      text        NOT NULL,
    created_by text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz,
    disabled   boolean     NOT NULL DEFAULT false
);

-- audit_events is an append-only hash chain: hash = SHA-256(prev_hash ||
-- canonical JSON of the row). The trigger below refuses UPDATE and DELETE.
CREATE TABLE audit_events (
    id         bigserial   PRIMARY KEY,
    at         timestamptz NOT NULL DEFAULT now(),
    actor      text        NOT NULL,
    action     text        NOT NULL,
    target     text        NOT NULL DEFAULT '',
    before     jsonb,
    after      jsonb,
    message    text        NOT NULL DEFAULT '',
    ip         text        NOT NULL DEFAULT '',
    user_agent text        NOT NULL DEFAULT '',
    request_id text        NOT NULL DEFAULT '',
    prev_hash  text        NOT NULL,
    hash       text        NOT NULL
);
CREATE INDEX audit_events_at ON audit_events (at);

-- +goose StatementBegin
CREATE FUNCTION audit_events_immutable() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'audit_events is append-only';
END;
$$ LANGUAGE plpgsql;
-- +goose StatementEnd

CREATE TRIGGER audit_events_no_update BEFORE UPDATE OR DELETE ON audit_events
    FOR EACH ROW EXECUTE FUNCTION audit_events_immutable();

CREATE TABLE nodes (
    id              text        PRIMARY KEY,
    applied_version bigint      NOT NULL DEFAULT 0,
    status          text        NOT NULL DEFAULT 'connected',
    labels          jsonb       NOT NULL DEFAULT '{}',
    build           text        NOT NULL DEFAULT '',
    address         text        NOT NULL DEFAULT '',
    connected_since timestamptz,
    last_seen       timestamptz NOT NULL DEFAULT now(),
    nack_version    bigint,
    nack_error      text        NOT NULL DEFAULT ''
);

-- +goose Down
SELECT 'forward-only';
