-- +goose Up

-- The node registry records the token each node connected with: a fleet
-- node token serves many node ids, and disabling a token shows which
-- nodes it cuts off. NULL for rows written before, and when the token is
-- deleted.
ALTER TABLE nodes ADD COLUMN token_id bigint REFERENCES api_tokens (id) ON DELETE SET NULL;

-- +goose Down
SELECT 'forward-only';
