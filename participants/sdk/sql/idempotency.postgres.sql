-- idem participant Idempotency-Key records, PostgreSQL (seed §7, §8).
-- One row per (scope, idem_key): scope is "<tenant>:<operation>", so one tenant's key never
-- answers another's request. The UNIQUE key is what grants the right to act (insert if
-- absent);
-- status is PROCESSING | SUCCEEDED | FAILED_RETRYABLE | FAILED_FINAL | UNKNOWN (the handler
-- may have acted and nobody knows yet: settled through the service's fact source, never
-- re-run blindly), and every write after the claim names owner_token in its WHERE, so a
-- stale owner cannot overwrite. Times are Unix milliseconds on the database's clock (on
-- the store's `Clock` when it is given one, in tests).
CREATE TABLE IF NOT EXISTS idem_idempotency (
    id BIGSERIAL PRIMARY KEY,
    scope VARCHAR(128) NOT NULL,
    idem_key VARCHAR(128) NOT NULL,
    request_hash VARCHAR(64) NOT NULL,
    status VARCHAR(24) NOT NULL,
    owner_token VARCHAR(32) NOT NULL,
    lease_until_ms BIGINT NULL,
    result_status BIGINT NULL,
    result_headers TEXT NULL,
    -- The stored answer's body: text when it is UTF-8 without NUL (readable, and what an SDK
    -- older than result_bytes replays), result_bytes otherwise; never both.
    result_body TEXT NULL,
    result_bytes BYTEA NULL,
    resource_id VARCHAR(128) NULL,
    attempts BIGINT NOT NULL DEFAULT 1,
    version BIGINT NOT NULL DEFAULT 1,
    created_at_ms BIGINT NOT NULL,
    updated_at_ms BIGINT NOT NULL,
    UNIQUE (scope, idem_key)
);
-- The settler's scan (UNKNOWN rows, PROCESSING rows whose lease ran out) and the PROCESSING gauges.
CREATE INDEX IF NOT EXISTS idem_idempotency_lease ON idem_idempotency (status, lease_until_ms);
-- Retention deletes terminal rows by age.
CREATE INDEX IF NOT EXISTS idem_idempotency_updated ON idem_idempotency (updated_at_ms);
