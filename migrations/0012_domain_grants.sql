-- +goose Up

-- A user's or token's role may hold for listed domains only: empty means
-- every domain (what every existing user and token keeps).
ALTER TABLE users ADD COLUMN domains text[] NOT NULL DEFAULT '{}';
ALTER TABLE api_tokens ADD COLUMN domains text[] NOT NULL DEFAULT '{}';

-- +goose Down
ALTER TABLE api_tokens DROP COLUMN domains;
ALTER TABLE users DROP COLUMN domains;
