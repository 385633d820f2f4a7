-- Forward step of idem_idempotency (MySQL / MariaDB), run by `create_idempotency_tables`
-- after the CREATE: a table made by an SDK before non-UTF-8 bodies were stored gains their
-- column. MySQL has no ADD COLUMN IF NOT EXISTS: error 1060 (duplicate column) is taken as
-- done. A nullable column: InnoDB adds it in place.
ALTER TABLE idem_idempotency ADD COLUMN result_bytes MEDIUMBLOB NULL;
