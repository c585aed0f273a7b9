-- +goose Up

-- Live traffic. Each console replica sums the stats reports of its own
-- nodes per second and writes one frame per second here, so that every
-- replica can answer for the whole fleet: a replica reads the frames of the
-- others (and, when it starts, of the last 15 minutes). Frames are kept
-- for about 20 minutes; the table is unlogged because it is a cache of the
-- last minutes, rebuilt by the nodes' next reports after a crash.
CREATE UNLOGGED TABLE stats_frames (
    id         bigserial   PRIMARY KEY,
    replica    text        NOT NULL,
    t          bigint      NOT NULL,            -- the second (Unix time) it counts
    payload    jsonb       NOT NULL,            -- [{"d","r","a","l","s","e","top":[["value",n],...]}]
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX stats_frames_created ON stats_frames (created_at);

-- Per-minute rollups. Each replica adds its own nodes' counts for a minute
-- once the minute is over (ON CONFLICT adds), so the rows are the exact
-- fleet-wide sums, never counted twice.
CREATE TABLE stats_minutes (
    minute         timestamptz NOT NULL,
    domain         text        NOT NULL,
    rule           text        NOT NULL,
    allowed        bigint      NOT NULL DEFAULT 0,
    limited        bigint      NOT NULL DEFAULT 0,
    shadow_limited bigint      NOT NULL DEFAULT 0,
    store_errors   bigint      NOT NULL DEFAULT 0,
    PRIMARY KEY (domain, rule, minute)
);
CREATE INDEX stats_minutes_minute ON stats_minutes (minute);

-- Spikes of a rule's 429s, found by the leading replica.
CREATE TABLE stats_spikes (
    id                 bigserial        PRIMARY KEY,
    domain             text             NOT NULL,
    rule               text             NOT NULL,
    started_at         timestamptz      NOT NULL,
    ended_at           timestamptz,
    peak_limited_per_s double precision NOT NULL,
    baseline_per_s     double precision NOT NULL,
    updated_at         timestamptz      NOT NULL DEFAULT now()
);
CREATE INDEX stats_spikes_started ON stats_spikes (started_at);
CREATE INDEX stats_spikes_updated ON stats_spikes (updated_at);
CREATE UNIQUE INDEX stats_spikes_open ON stats_spikes (domain, rule) WHERE ended_at IS NULL;

-- Alert settings (webhooks, spike thresholds, per-domain masking) in one
-- row, and the key that masks descriptor values for viewers.
CREATE TABLE stats_settings (
    id         boolean     PRIMARY KEY DEFAULT true CHECK (id),
    config     jsonb       NOT NULL DEFAULT '{}',
    mask_key   bytea,
    updated_at timestamptz NOT NULL DEFAULT now(),
    updated_by text        NOT NULL DEFAULT ''
);
INSERT INTO stats_settings (id) VALUES (true);

-- Webhook deliveries: one row per target and event, retried with backoff
-- by the leading replica.
CREATE TABLE alert_deliveries (
    id              bigserial   PRIMARY KEY,
    event           text        NOT NULL,
    url             text        NOT NULL,
    domain          text        NOT NULL DEFAULT '',
    rule            text        NOT NULL DEFAULT '',
    payload         jsonb       NOT NULL,
    status          text        NOT NULL DEFAULT 'pending',  -- pending | delivered | failed
    attempts        integer     NOT NULL DEFAULT 0,
    last_error      text        NOT NULL DEFAULT '',
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    created_at      timestamptz NOT NULL DEFAULT now(),
    delivered_at    timestamptz
);
CREATE INDEX alert_deliveries_pending ON alert_deliveries (next_attempt_at) WHERE status = 'pending';
CREATE INDEX alert_deliveries_created ON alert_deliveries (created_at);

-- +goose Down
SELECT 'forward-only';
