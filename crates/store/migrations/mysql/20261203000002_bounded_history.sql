-- Issue 28, point 5: a call budget per transaction and a bounded history.
-- `calls`: calls idem made by itself since creation or the last operator's retry (the
-- budget counts them). `history`: records of calls that did not simply succeed, made in
-- all; `history_dropped`: the oldest of them deleted (numbers 1 to it). Each record has
-- its number in the transaction's history, so the newest are kept by deleting a prefix and
-- a page of them is read by number.
ALTER TABLE idem_global
    ADD COLUMN calls BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN history BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN history_dropped BIGINT NOT NULL DEFAULT 0;
ALTER TABLE idem_attempt ADD COLUMN number BIGINT NOT NULL DEFAULT 0;
UPDATE idem_attempt a
  JOIN (SELECT id, ROW_NUMBER() OVER (PARTITION BY gid ORDER BY id) AS n FROM idem_attempt) r
    ON a.id = r.id
   SET a.number = r.n;
UPDATE idem_global g
  JOIN (SELECT gid, COUNT(*) AS n FROM idem_attempt GROUP BY gid) c ON g.gid = c.gid
   SET g.history = c.n;
CREATE UNIQUE INDEX idem_attempt_number ON idem_attempt (gid, number);
DROP INDEX idem_attempt_gid ON idem_attempt;
