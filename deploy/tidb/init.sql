-- Run by the tidb-init service of deploy/compose.yaml on every start (idempotent).
-- The archive's database; the archive writer creates its own tables in it.
CREATE DATABASE IF NOT EXISTS gateway;
