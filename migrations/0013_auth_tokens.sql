-- +goose Up

-- A token acts for its owner, a user: it never holds more than its owner
-- holds now (the lower of the two roles, the narrower of the two domain
-- lists), and stops working when its owner is disabled. The owner starts
-- as the creator and an admin can hand the token to another user. NULL
-- for tokens no person created (made by the system).
ALTER TABLE api_tokens ADD COLUMN owner_id bigint REFERENCES users (id);
UPDATE api_tokens t SET owner_id = u.id FROM users u WHERE t.created_by = 'user:' || u.username;
CREATE INDEX api_tokens_owner ON api_tokens (owner_id);

-- A read-only token makes GET requests only, whatever its role.
ALTER TABLE api_tokens ADD COLUMN read_only boolean NOT NULL DEFAULT false;

-- A fleet node token is never bound to one node id: any node may connect
-- with it, but not as a node id that is already connected.
ALTER TABLE api_tokens ADD COLUMN fleet boolean NOT NULL DEFAULT false;
ALTER TABLE api_tokens ADD CONSTRAINT api_tokens_fleet_node CHECK (NOT fleet OR role = 'node');

-- +goose Down
SELECT 'forward-only';
