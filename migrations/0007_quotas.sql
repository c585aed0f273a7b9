-- +goose Up

-- Quota usage for billing (issue 19): the hits each calendar fixed_window
-- limit admitted per descriptor value and UTC calendar period, summed over
-- every enforcer. Nodes send their usage in batches; each batch adds to
-- these rows (ON CONFLICT adds) in one transaction with its entry in
-- quota_batches.
CREATE TABLE quota_usage (
    domain       text        NOT NULL,
    rule         text        NOT NULL,
    unit         text        NOT NULL CHECK (unit IN ('day', 'week', 'month', 'year')),
    period_start timestamptz NOT NULL,
    value        text        NOT NULL,
    period_end   timestamptz NOT NULL,
    used         bigint      NOT NULL CHECK (used >= 0),
    quota_limit  bigint      NOT NULL,           -- requests_per_unit when last counted
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (domain, rule, unit, period_start, value)
);
-- Top consumers of a rule and period; of a period across domains; the
-- current periods (a query without a period).
CREATE INDEX quota_usage_top ON quota_usage (domain, rule, unit, period_start, used DESC, value);
CREATE INDEX quota_usage_period ON quota_usage (unit, period_start, used DESC);
CREATE INDEX quota_usage_current ON quota_usage (period_end);

-- The last batch applied per node process (epoch): a batch whose seq is
-- not above it is a resend after a lost ack and adds nothing.
CREATE TABLE quota_batches (
    node_id    text        NOT NULL,
    epoch      text        NOT NULL,
    last_seq   bigint      NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (node_id, epoch)
);
CREATE INDEX quota_batches_updated ON quota_batches (updated_at);

-- +goose Down
SELECT 'forward-only';
