-- Forward step of idem_idempotency (SQLite), run by `create_idempotency_tables` after the
-- CREATE: a table made by an SDK before non-UTF-8 bodies were stored gains their column.
-- SQLite has no ADD COLUMN IF NOT EXISTS: "duplicate column name" is taken as done.
ALTER TABLE idem_idempotency ADD COLUMN result_bytes BLOB;
