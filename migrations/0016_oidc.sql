-- +goose Up

-- A user signed in through OpenID Connect is linked to the provider's
-- account by issuer and subject (never by username, which a provider does
-- not guarantee stable or unique). Local users have neither.
ALTER TABLE users ADD COLUMN oidc_issuer text;
ALTER TABLE users ADD COLUMN oidc_subject text;
ALTER TABLE users ADD CONSTRAINT users_oidc_pair CHECK ((oidc_issuer IS NULL) = (oidc_subject IS NULL));
ALTER TABLE users ADD CONSTRAINT users_oidc_identity UNIQUE (oidc_issuer, oidc_subject);

-- oidc_flows holds a sign-in in progress between the redirect to the
-- provider and its callback: the nonce and PKCE verifier, keyed by the
-- SHA-256 of the state (which only the browser's cookie and the provider's
-- redirect carry). The callback deletes the row it uses, so each flow
-- completes at most once.
CREATE TABLE oidc_flows (
    state_hash text        PRIMARY KEY,
    nonce      text        NOT NULL,
    verifier   text        NOT NULL,
    return_to  text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
CREATE INDEX oidc_flows_expires ON oidc_flows (expires_at);

-- +goose Down
DROP TABLE oidc_flows;
ALTER TABLE users DROP CONSTRAINT users_oidc_identity;
ALTER TABLE users DROP CONSTRAINT users_oidc_pair;
ALTER TABLE users DROP COLUMN oidc_subject;
ALTER TABLE users DROP COLUMN oidc_issuer;
