-- +goose Up

-- overrides are support's temporary exceptions: requests whose descriptor is
-- exactly entries get another rate until expires_at. They live beside the
-- domains' YAML, not in it: the version that publishes one (version) and the
-- version that removes it (ended_version, when it expired or was ended) bound
-- the versions whose snapshot carries it, so any version's ruleset can be
-- rebuilt and editing a domain's YAML keeps its active overrides. Only status
-- and the ended_* columns ever change, once, from active.
CREATE TABLE overrides (
    id                bigserial   PRIMARY KEY,
    domain            text        NOT NULL,
    entries           jsonb       NOT NULL,
    -- entries_key is the entries in one canonical text: one active override
    -- per request descriptor.
    entries_key       text        NOT NULL,
    unit              text        NOT NULL,
    requests_per_unit bigint      NOT NULL CHECK (requests_per_unit >= 0),
    expires_at        timestamptz NOT NULL,
    message           text        NOT NULL,
    author            text        NOT NULL,
    created_at        timestamptz NOT NULL DEFAULT now(),
    version           bigint      NOT NULL,
    urgent            boolean     NOT NULL DEFAULT false,
    change_id         bigint      REFERENCES change_requests (id),
    status            text        NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'expired', 'ended')),
    ended_version     bigint,
    ended_at          timestamptz,
    ended_by          text        NOT NULL DEFAULT '',
    end_message       text        NOT NULL DEFAULT '',
    CHECK ((status = 'active') = (ended_version IS NULL)),
    CHECK (ended_version IS NULL OR ended_version > version)
);
CREATE UNIQUE INDEX overrides_one_active ON overrides (domain, entries_key) WHERE status = 'active';
CREATE INDEX overrides_due ON overrides (expires_at) WHERE status = 'active';
CREATE INDEX overrides_domain ON overrides (domain, id);
CREATE INDEX overrides_versions ON overrides (version, ended_version);

-- enforced_domains keeps, for each version and each domain that had
-- overrides in it, the YAML nodes were sent: the domain's YAML with its
-- overrides section, as composed when the version was written. Reading a
-- version never composes it again, so its checksum holds whatever a later
-- console would write.
CREATE TABLE enforced_domains (
    version bigint NOT NULL,
    domain  text   NOT NULL,
    yaml    text   NOT NULL,
    PRIMARY KEY (version, domain)
);
CREATE TRIGGER enforced_domains_no_update BEFORE UPDATE OR DELETE ON enforced_domains
    FOR EACH ROW EXECUTE FUNCTION refuse_change();

-- A change request of kind override publishes the override it carries (the
-- JSON of an OverrideRequest) when approved.
ALTER TABLE change_requests ADD COLUMN override jsonb;
ALTER TABLE change_requests DROP CONSTRAINT change_requests_kind_check;
ALTER TABLE change_requests ADD CONSTRAINT change_requests_kind_check
    CHECK (kind IN ('publish', 'delete', 'domain_rollback', 'rollback', 'ruleset', 'override'));
ALTER TABLE change_requests ADD CONSTRAINT change_requests_override_check
    CHECK ((kind = 'override') = (override IS NOT NULL));

-- +goose Down
SELECT 'forward-only';
