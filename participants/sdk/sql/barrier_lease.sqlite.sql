-- Upgrade of a barrier table created before lease mode (SQLite). SQLite has no
-- ADD COLUMN IF NOT EXISTS: `upgrade_barrier_table_for_lease` treats "duplicate column
-- name" as "already there", so the script is safe to run again through it.
ALTER TABLE idem_barrier ADD COLUMN owner_token TEXT;
ALTER TABLE idem_barrier ADD COLUMN lease_until_ms INTEGER;
