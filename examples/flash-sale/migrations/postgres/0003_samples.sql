-- What each instance answered, second by second, for the operator's plots: one row per
-- instance and second, written by that instance alone. Counts are for the span of `ms`
-- milliseconds that ends at `at_ms`; the lock waits are in microseconds, NULL when no request
-- got its locks in that span. Rows older than ten minutes are deleted by any instance.
CREATE TABLE samples (
    instance TEXT NOT NULL,
    at_ms BIGINT NOT NULL,
    ms BIGINT NOT NULL,
    requests BIGINT NOT NULL,
    purchases BIGINT NOT NULL,
    checkouts BIGINT NOT NULL,
    conflicts BIGINT NOT NULL,
    locked BIGINT NOT NULL,
    handovers BIGINT NOT NULL,
    stale_refused BIGINT NOT NULL,
    wait_p50_us BIGINT,
    wait_p99_us BIGINT,
    PRIMARY KEY (instance, at_ms)
);

CREATE INDEX samples_by_time ON samples (at_ms);
