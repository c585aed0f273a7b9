-- +goose Up

-- Sessions get an id an admin can name (the primary key is the hash of the
-- secret, which never leaves the console), and where they were started.
ALTER TABLE sessions ADD COLUMN id bigserial;
ALTER TABLE sessions ADD CONSTRAINT sessions_id UNIQUE (id);
ALTER TABLE sessions ADD COLUMN ip text NOT NULL DEFAULT '';
ALTER TABLE sessions ADD COLUMN user_agent text NOT NULL DEFAULT '';

-- Session lifetimes (seconds): idle since the last request, absolute since
-- sign-in. At most 7 days, the session cookie's own lifetime.
ALTER TABLE settings ADD COLUMN session_idle_s integer NOT NULL DEFAULT 43200
    CHECK (session_idle_s BETWEEN 300 AND 604800);
ALTER TABLE settings ADD COLUMN session_absolute_s integer NOT NULL DEFAULT 604800
    CHECK (session_absolute_s BETWEEN 300 AND 604800);

-- The audit stream: every audit event, in order, POSTed to a SIEM webhook
-- as JSON lines signed with HMAC-SHA-256. delivered_id is the id of the
-- last event the receiver acknowledged: one leader among the console
-- replicas delivers from there, so a restart neither loses nor repeats
-- what was acknowledged.
CREATE TABLE audit_stream (
    id           boolean     PRIMARY KEY DEFAULT true CHECK (id),
    url          text        NOT NULL DEFAULT '',
    secret       text        NOT NULL DEFAULT '',
    enabled      boolean     NOT NULL DEFAULT false,
    delivered_id bigint      NOT NULL DEFAULT 0,
    last_error   text        NOT NULL DEFAULT '',
    last_attempt timestamptz,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    updated_by   text        NOT NULL DEFAULT ''
);
INSERT INTO audit_stream (id) VALUES (true);

-- +goose Down
SELECT 'forward-only';
