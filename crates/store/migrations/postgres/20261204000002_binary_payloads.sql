-- Issue 31, point 2: payloads that are not text. DTM's gRPC clients send a branch's payload as
-- protobuf bytes; `payload` (text, as every payload over HTTP is) cannot hold them. A payload
-- that is not UTF-8 is stored here, with `payload` empty; a text payload stays in `payload`
-- with this column NULL, so the rows of every earlier transaction are unchanged. Adding a
-- nullable column rewrites no rows. An older idem would read such a branch as an empty
-- payload and call its participant with it, so no binary older than 0.2.0 may run on it.
ALTER TABLE idem_branch ADD COLUMN payload_bin BYTEA;
INSERT INTO idem_schema_compat (version, oldest_binary) VALUES (20261204000002, '0.2.0');
