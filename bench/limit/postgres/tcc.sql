-- The SQL idem, the inventory and the payment participants run for one `tcc` global
-- transaction on PostgreSQL (2 branches: create with branches, two Trys, submit, two
-- Confirms), grouped into the same commits: 21 statements, 7 commits.
-- pgbench -n -M prepared -c 32 -j 2 -T 20 -f bench/limit/postgres/tcc.sql <db>
\set r random(1, 1000000000000)
\set sku random(0, 999)
\set acct random(0, 999)
\set now random(1800000000000, 1800000000000000)
-- coordinator: create the TCC with both branches registered (one statement)
WITH g AS (INSERT INTO idem_global (gid, kind, status, stalled_from, request_hash, options, timeout_at, attempts, next_attempt_at, last_error, reason, owner_token, lease_until, version, created_at, updated_at, finished_at)
  VALUES ('lim-' || :client_id || '-' || :r, 'tcc', 'prepared', NULL, '0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef', '{"request_timeout_ms": 5000,"retry_interval_ms": 1000,"max_retry_interval_ms": 60000,"max_attempts": 12,"timeout_ms": 60000,"protocol": "native","branch_headers": {},"concurrent": false,"orders": {}}', (:now)::bigint + 60000, 0, (:now)::bigint + 60000, NULL, NULL, NULL, NULL, 0, (:now)::bigint, (:now)::bigint, NULL)
  ON CONFLICT DO NOTHING RETURNING gid),
b AS (INSERT INTO idem_branch (gid, branch_id, action, seq, url, payload, status, attempts, next_attempt_at, last_error, in_progress_since, updated_at, finished_at)
  SELECT g.gid, v.* FROM g, (VALUES
    ('01'::varchar, 'cancel'::varchar, 0::int, 'http://127.0.0.1:40001/inventory/reserve'::text, '{"sku": "sku-1","quantity": 1}'::text, 'pending'::varchar, 0::int, NULL::bigint, NULL::text, NULL::bigint, (:now)::bigint, NULL::bigint),
    ('01', 'confirm', 0, 'http://127.0.0.1:40001/inventory/reserve', '{"sku": "sku-1","quantity": 1}', 'pending', 0, NULL, NULL, NULL, (:now)::bigint, NULL),
    ('02', 'cancel', 0, 'http://127.0.0.1:40002/payment/freeze', '{"account": "acct-1","amount": 1}', 'pending', 0, NULL, NULL, NULL, (:now)::bigint, NULL),
    ('02', 'confirm', 0, 'http://127.0.0.1:40002/payment/freeze', '{"account": "acct-1","amount": 1}', 'pending', 0, NULL, NULL, NULL, (:now)::bigint, NULL))
    AS v(branch_id, action, seq, url, payload, status, attempts, next_attempt_at, last_error, in_progress_since, updated_at, finished_at))
SELECT count(*) FROM g;
-- inventory: Try
BEGIN;
INSERT INTO idem_barrier (trans_type, gid, branch_id, op, barrier_id, reason, outcome) VALUES ('tcc', 'lim-' || :client_id || '-' || :r, '01', 'try', '01', 'try', 'guard') ON CONFLICT (gid, branch_id, op, barrier_id) DO NOTHING;
UPDATE inventory_stock SET available = available - 1, reserved = reserved + 1 WHERE sku = 'sku-' || :sku AND available >= 1;
INSERT INTO inventory_reservations (gid, branch_id, sku, quantity, status) VALUES ('lim-' || :client_id || '-' || :r, '01', 'sku-' || :sku, 1, 'reserved');
UPDATE idem_barrier SET outcome = 'executed', result = '{"gid": "lim","branch_id": "01","sku": "sku-1","quantity": 1,"status": "reserved"}' WHERE gid = 'lim-' || :client_id || '-' || :r AND branch_id = '01' AND op = 'try' AND barrier_id = '01';
COMMIT;
-- payment: Try
BEGIN;
INSERT INTO idem_barrier (trans_type, gid, branch_id, op, barrier_id, reason, outcome) VALUES ('tcc', 'lim-' || :client_id || '-' || :r, '02', 'try', '01', 'try', 'guard') ON CONFLICT (gid, branch_id, op, barrier_id) DO NOTHING;
UPDATE payment_accounts SET frozen = frozen + 1 WHERE account = 'acct-' || :acct AND balance - frozen >= 1;
INSERT INTO payment_ledger (gid, branch_id, account, amount, status) VALUES ('lim-' || :client_id || '-' || :r, '02', 'acct-' || :acct, 1, 'frozen');
UPDATE idem_barrier SET outcome = 'executed', result = '{"gid": "lim","branch_id": "02","account": "acct-1","amount": 1,"status": "frozen"}' WHERE gid = 'lim-' || :client_id || '-' || :r AND branch_id = '02' AND op = 'try' AND barrier_id = '01';
COMMIT;
-- coordinator: the commit decision (one statement, durable before any Confirm)
WITH g AS (UPDATE idem_global SET status = 'committing', stalled_from = NULL, attempts = 0, next_attempt_at = (:now)::bigint + 1, last_error = NULL, reason = NULL, timeout_at = (:now)::bigint + 60000, updated_at = (:now)::bigint + 1, finished_at = NULL, owner_token = 'bench:0123456789abcdef0123456789abcdef', lease_until = (:now)::bigint + 15001, version = version + 1
  WHERE gid = 'lim-' || :client_id || '-' || :r AND (CASE WHEN status = 'prepared' AND version = 0 THEN TRUE ELSE FALSE END) RETURNING gid)
