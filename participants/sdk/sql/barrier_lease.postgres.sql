-- Upgrade of a barrier table created before lease mode (PostgreSQL). Safe to run again.
-- Nullable columns without a default: adding them rewrites nothing, and rows of steps run
-- in the ordinary mode never use them.
ALTER TABLE idem_barrier ADD COLUMN IF NOT EXISTS owner_token VARCHAR(32);
ALTER TABLE idem_barrier ADD COLUMN IF NOT EXISTS lease_until_ms BIGINT;
