-- The SQL idem runs for one `empty` global transaction (a 2-step saga whose participant
-- does no SQL) on PostgreSQL: the coordinator's three statements, nothing else.
-- pgbench -n -M prepared -c 32 -j 2 -T 20 -f bench/limit/postgres/empty.sql <db>
\set r random(1, 1000000000000)
\set now random(1800000000000, 1800000000000000)
-- 1. create the saga with its four branch operations (one statement, durable)
WITH g AS (INSERT INTO idem_global (gid, kind, status, stalled_from, request_hash, options, timeout_at, attempts, next_attempt_at, last_error, reason, owner_token, lease_until, version, created_at, updated_at, finished_at)
  VALUES ('lim-' || :client_id || '-' || :r, 'saga', 'running', NULL, '0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef', '{"request_timeout_ms": 5000,"retry_interval_ms": 1000,"max_retry_interval_ms": 60000,"max_attempts": 12,"timeout_ms": null,"protocol": "native","branch_headers": {},"concurrent": false,"orders": {}}', NULL, 0, (:now)::bigint, NULL, NULL, 'bench:0123456789abcdef0123456789abcdef', (:now)::bigint + 15000, 0, (:now)::bigint, (:now)::bigint, NULL)
  ON CONFLICT DO NOTHING RETURNING gid),
b AS (INSERT INTO idem_branch (gid, branch_id, action, seq, url, payload, status, attempts, next_attempt_at, last_error, in_progress_since, updated_at, finished_at)
  SELECT g.gid, v.* FROM g, (VALUES
    ('01'::varchar, 'action'::varchar, 0::int, 'http://127.0.0.1:40000/empty'::text, '{"sku": "sku-1","quantity": 1}'::text, 'pending'::varchar, 0::int, NULL::bigint, NULL::text, NULL::bigint, (:now)::bigint, NULL::bigint),
    ('01', 'compensate', 0, 'http://127.0.0.1:40000/empty', '{"sku": "sku-1","quantity": 1}', 'pending', 0, NULL, NULL, NULL, (:now)::bigint, NULL),
    ('02', 'action', 1, 'http://127.0.0.1:40000/empty', '{"account": "acct-1","amount": 1}', 'pending', 0, NULL, NULL, NULL, (:now)::bigint, NULL),
    ('02', 'compensate', 1, 'http://127.0.0.1:40000/empty', '{"account": "acct-1","amount": 1}', 'pending', 0, NULL, NULL, NULL, (:now)::bigint, NULL))
    AS v(branch_id, action, seq, url, payload, status, attempts, next_attempt_at, last_error, in_progress_since, updated_at, finished_at))
SELECT count(*) FROM g;
-- 2. step 01 answered: stored before step 02 is sent (durable)
WITH g AS (UPDATE idem_global SET status = 'running', stalled_from = NULL, attempts = 0, next_attempt_at = (:now)::bigint + 1, last_error = NULL, reason = NULL, timeout_at = NULL, updated_at = (:now)::bigint + 1, finished_at = NULL, owner_token = 'bench:0123456789abcdef0123456789abcdef', lease_until = (:now)::bigint + 15001, version = version + 1
  WHERE gid = 'lim-' || :client_id || '-' || :r AND (CASE WHEN status = 'running' AND owner_token = 'bench:0123456789abcdef0123456789abcdef' THEN TRUE ELSE FALSE END) RETURNING gid),
b0 AS (UPDATE idem_branch SET status = 'succeeded', attempts = 1, next_attempt_at = NULL, last_error = NULL, in_progress_since = NULL, updated_at = (:now)::bigint + 1, finished_at = (:now)::bigint + 1
  WHERE idem_branch.gid = 'lim-' || :client_id || '-' || :r AND EXISTS (SELECT 1 FROM g) AND idem_branch.action = 'action' AND idem_branch.branch_id IN ('01'))
SELECT count(*) FROM g;
-- 3. step 02 answered, the saga succeeded: stored durably like every other write (an
--    outcome reported to a client must survive a database crash)
WITH g AS (UPDATE idem_global SET status = 'succeeded', stalled_from = NULL, attempts = 0, next_attempt_at = NULL, last_error = NULL, reason = NULL, timeout_at = NULL, updated_at = (:now)::bigint + 2, finished_at = (:now)::bigint + 2, owner_token = NULL, lease_until = NULL, version = version + 1
  WHERE gid = 'lim-' || :client_id || '-' || :r AND (CASE WHEN status = 'running' AND owner_token = 'bench:0123456789abcdef0123456789abcdef' THEN TRUE ELSE FALSE END) RETURNING gid),
b0 AS (UPDATE idem_branch SET status = 'succeeded', attempts = 1, next_attempt_at = NULL, last_error = NULL, in_progress_since = NULL, updated_at = (:now)::bigint + 2, finished_at = (:now)::bigint + 2
  WHERE idem_branch.gid = 'lim-' || :client_id || '-' || :r AND EXISTS (SELECT 1 FROM g) AND idem_branch.action = 'action' AND idem_branch.branch_id IN ('02'))
SELECT count(*) FROM g;
