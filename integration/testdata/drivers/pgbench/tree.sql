-- pgbench on a tree through the proxy: a single-shard transaction and a
-- fan-out without the key. Run by integration/drivers_test.go in every -M mode.
\set id random(1, 20)
BEGIN;
UPDATE drv SET grp = grp + 1 WHERE id = :id;
SELECT name FROM drv WHERE id = :id;
END;
SELECT id FROM drv WHERE grp < 0;
