-- +goose Up

-- auth_changes.n counts the statements that may have revoked a token: a
-- token disabled, rotated, given another expiry, role or owner, or deleted,
-- and a user disabled, given another role, or deleted. The console's hubs
-- read it every couple of seconds and check their nodes' tokens again only
-- when it moved (expiries they watch themselves), instead of reading every
-- connected node's token each time. A token bound to its node (node_id)
-- only ever becomes more usable, so that does not count. The count
-- becomes visible when the change commits, in the order of the commits.
CREATE TABLE auth_changes (
    id boolean PRIMARY KEY DEFAULT true CHECK (id),
    n  bigint  NOT NULL DEFAULT 0
);
INSERT INTO auth_changes DEFAULT VALUES;

-- +goose StatementBegin
CREATE FUNCTION note_auth_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE auth_changes SET n = n + 1;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER api_tokens_auth_change
    AFTER UPDATE OF role, hash, expires_at, disabled, owner_id, fleet OR DELETE ON api_tokens
    FOR EACH STATEMENT EXECUTE FUNCTION note_auth_change();
CREATE TRIGGER users_auth_change
    AFTER UPDATE OF role, disabled OR DELETE ON users
    FOR EACH STATEMENT EXECUTE FUNCTION note_auth_change();
