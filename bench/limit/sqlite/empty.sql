-- The SQL idem runs for one `empty` global transaction on SQLite (the coordinator alone).
-- Run by `idem-lab bench --backend sqlite --workload empty --limit` (see bench/limit/README.md).
\set r random(1, 1000000000000)
\set now random(1800000000000, 1800000000000000)
-- coordinator: create the saga with its branch operations
BEGIN IMMEDIATE;
INSERT INTO idem_global (gid, kind, status, stalled_from, request_hash, options, timeout_at, attempts, next_attempt_at, last_error, reason, owner_token, lease_until, version, created_at, updated_at, finished_at) VALUES ('lim-' || :client_id || '-' || :r, 'saga', 'running', NULL, '0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef', '{"request_timeout_ms": 5000, "retry_interval_ms": 1000, "max_retry_interval_ms": 60000, "max_attempts": 12, "timeout_ms": null, "protocol": "native", "branch_headers": {}, "concurrent": false, "orders": {}}', NULL, 0, :now, NULL, NULL, 'bench:0123456789abcdef0123456789abcdef', :now + 15000, 0, :now, :now, NULL);
INSERT INTO idem_branch (gid, branch_id, action, seq, url, payload, status, attempts, next_attempt_at, last_error, in_progress_since, updated_at, finished_at) VALUES
  ('lim-' || :client_id || '-' || :r, '01', 'action', 0, 'http://127.0.0.1:40000/empty', '{"sku": "sku-1", "quantity": 1}', 'pending', 0, NULL, NULL, NULL, :now, NULL),
  ('lim-' || :client_id || '-' || :r, '01', 'compensate', 0, 'http://127.0.0.1:40000/empty', '{"sku": "sku-1", "quantity": 1}', 'pending', 0, NULL, NULL, NULL, :now, NULL),
  ('lim-' || :client_id || '-' || :r, '02', 'action', 1, 'http://127.0.0.1:40000/empty', '{"account": "acct-1", "amount": 1}', 'pending', 0, NULL, NULL, NULL, :now, NULL),
  ('lim-' || :client_id || '-' || :r, '02', 'compensate', 1, 'http://127.0.0.1:40000/empty', '{"account": "acct-1", "amount": 1}', 'pending', 0, NULL, NULL, NULL, :now, NULL);
COMMIT;
-- coordinator: step 01 answered, stored before step 02 is sent
BEGIN IMMEDIATE;
UPDATE idem_global SET status = 'running', stalled_from = NULL, attempts = 0, next_attempt_at = :now + 1, last_error = NULL, reason = NULL, timeout_at = NULL, updated_at = :now + 1, finished_at = NULL, owner_token = 'bench:0123456789abcdef0123456789abcdef', lease_until = :now + 15001, version = version + 1 WHERE gid = 'lim-' || :client_id || '-' || :r AND status = 'running' AND owner_token = 'bench:0123456789abcdef0123456789abcdef';
UPDATE idem_branch SET status = 'succeeded', attempts = 1, next_attempt_at = NULL, last_error = NULL, in_progress_since = NULL, updated_at = :now + 1, finished_at = :now + 1 WHERE gid = 'lim-' || :client_id || '-' || :r AND action = 'action' AND branch_id IN ('01');
COMMIT;
-- coordinator: step 02 answered, the saga succeeded
BEGIN IMMEDIATE;
UPDATE idem_global SET status = 'succeeded', stalled_from = NULL, attempts = 0, next_attempt_at = NULL, last_error = NULL, reason = NULL, timeout_at = NULL, updated_at = :now + 2, finished_at = :now + 2, owner_token = NULL, lease_until = NULL, version = version + 1 WHERE gid = 'lim-' || :client_id || '-' || :r AND status = 'running' AND owner_token = 'bench:0123456789abcdef0123456789abcdef';
UPDATE idem_branch SET status = 'succeeded', attempts = 1, next_attempt_at = NULL, last_error = NULL, in_progress_since = NULL, updated_at = :now + 2, finished_at = :now + 2 WHERE gid = 'lim-' || :client_id || '-' || :r AND action = 'action' AND branch_id IN ('02');
COMMIT;
