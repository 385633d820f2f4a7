-- Upgrade of a barrier table made before tenants (MySQL / MariaDB), after
-- barrier_lease.mysql.sql. Its rows become the default tenant's (the tenant of every call
-- before tenants existed), and the unique key gains the tenant, so two tenants' same gid no
-- longer share a row. One ALTER, so InnoDB applies all of it or none; a second run fails
-- (duplicate column), which `upgrade_barrier_table` takes as done once it has read the
-- table's shape. An older SDK still inserts the default tenant's rows but reads and updates
-- them without the tenant, so it must not serve calls of other tenants: upgrade every
-- replica's SDK together.
ALTER TABLE idem_barrier
    ADD COLUMN tenant VARCHAR(32) NOT NULL DEFAULT 'default' AFTER trans_type,
    DROP INDEX idem_barrier_uniq,
    ADD UNIQUE KEY idem_barrier_tenant_uniq (tenant, gid, branch_id, op, barrier_id);
