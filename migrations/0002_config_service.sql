-- +goose Up

-- settings is a single row of console-wide options.
CREATE TABLE settings (
    id               boolean     PRIMARY KEY DEFAULT true CHECK (id),
    require_approval boolean     NOT NULL DEFAULT false,
    updated_at       timestamptz NOT NULL DEFAULT now(),
    updated_by       text        NOT NULL DEFAULT ''
);
INSERT INTO settings (id) VALUES (true);

-- change_requests hold publishes waiting for a second person (four-eyes).
-- kind publish/delete/domain_rollback change one domain, with its content
-- resolved when proposed (yaml, deleted); kind rollback restores the whole
-- ruleset of version rollback_of. base_version is the version the author saw:
-- approval fails if the domain (or, for rollback, the ruleset) moved since.
-- author_owner is the person who answers for the author (the user itself, or
-- the creator of a token), so nobody approves their own change through a
-- token of theirs.
CREATE TABLE change_requests (
    id             bigserial   PRIMARY KEY,
    created_at     timestamptz NOT NULL DEFAULT now(),
    author         text        NOT NULL,
    author_owner   text        NOT NULL,
    kind           text        NOT NULL CHECK (kind IN ('publish', 'delete', 'domain_rollback', 'rollback')),
    domain         text        NOT NULL DEFAULT '',
    yaml           text        NOT NULL DEFAULT '',
    deleted        boolean     NOT NULL DEFAULT false,
    base_version   bigint      NOT NULL CHECK (base_version >= 0),
    rollback_of    bigint      REFERENCES versions (version),
    message        text        NOT NULL,
    status         text        NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'approved', 'rejected')),
    reviewer       text        NOT NULL DEFAULT '',
    reviewed_at    timestamptz,
    review_message text        NOT NULL DEFAULT '',
    version        bigint      REFERENCES versions (version),
    CHECK ((kind = 'rollback') = (domain = '')),
    CHECK ((status = 'approved') = (version IS NOT NULL))
);
CREATE INDEX change_requests_status ON change_requests (status, id);
CREATE INDEX change_requests_domain ON change_requests (domain, id);

-- A version published by approving a change request names the approver.
ALTER TABLE versions
    ADD COLUMN approved_by text,
    ADD COLUMN change_id   bigint REFERENCES change_requests (id);
CREATE INDEX versions_author ON versions (author, version);
CREATE INDEX versions_created_at ON versions (created_at);

-- History and its audit are append-only: published versions and their
-- domain revisions never change once written.
-- +goose StatementBegin
CREATE FUNCTION refuse_change() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION '% is append-only', TG_TABLE_NAME;
END;
$$ LANGUAGE plpgsql;
-- +goose StatementEnd

CREATE TRIGGER versions_no_update BEFORE UPDATE OR DELETE ON versions
    FOR EACH ROW EXECUTE FUNCTION refuse_change();
CREATE TRIGGER domain_revisions_no_update BEFORE UPDATE OR DELETE ON domain_revisions
    FOR EACH ROW EXECUTE FUNCTION refuse_change();

-- Audit filters.
CREATE INDEX audit_events_actor ON audit_events (actor, id);
CREATE INDEX audit_events_action ON audit_events (action, id);
CREATE INDEX audit_events_target ON audit_events (target, id);

ALTER TABLE users ADD COLUMN password_changed_at timestamptz;
ALTER TABLE api_tokens ADD COLUMN rotated_at timestamptz;
CREATE INDEX sessions_expires_at ON sessions (expires_at);

-- +goose Down
SELECT 'forward-only';
