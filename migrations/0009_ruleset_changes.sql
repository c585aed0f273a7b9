-- +goose Up

-- A change request of kind ruleset (PUT /api/v1/ruleset, sluice ctl rules
-- apply) sets several domains and removes some in one version. Its domains
-- are in edits, a JSON array of {"domain", "yaml", "deleted"} sorted by
-- domain; its domain and yaml columns stay empty, as a whole-ruleset
-- rollback's do. Approving it publishes every edit in one version.
ALTER TABLE change_requests ADD COLUMN edits jsonb;

ALTER TABLE change_requests DROP CONSTRAINT change_requests_kind_check;
ALTER TABLE change_requests ADD CONSTRAINT change_requests_kind_check
    CHECK (kind IN ('publish', 'delete', 'domain_rollback', 'rollback', 'ruleset'));
ALTER TABLE change_requests DROP CONSTRAINT change_requests_check;
ALTER TABLE change_requests ADD CONSTRAINT change_requests_check
    CHECK ((kind IN ('rollback', 'ruleset')) = (domain = ''));
ALTER TABLE change_requests ADD CONSTRAINT change_requests_edits_check
    CHECK ((kind = 'ruleset') = (edits IS NOT NULL));

-- +goose Down
SELECT 'forward-only';
