-- Forward step of idem_idempotency (PostgreSQL), run by `create_idempotency_tables` after
-- the CREATE: a table made by an SDK before non-UTF-8 bodies were stored gains their
-- column. Nullable without a default: adding it rewrites no row. Safe to run again.
ALTER TABLE idem_idempotency ADD COLUMN IF NOT EXISTS result_bytes BYTEA;
