-- COPY through the proxy on a tree, run after tree.sql; integration/drivers_test.go
-- compares the output, sorted, with copy.out.
COPY drv (id, grp, name) FROM STDIN;
101	1	copy-101
102	2	copy-102
103	3	copy-103
\.
SELECT id, name FROM drv WHERE id > 100 ORDER BY id;
COPY drv (id, name) TO STDOUT;
