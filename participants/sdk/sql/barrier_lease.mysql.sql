-- Upgrade of a barrier table created before lease mode (MySQL / MariaDB). MySQL has no
-- ADD COLUMN IF NOT EXISTS: `upgrade_barrier_table_for_lease` treats error 1060 (duplicate
-- column) as "already there", so the script is safe to run again through it.
-- Nullable columns: InnoDB adds them in place, and ordinary-mode rows never use them.
ALTER TABLE idem_barrier ADD COLUMN owner_token VARCHAR(32) NULL;
ALTER TABLE idem_barrier ADD COLUMN lease_until_ms BIGINT NULL;
