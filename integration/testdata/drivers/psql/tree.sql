-- psql against the Lattice proxy, run by integration/drivers_test.go with
-- psql -X -q -At -v ON_ERROR_STOP=1; its output must equal tree.out.
INSERT INTO drv (id, grp, name) VALUES (1, 1, 'name-1');
INSERT INTO drv (id, grp, name) VALUES (2, 2, 'name-2');
INSERT INTO drv (id, grp, name) VALUES (3, 3, 'name-3');
INSERT INTO drv (id, grp, name) VALUES (4, 0, 'name-4');
INSERT INTO drv (id, grp, name) VALUES (5, 1, 'name-5');
INSERT INTO drv (id, grp, name) VALUES (6, 2, 'name-6');
INSERT INTO drv (id, grp, name) VALUES (7, 3, 'name-7');
INSERT INTO drv (id, grp, name) VALUES (8, 0, 'name-8');
INSERT INTO drv (id, grp, name) VALUES (9, 1, 'name-9');
INSERT INTO drv (id, grp, name) VALUES (10, 2, 'name-10');
INSERT INTO drv (id, grp, name) VALUES (11, 3, 'name-11');
INSERT INTO drv (id, grp, name) VALUES (12, 0, 'name-12');
INSERT INTO drv (id, grp, name) VALUES (13, 1, 'name-13');
INSERT INTO drv (id, grp, name) VALUES (14, 2, 'name-14');
INSERT INTO drv (id, grp, name) VALUES (15, 3, 'name-15');
INSERT INTO drv (id, grp, name) VALUES (16, 0, 'name-16');
INSERT INTO drv (id, grp, name) VALUES (17, 1, 'name-17');
INSERT INTO drv (id, grp, name) VALUES (18, 2, 'name-18');
INSERT INTO drv (id, grp, name) VALUES (19, 3, 'name-19');
INSERT INTO drv (id, grp, name) VALUES (20, 0, 'name-20');
SELECT name FROM drv WHERE id = 7;
BEGIN;
UPDATE drv SET name = 'tx-5' WHERE id = 5;
SELECT name FROM drv WHERE id = 5;
COMMIT;
SELECT id FROM drv ORDER BY id;
SELECT id, name FROM drv WHERE grp = 1 ORDER BY id;
-- The unique violation must reach psql with its SQLSTATE.
\set ON_ERROR_STOP 0
\set VERBOSITY sqlstate
INSERT INTO drv (id, grp, name) VALUES (1, 1, 'dup');
\set ON_ERROR_STOP 1
\echo unique=:LAST_ERROR_SQLSTATE
SELECT name FROM drv WHERE id = 1;
