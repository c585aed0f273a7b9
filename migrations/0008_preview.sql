-- +goose Up

-- The impact preview's traffic: per rule and span (a minute), histograms of
-- per-value hit counts reported by the nodes (wire.RulePreview). Each
-- console replica writes what its own nodes reported, merged, a few times a
-- minute; a preview sums every row of a rule's spans, so the figures are
-- fleet-wide. Rows are kept for about an hour (what a preview replays).
-- Unlogged, as stats_frames: a cache the nodes refill within the hour.
CREATE UNLOGGED TABLE preview_spans (
    id         bigserial   PRIMARY KEY,
    domain     text        NOT NULL,
    rule       text        NOT NULL,
    t          bigint      NOT NULL,            -- the span's start (Unix time)
    span_s     integer     NOT NULL,
    payload    json        NOT NULL,            -- {"requests","limited","untracked","sec","peak","span"}
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX preview_spans_rule ON preview_spans (domain, rule, t);
CREATE INDEX preview_spans_t ON preview_spans (t);

-- +goose Down
SELECT 'forward-only';
