-- Issue 30, point 1: upgrades in both directions. One row per migration from this one on:
-- `oldest_binary` is the oldest idem that may still run on a schema with the migration applied
-- (an additive migration names the first idem that reads this table, so every binary that
-- can check runs on), `applied_by` the idem that applied it. A binary that finds migrations
-- it does not know starts only if each has a row here and none names a newer oldest binary.
-- Every migration after this one inserts its own row (tests/it/upgrades.rs checks the files).
CREATE TABLE idem_schema_compat (
    version       BIGINT      PRIMARY KEY,
    oldest_binary VARCHAR(32) NOT NULL,
    applied_by    VARCHAR(32)
);
INSERT INTO idem_schema_compat (version, oldest_binary) VALUES (20261204000001, '0.1.0');