SELECT count(*) FROM g;
-- inventory: Confirm
BEGIN;
INSERT INTO idem_barrier (trans_type, gid, branch_id, op, barrier_id, reason, outcome) VALUES ('tcc', 'lim-' || :client_id || '-' || :r, '01', 'confirm', '01', 'confirm', 'guard') ON CONFLICT (gid, branch_id, op, barrier_id) DO NOTHING;
UPDATE inventory_reservations SET status = 'confirmed', updated_at = CURRENT_TIMESTAMP WHERE gid = 'lim-' || :client_id || '-' || :r AND branch_id = '01' AND status = 'reserved';
SELECT gid, branch_id, sku, quantity, status FROM inventory_reservations WHERE gid = 'lim-' || :client_id || '-' || :r AND branch_id = '01';
UPDATE inventory_stock SET reserved = reserved - 1, sold = sold + 1 WHERE sku = 'sku-' || :sku;
UPDATE idem_barrier SET outcome = 'executed', result = '{"gid": "lim","branch_id": "01","sku": "sku-1","quantity": 1,"status": "confirmed"}' WHERE gid = 'lim-' || :client_id || '-' || :r AND branch_id = '01' AND op = 'confirm' AND barrier_id = '01';
COMMIT;
-- payment: Confirm
BEGIN;
INSERT INTO idem_barrier (trans_type, gid, branch_id, op, barrier_id, reason, outcome) VALUES ('tcc', 'lim-' || :client_id || '-' || :r, '02', 'confirm', '01', 'confirm', 'guard') ON CONFLICT (gid, branch_id, op, barrier_id) DO NOTHING;
UPDATE payment_ledger SET status = 'debited', updated_at = CURRENT_TIMESTAMP WHERE gid = 'lim-' || :client_id || '-' || :r AND branch_id = '02' AND status = 'frozen';
SELECT gid, branch_id, account, amount, status FROM payment_ledger WHERE gid = 'lim-' || :client_id || '-' || :r AND branch_id = '02';
UPDATE payment_accounts SET balance = balance - 1, frozen = frozen - 1 WHERE account = 'acct-' || :acct;
UPDATE idem_barrier SET outcome = 'executed', result = '{"gid": "lim","branch_id": "02","account": "acct-1","amount": 1,"status": "debited"}' WHERE gid = 'lim-' || :client_id || '-' || :r AND branch_id = '02' AND op = 'confirm' AND barrier_id = '01';
COMMIT;
-- coordinator: both Confirms answered, the transaction succeeded (stored durably)
WITH g AS (UPDATE idem_global SET status = 'succeeded', stalled_from = NULL, attempts = 0, next_attempt_at = NULL, last_error = NULL, reason = NULL, timeout_at = (:now)::bigint + 60000, updated_at = (:now)::bigint + 2, finished_at = (:now)::bigint + 2, owner_token = NULL, lease_until = NULL, version = version + 1
  WHERE gid = 'lim-' || :client_id || '-' || :r AND (CASE WHEN status = 'committing' AND owner_token = 'bench:0123456789abcdef0123456789abcdef' THEN TRUE ELSE FALSE END) RETURNING gid),
b0 AS (UPDATE idem_branch SET status = 'succeeded', attempts = 1, next_attempt_at = NULL, last_error = NULL, in_progress_since = NULL, updated_at = (:now)::bigint + 2, finished_at = (:now)::bigint + 2
  WHERE idem_branch.gid = 'lim-' || :client_id || '-' || :r AND EXISTS (SELECT 1 FROM g) AND idem_branch.action = 'confirm' AND idem_branch.branch_id IN ('01', '02'))
SELECT count(*) FROM g;
