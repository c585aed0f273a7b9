-- +goose Up

-- A node token is bound to one node id: the first one it connects with
-- (issue 13). NULL until then. A node id belongs to at most one live token;
-- disabling a token frees its node id for a new token, which is how an
-- admin moves a node id to a new token.
ALTER TABLE api_tokens ADD COLUMN node_id text;

CREATE UNIQUE INDEX api_tokens_node_id ON api_tokens (node_id) WHERE node_id IS NOT NULL AND NOT disabled;

-- +goose Down
SELECT 'forward-only';
