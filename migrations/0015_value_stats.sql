-- +goose Up

-- One descriptor value's 429s per minute, per rule: the support desk's
-- history of a customer. Once a minute is over, each console replica adds
-- the limited counts of the values its nodes named for each rule, at most
-- the 1,000 most limited of the rule-minute (ON CONFLICT adds), so a
-- rule-minute holds at most 1,000 rows per replica that counted it.
-- Kept 48 hours (pruned with the other rollups).
CREATE TABLE value_minutes (
    domain  text        NOT NULL,
    value   text        COLLATE "C" NOT NULL,   -- "C": a prefix search uses the key
    minute  timestamptz NOT NULL,
    rule    text        NOT NULL,
    limited bigint      NOT NULL CHECK (limited > 0),
    -- How many of the rule-minute's lossy writes (value_minute_gaps.lossy)
    -- counted this value completely: the figure is exact when every one
    -- did.
    sure    integer     NOT NULL DEFAULT 0,
    PRIMARY KEY (domain, value, minute, rule)
);
CREATE INDEX value_minutes_minute ON value_minutes (minute);

-- The rule-minutes whose per-value figures are not all exact: lossy counts
-- the replica writes that left some of the rule's limited requests without
-- their value (a node that did not name them, values beyond the console's
-- bounds), untracked how many requests those were. A value without a row
-- in such a minute may still have been limited (up to untracked times).
CREATE TABLE value_minute_gaps (
    domain    text        NOT NULL,
    minute    timestamptz NOT NULL,
    rule      text        NOT NULL,
    lossy     integer     NOT NULL CHECK (lossy > 0),
    untracked bigint      NOT NULL CHECK (untracked > 0),
    PRIMARY KEY (domain, minute, rule)
);
CREATE INDEX value_minute_gaps_minute ON value_minute_gaps (minute);

-- The Customers page's autocomplete looks quota users up by prefix.
CREATE INDEX quota_usage_value_prefix ON quota_usage (domain, value text_pattern_ops);

-- +goose Down
DROP INDEX quota_usage_value_prefix;
DROP TABLE value_minute_gaps;
DROP TABLE value_minutes;
