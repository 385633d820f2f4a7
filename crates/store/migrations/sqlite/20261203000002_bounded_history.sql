-- Issue 28, point 5: a call budget per transaction and a bounded history.
-- `calls`: calls idem made by itself since creation or the last operator's retry (the
-- budget counts them). `history`: records of calls that did not simply succeed, made in
-- all; `history_dropped`: the oldest of them deleted (numbers 1 to it). Each record has
-- its number in the transaction's history, so the newest are kept by deleting a prefix and
-- a page of them is read by number.
ALTER TABLE idem_global ADD COLUMN calls INTEGER NOT NULL DEFAULT 0;
ALTER TABLE idem_global ADD COLUMN history INTEGER NOT NULL DEFAULT 0;
ALTER TABLE idem_global ADD COLUMN history_dropped INTEGER NOT NULL DEFAULT 0;
ALTER TABLE idem_attempt ADD COLUMN number INTEGER NOT NULL DEFAULT 0;
UPDATE idem_attempt SET number = r.n
  FROM (SELECT id, row_number() OVER (PARTITION BY gid ORDER BY id) AS n FROM idem_attempt) AS r
 WHERE idem_attempt.id = r.id;
UPDATE idem_global SET history = c.n
  FROM (SELECT gid, count(*) AS n FROM idem_attempt GROUP BY gid) AS c
 WHERE idem_global.gid = c.gid;
DROP INDEX idem_attempt_gid;
CREATE UNIQUE INDEX idem_attempt_number ON idem_attempt (gid, number);
