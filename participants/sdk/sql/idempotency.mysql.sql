-- idem participant Idempotency-Key records, MySQL / MariaDB (InnoDB) (seed §7, §8).
-- One row per (scope, idem_key): scope is "<tenant>:<operation>", so one tenant's key never
-- answers another's request. The UNIQUE key is what grants the right to act (a plain INSERT;
-- error 1062 means the record exists); status is PROCESSING | SUCCEEDED | FAILED_RETRYABLE |
-- FAILED_FINAL and every write after the claim names owner_token in its WHERE, so a stale
-- owner cannot overwrite. Times are Unix milliseconds from the service's clock.
-- utf8mb4_bin: keys compare byte for byte, as on PostgreSQL and SQLite ("A1" is not "a1").
-- MEDIUMTEXT: TEXT stops at 64 KiB, below what a configured result bound may allow.
CREATE TABLE IF NOT EXISTS idem_idempotency (
    id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
    scope VARCHAR(128) NOT NULL,
    idem_key VARCHAR(128) NOT NULL,
    request_hash VARCHAR(64) NOT NULL,
    status VARCHAR(24) NOT NULL,
    owner_token VARCHAR(32) NOT NULL,
    lease_until_ms BIGINT NULL,
    result_status BIGINT NULL,
    result_headers MEDIUMTEXT NULL,
    result_body MEDIUMTEXT NULL,
    resource_id VARCHAR(128) NULL,
    attempts BIGINT NOT NULL DEFAULT 1,
    version BIGINT NOT NULL DEFAULT 1,
    created_at_ms BIGINT NOT NULL,
    updated_at_ms BIGINT NOT NULL,
    UNIQUE KEY idem_idempotency_uniq (scope, idem_key),
    -- The recovery scan (PROCESSING rows whose lease ran out) and the stuck-PROCESSING metric.
    KEY idem_idempotency_lease (status, lease_until_ms),
    -- Retention deletes terminal rows by age.
    KEY idem_idempotency_updated (updated_at_ms)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
