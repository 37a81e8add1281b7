package integration

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/shardmap"
)

// TestJoinsEqualPostgres runs statements over several references to one
// tree (self-joins, subqueries, CTEs, set operations, writes with joins)
// on a tree of 16 shards over 3 nodes, and over three trees of its
// colocation group and a reference table (joins, outer joins, subqueries,
// aggregates, GROUP BY, HAVING, DISTINCT, windows, text under an ICU
// collation),
// and compares each with the same statement on plain tables holding the
// same rows: column names, types, rows, and their order where there is an
// ORDER BY. Refused forms are refused with 0A000 and a hint.
func TestJoinsEqualPostgres(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 3)
	c := connect(t, p.DSN("lattice"))
	const cols = `(customer_id bigint, order_id integer, total numeric(10,2), status text, parent integer, PRIMARY KEY (customer_id, order_id))`
	const fill = `SELECT c, o, ((c * 37 + o * 11) % 1000) / 10.0, (ARRAY['open','paid','void'])[1 + (c + o) % 3],
		CASE WHEN o > 1 THEN o - 1 END
		FROM generate_series(1, 60) c, generate_series(1, 1 + c % 5) o`
	mustExec(t, c, `CREATE TABLE jo `+cols)
	mustExec(t, c, `INSERT INTO jo `+fill)
	mustExec(t, c, `SELECT lattice_create_tree('jo', 'customer_id', shard_count => 16)`)
	mustExec(t, c, `CREATE TABLE jo_plain `+cols)
	mustExec(t, c, `INSERT INTO jo_plain `+fill)
	mustExec(t, c, `CREATE TABLE jo_status (status text PRIMARY KEY, label text)`)
	mustExec(t, c, `INSERT INTO jo_status VALUES ('open', 'Open'), ('paid', 'Paid'), ('void', 'Void')`)
	// Customers and order lines in jo's colocation group (the lines keyed
	// by a column of another name), text under a collation that does not
	// order bytes, and a reference table of plans. Customers 61 to 70 have
	// no orders, and some orders no lines.
	const customers = `(customer_id bigint PRIMARY KEY, name text COLLATE "en-US-x-icu", plan text, region text)`
	const fillCustomers = `SELECT c, (ARRAY['zoë','Zoe','émile','Emile','emile','Ärger','arger','b','B','_x'])[1 + c % 10] || CASE WHEN c % 4 = 0 THEN ' jr' ELSE '' END,
		(ARRAY['free','pro','team',NULL])[1 + c % 4], (ARRAY['north','south','east'])[1 + c % 3]
		FROM generate_series(1, 70) c`
	const lines = `(cust bigint, order_id integer, line integer, qty integer, sku text COLLATE "en-US-x-icu", price numeric(8,2), PRIMARY KEY (cust, order_id, line))`
	const fillLines = `SELECT c, o, l, 1 + (c * l + o) % 6, (ARRAY['ab','Ab','a b','résumé','resume','Z'])[1 + (c + l) % 6], ((c * 13 + o * 7 + l) % 500) / 10.0
		FROM generate_series(1, 60) c, generate_series(1, 1 + c % 5) o, generate_series(1, (c + o) % 4) l`
	for _, tree := range []struct{ name, cols, fill, key string }{{"jc", customers, fillCustomers, "customer_id"}, {"ji", lines, fillLines, "cust"}} {
		mustExec(t, c, `CREATE TABLE `+tree.name+` `+tree.cols)
		mustExec(t, c, `INSERT INTO `+tree.name+` `+tree.fill)
		mustExec(t, c, `SELECT lattice_create_tree('`+tree.name+`', '`+tree.key+`', colocate_with => 'jo')`)
		mustExec(t, c, `CREATE TABLE `+tree.name+`_plain `+tree.cols)
		mustExec(t, c, `INSERT INTO `+tree.name+`_plain `+tree.fill)
	}
	mustExec(t, c, `CREATE TABLE jo_plans (plan text PRIMARY KEY, title text COLLATE "en-US-x-icu", fee numeric(6,2))`)
	mustExec(t, c, `INSERT INTO jo_plans VALUES ('free', 'Free', 0), ('pro', 'pro', 12.5), ('team', 'Team', 40)`)
	mustExec(t, c, `SELECT lattice_create_reference_table('jo_plans')`)

	cases := []struct {
		sql     string
		ordered bool
		args    []any
	}{
		// The key fixed: one shard.
		{sql: `SELECT a.order_id, b.order_id AS prev FROM jo a JOIN jo b ON a.customer_id = b.customer_id AND b.order_id = a.parent WHERE a.customer_id = 14 ORDER BY 1`, ordered: true},
		{sql: `SELECT a.order_id, b.total FROM jo a LEFT JOIN jo b ON a.customer_id = b.customer_id AND b.order_id = a.order_id + 1 WHERE a.customer_id = $1 ORDER BY 1`, ordered: true, args: []any{9}},
		{sql: `SELECT a.order_id, b.order_id FROM jo a RIGHT JOIN jo b ON a.customer_id = b.customer_id AND a.order_id = b.order_id + 3 WHERE b.customer_id = 4 ORDER BY 2`, ordered: true},
		{sql: `SELECT a.order_id, b.order_id FROM jo a FULL JOIN jo b ON a.customer_id = b.customer_id AND a.order_id = b.order_id + 2 WHERE a.customer_id = 9 OR a.customer_id IS NULL AND b.customer_id = 9`},
		{sql: `SELECT a.order_id FROM jo a JOIN jo b USING (customer_id) WHERE a.customer_id = 14 AND b.status = 'paid'`},
		{sql: `SELECT order_id, total FROM jo a WHERE a.customer_id = 24 AND EXISTS (SELECT 1 FROM jo b WHERE b.customer_id = a.customer_id AND b.total > a.total) ORDER BY order_id`, ordered: true},
		{sql: `SELECT order_id FROM jo a WHERE a.customer_id = 24 AND NOT EXISTS (SELECT 1 FROM jo b WHERE b.customer_id = a.customer_id AND b.order_id = a.order_id + 1)`},
		{sql: `SELECT order_id FROM jo WHERE customer_id = 19 AND customer_id IN (SELECT customer_id FROM jo WHERE status = 'void')`},
		{sql: `SELECT order_id FROM jo a WHERE a.customer_id = 19 AND a.customer_id NOT IN (SELECT b.customer_id FROM jo b WHERE b.total > 99)`},
		{sql: `SELECT a.order_id, (SELECT count(*) FROM jo b WHERE b.customer_id = a.customer_id AND b.order_id < a.order_id) AS before FROM jo a WHERE a.customer_id = 29 ORDER BY 1`, ordered: true},
		{sql: `SELECT a.order_id, l.total FROM jo a, LATERAL (SELECT b.total FROM jo b WHERE b.customer_id = a.customer_id ORDER BY b.total DESC LIMIT 1) l WHERE a.customer_id = 34`},
		{sql: `WITH mine AS (SELECT * FROM jo WHERE customer_id = 44) SELECT m.order_id, m.total, b.order_id FROM mine m JOIN jo b ON b.customer_id = m.customer_id AND b.order_id = m.parent WHERE b.customer_id = 44 ORDER BY m.order_id`, ordered: true},
		{sql: `SELECT status FROM jo WHERE customer_id = 44 UNION SELECT status FROM jo WHERE customer_id = 44 AND total > 1`},
		{sql: `SELECT order_id FROM jo WHERE customer_id = $1 INTERSECT SELECT order_id FROM jo WHERE customer_id = $1 AND status <> 'void'`, args: []any{49}},
		{sql: `SELECT order_id FROM jo WHERE customer_id = 49 EXCEPT ALL SELECT order_id FROM jo WHERE customer_id = 49 AND status = 'paid' ORDER BY 1`, ordered: true},
		{sql: `SELECT a.status, count(*), sum(b.total) FROM jo a JOIN jo b ON a.customer_id = b.customer_id WHERE a.customer_id = 54 GROUP BY a.status ORDER BY 1`, ordered: true},
		{sql: `SELECT a.order_id FROM jo a JOIN jo b ON a.customer_id = b.customer_id AND a.order_id = b.order_id WHERE b.customer_id = 54 ORDER BY 1 FOR UPDATE OF a`, ordered: true},
		// The key not fixed: every shard, merged.
		{sql: `SELECT a.customer_id, a.order_id, b.order_id AS prev FROM jo a JOIN jo b ON a.customer_id = b.customer_id AND b.order_id = a.parent`},
		{sql: `SELECT a.customer_id, a.order_id, b.total FROM jo a LEFT JOIN jo b ON b.customer_id = a.customer_id AND b.order_id = a.order_id + 1 ORDER BY a.total DESC, a.customer_id, a.order_id LIMIT 20`, ordered: true},
		{sql: `SELECT a.customer_id, b.order_id FROM jo a FULL JOIN jo b ON a.customer_id = b.customer_id AND a.order_id = b.order_id + 4`},
		{sql: `SELECT customer_id, order_id FROM jo a WHERE EXISTS (SELECT 1 FROM jo b WHERE b.customer_id = a.customer_id AND b.status = 'void' AND b.order_id <> a.order_id) ORDER BY 1, 2 LIMIT 15 OFFSET 3`, ordered: true},
		{sql: `SELECT customer_id, order_id FROM jo a WHERE NOT EXISTS (SELECT 1 FROM jo b WHERE b.customer_id = a.customer_id AND b.total > a.total)`},
		{sql: `SELECT customer_id, order_id FROM jo WHERE customer_id IN (SELECT customer_id FROM jo WHERE status = 'void' AND total > 50)`},
		{sql: `SELECT customer_id, order_id FROM jo WHERE customer_id NOT IN (SELECT customer_id FROM jo WHERE order_id > 3)`},
		{sql: `SELECT a.customer_id, a.order_id, (SELECT max(b.total) FROM jo b WHERE b.customer_id = a.customer_id) AS top FROM jo a ORDER BY top DESC, 1, 2 LIMIT 10`, ordered: true},
		{sql: `SELECT a.customer_id, l.n FROM jo a CROSS JOIN LATERAL (SELECT count(*) AS n FROM jo b WHERE b.customer_id = a.customer_id AND b.order_id <= a.order_id) l WHERE a.status = $1`, args: []any{"paid"}},
		// The key not fixed, aggregated in two steps: a partial query per
		// node, the final step on the catalog node.
		{sql: `SELECT count(*) FROM jo a JOIN jo b USING (customer_id)`},
		{sql: `SELECT count(*), sum(b.total), avg(b.total) FROM jo a JOIN jo b ON a.customer_id = b.customer_id AND b.order_id = a.parent`},
		{sql: `SELECT a.status, count(*), min(b.total), max(b.total) FROM jo a JOIN jo b USING (customer_id) GROUP BY a.status ORDER BY 1`, ordered: true},
		{sql: `SELECT c.name, count(o.order_id), sum(o.total) FROM jc c LEFT JOIN jo o ON o.customer_id = c.customer_id GROUP BY c.name ORDER BY c.name`, ordered: true},
		{sql: `SELECT c.plan, count(DISTINCT c.customer_id), count(DISTINCT o.status), avg(o.total) FROM jc c JOIN jo o USING (customer_id) GROUP BY c.plan HAVING count(*) > 5 ORDER BY 1 NULLS FIRST`, ordered: true},
		{sql: `SELECT DISTINCT c.region FROM jc c JOIN jo o USING (customer_id) WHERE o.status = 'void' ORDER BY 1`, ordered: true},
		// NATURAL joins the keys when they share a name (and every other
		// column of a shared name).
		{sql: `SELECT c.region, count(*), sum(o.total) FROM jc c NATURAL JOIN jo o GROUP BY 1 ORDER BY 1`, ordered: true},
		{sql: `SELECT customer_id, name, order_id FROM jc NATURAL LEFT JOIN jo WHERE customer_id > 55 ORDER BY 1, 3 NULLS FIRST`, ordered: true},
		{sql: `SELECT count(*) FROM jo a NATURAL JOIN jo b`},
		// A row IN a subquery, the keys at one position.
		{sql: `SELECT count(*), sum(qty) FROM ji WHERE (cust, order_id) IN (SELECT customer_id, order_id FROM jo WHERE status = 'paid')`},
		{sql: `SELECT o.customer_id, o.order_id FROM jo o WHERE (o.order_id, o.customer_id) NOT IN (SELECT i.order_id, i.cust FROM ji i WHERE i.qty > 2) ORDER BY 1, 2`, ordered: true},
		{sql: `SELECT DISTINCT c.name FROM jc c JOIN ji i ON i.cust = c.customer_id ORDER BY c.name DESC LIMIT 6`, ordered: true},
		{sql: `SELECT min(c.name), max(c.name), min(i.sku), max(i.sku), count(DISTINCT i.sku) FROM jc c JOIN ji i ON i.cust = c.customer_id`},
		{sql: `SELECT i.sku, count(*), sum(i.qty) FROM jo o JOIN ji i ON i.cust = o.customer_id AND i.order_id = o.order_id GROUP BY i.sku ORDER BY i.sku`, ordered: true},
		{sql: `SELECT p.title, count(*), sum(i.qty * i.price), max(c.name) FROM jc c JOIN jo o ON o.customer_id = c.customer_id JOIN ji i ON i.cust = o.customer_id AND i.order_id = o.order_id JOIN jo_plans p ON p.plan = c.plan GROUP BY p.title ORDER BY p.title`, ordered: true},
		{sql: `SELECT o.status, count(i.line), coalesce(sum(i.qty), 0) FROM jo o LEFT JOIN ji i ON i.cust = o.customer_id AND i.order_id = o.order_id GROUP BY o.status ORDER BY 1`, ordered: true},
		{sql: `SELECT c.region, count(o.customer_id), count(*) FROM jc c LEFT JOIN jo o ON o.customer_id = c.customer_id AND o.total > 50 GROUP BY 1 ORDER BY 1`, ordered: true},
		{sql: `SELECT count(c.customer_id), count(o.customer_id), count(*) FROM jc c FULL JOIN jo o ON o.customer_id = c.customer_id AND o.total > 50`},
		// Grouped by a key, the whole statement runs on each shard; not
		// by the nullable side's, whose NULL group spans every shard.
		{sql: `SELECT c.customer_id, c.name, count(o.order_id), max(o.total) FROM jc c LEFT JOIN jo o USING (customer_id) GROUP BY c.customer_id, c.name HAVING count(*) > 1 ORDER BY 3 DESC, 1 LIMIT 7`, ordered: true},
		{sql: `SELECT o.customer_id, count(*) FROM jc c LEFT JOIN jo o ON o.customer_id = c.customer_id AND o.total > 50 GROUP BY o.customer_id ORDER BY 1 NULLS FIRST`, ordered: true},
		{sql: `SELECT count(*), min(c.name) FROM jc c WHERE EXISTS (SELECT 1 FROM jo o WHERE o.customer_id = c.customer_id AND o.status = 'paid')`},
		{sql: `SELECT c.region, count(*) FROM jc c WHERE c.customer_id NOT IN (SELECT cust FROM ji) GROUP BY c.region ORDER BY 2 DESC, 1`, ordered: true},
		// IN over the nullable side of an outer join, as a row filter: a
		// NULL key's answer, false on some shards and NULL over all of
		// them, drops the row either way.
		{sql: `SELECT c.customer_id, o.order_id FROM jc c LEFT JOIN jo o ON o.customer_id = c.customer_id AND o.total > 50 WHERE o.customer_id IN (SELECT cust FROM ji WHERE cust < 5) OR c.customer_id > 65`},
		{sql: `SELECT count(*), sum(t.n), max(t.n) FROM jc c JOIN (SELECT cust, count(*) AS n FROM ji GROUP BY cust) t ON t.cust = c.customer_id`},
		{sql: `SELECT max(l.total), count(*) FROM jc c CROSS JOIN LATERAL (SELECT o.total FROM jo o WHERE o.customer_id = c.customer_id ORDER BY o.total DESC LIMIT 1) l`},
		{sql: `SELECT o.status, count(*) FROM jo o JOIN ji i ON i.cust = o.customer_id AND i.order_id = o.order_id WHERE i.qty > $1 GROUP BY 1 ORDER BY 1`, ordered: true, args: []any{2}},
		{sql: `SELECT c.region, avg(i.qty), sum(i.qty), sum(i.price), avg(i.price) FROM jc c JOIN ji i ON i.cust = c.customer_id GROUP BY 1 ORDER BY 1`, ordered: true},
		{sql: `SELECT p.title, count(DISTINCT c.region), min(o.total) FROM jc c JOIN jo o USING (customer_id) JOIN jo_plans p USING (plan) WHERE p.fee > $1 GROUP BY p.title HAVING min(o.total) < 50 ORDER BY 2, 1`, ordered: true, args: []any{1}},
		// Windows partitioned by the key run on the shards.
		{sql: `SELECT o.customer_id, o.order_id, rank() OVER (PARTITION BY c.customer_id ORDER BY o.total DESC, o.order_id) AS r, sum(o.total) OVER (PARTITION BY o.customer_id) FROM jc c JOIN jo o USING (customer_id) ORDER BY r, 1, 2 LIMIT 25`, ordered: true},
		{sql: `SELECT c.customer_id, i.order_id, i.line, count(i.line) OVER w, row_number() OVER (w ORDER BY i.order_id, i.line) FROM jc c LEFT JOIN ji i ON i.cust = c.customer_id WINDOW w AS (PARTITION BY c.customer_id)`},
		{sql: `SELECT c.customer_id, o.customer_id, count(*) OVER (PARTITION BY c.customer_id, o.customer_id) FROM jc c FULL JOIN jo o ON o.customer_id = c.customer_id AND o.total > 50`},
		// Set operations over every shard: UNION ALL of any per-shard
		// branches, the others where every branch outputs the key at one
		// position; duplicates, NULLs, ORDER BY and LIMIT at the top.
		{sql: `SELECT customer_id, parent FROM jo WHERE total > 50 UNION ALL SELECT cust, order_id FROM ji WHERE qty > 4 UNION ALL SELECT customer_id, NULL FROM jc WHERE plan IS NULL`},
		{sql: `SELECT customer_id, parent FROM jo UNION ALL SELECT customer_id, NULL FROM jc ORDER BY 2 DESC NULLS LAST, 1 LIMIT 40 OFFSET 5`, ordered: true},
		{sql: `SELECT customer_id AS id, name FROM jc WHERE customer_id < 30 UNION ALL SELECT customer_id, name FROM jc WHERE customer_id > 50 ORDER BY name, id`, ordered: true},
		{sql: `SELECT c.customer_id, p.title FROM jc c JOIN jo_plans p USING (plan) UNION ALL SELECT o.customer_id, o.status FROM jo o WHERE o.total < 10`},
		{sql: `SELECT customer_id, status FROM jo UNION SELECT customer_id, plan FROM jc`},
		{sql: `SELECT status, customer_id FROM jo UNION SELECT plan, customer_id FROM jc ORDER BY 2 DESC, 1 NULLS FIRST LIMIT 25`, ordered: true},
		{sql: `SELECT customer_id FROM jo WHERE status = 'void' INTERSECT SELECT customer_id FROM jc WHERE region = 'north'`},
		{sql: `SELECT customer_id, status FROM jo INTERSECT ALL SELECT customer_id, status FROM jo WHERE total > 20 ORDER BY 1, 2`, ordered: true},
		{sql: `SELECT customer_id FROM jc EXCEPT SELECT customer_id FROM jo ORDER BY 1`, ordered: true},
		{sql: `SELECT cust, order_id FROM ji EXCEPT ALL SELECT customer_id, order_id FROM jo WHERE total > $1`, args: []any{30}},
		{sql: `SELECT customer_id FROM jc WHERE region = 'north' UNION (SELECT customer_id FROM jo WHERE total > 90 INTERSECT SELECT cust FROM ji WHERE qty = 6) ORDER BY 1 DESC LIMIT 7`, ordered: true},
		{sql: `SELECT c.customer_id FROM jc c WHERE EXISTS (SELECT 1 FROM jo o WHERE o.customer_id = c.customer_id AND o.status = 'paid') EXCEPT SELECT cust FROM ji WHERE qty > 3`},
		// Set operations whose branches do not output the key at one
		// position compare rows of several shards in the final step, text
		// under its ICU collation.
		{sql: `SELECT status FROM jo UNION SELECT status FROM jo`},
		{sql: `SELECT customer_id, status FROM jo INTERSECT SELECT order_id, status FROM jo ORDER BY 1, 2`, ordered: true},
		{sql: `SELECT name FROM jc UNION SELECT sku FROM ji ORDER BY 1`, ordered: true},
		{sql: `SELECT c.name AS n, c.region FROM jc c EXCEPT ALL SELECT c.name, 'north' FROM jc c WHERE c.customer_id % 3 <> 0 ORDER BY n DESC, 2`, ordered: true},
		{sql: `SELECT c.region, c.plan FROM jc c EXCEPT SELECT c.region, o.status FROM jc c JOIN jo o USING (customer_id) WHERE o.total > $1 ORDER BY 1, 2 NULLS FIRST LIMIT $2 OFFSET 1`, ordered: true, args: []any{20, 5}},
		{sql: `SELECT plan FROM jc INTERSECT ALL SELECT plan FROM jc WHERE region <> 'east'`},
		{sql: `SELECT p.title, o.status FROM jo o JOIN jc c USING (customer_id) JOIN jo_plans p USING (plan) UNION SELECT 'pro', status FROM jo WHERE total > 90 ORDER BY 1, 2`, ordered: true},
		{sql: `SELECT total FROM jo WHERE status = 'void' UNION (SELECT total FROM jo WHERE customer_id < 10 UNION ALL SELECT price FROM ji) EXCEPT SELECT total FROM jo WHERE total > 50 ORDER BY 1 DESC LIMIT 20`, ordered: true},
		// Other windows run in the final step over the nodes' rows, text
		// ordered and partitioned under its ICU collation.
		{sql: `SELECT c.customer_id, c.name, rank() OVER (ORDER BY c.name, c.customer_id) AS r FROM jc c ORDER BY r LIMIT 30`, ordered: true},
		{sql: `SELECT c.customer_id, rank() OVER (ORDER BY c.name) FROM jc c JOIN jo o USING (customer_id)`},
		{sql: `SELECT c.customer_id, o.order_id, row_number() OVER (PARTITION BY c.region ORDER BY o.total DESC, o.customer_id, o.order_id), sum(o.total) OVER (PARTITION BY c.region) FROM jc c JOIN jo o USING (customer_id)`},
		{sql: `SELECT i.sku, i.cust, i.order_id, i.line, lag(i.price) OVER (PARTITION BY i.sku ORDER BY i.cust, i.order_id, i.line), dense_rank() OVER (ORDER BY i.sku) FROM jo o JOIN ji i ON i.cust = o.customer_id AND i.order_id = o.order_id ORDER BY i.sku, 2, 3, 4 LIMIT 40 OFFSET 3`, ordered: true},
		{sql: `SELECT c.name, p.title, rank() OVER (PARTITION BY p.title ORDER BY c.name) FROM jc c JOIN jo_plans p USING (plan) ORDER BY p.title, c.name, 3`, ordered: true},
		{sql: `SELECT c.customer_id, count(*) OVER (PARTITION BY o.customer_id) FROM jc c LEFT JOIN jo o USING (customer_id)`},
		{sql: `SELECT o.customer_id, o.order_id, percent_rank() OVER (ORDER BY o.total, o.customer_id, o.order_id) FROM jo o WHERE EXISTS (SELECT 1 FROM ji i WHERE i.cust = o.customer_id AND i.qty > $1) ORDER BY 3 DESC LIMIT 15`, ordered: true, args: []any{4}},
		// Aggregates the partial rows cannot combine run whole in the
		// final step, over the joined rows, text under its collation.
		{sql: `SELECT c.region, string_agg(c.name, ',' ORDER BY c.name, o.order_id) FILTER (WHERE o.total > $1), count(DISTINCT c.plan) FROM jc c JOIN jo o USING (customer_id) GROUP BY ROLLUP (c.region)`, args: []any{20}},
		{sql: `SELECT DISTINCT ON (c.region) c.region, c.name, o.total FROM jc c JOIN jo o USING (customer_id) ORDER BY c.region, o.total DESC, c.name, o.order_id`, ordered: true},
		// Windows beside aggregates run in the aggregate's final step,
		// over the groups.
		{sql: `SELECT customer_id % 3, count(*), rank() OVER (ORDER BY count(*) DESC) FROM jo GROUP BY 1`},
		{sql: `SELECT c.region, count(*), rank() OVER (ORDER BY count(*)), sum(sum(o.total)) OVER (ORDER BY c.region) FROM jc c JOIN jo o USING (customer_id) GROUP BY c.region ORDER BY 1`, ordered: true},
		{sql: `SELECT c.name, count(*), dense_rank() OVER (ORDER BY c.name DESC), lag(c.name) OVER w, first_value(max(o.total)) OVER w FROM jc c JOIN jo o USING (customer_id) GROUP BY c.name WINDOW w AS (ORDER BY c.name) ORDER BY c.name`, ordered: true},
		{sql: `SELECT p.title, count(*) AS n, row_number() OVER (ORDER BY count(*) DESC, p.title) FROM jc c JOIN jo_plans p USING (plan) JOIN jo o ON o.customer_id = c.customer_id WHERE o.total > $1 GROUP BY p.title ORDER BY n DESC LIMIT 2`, ordered: true, args: []any{30}},
		{sql: `SELECT count(*), avg(i.price), row_number() OVER () FROM jo o JOIN ji i ON i.cust = o.customer_id AND i.order_id = o.order_id`},
		// WITH beside aggregates and final-step windows: the CTEs go into
		// each node's partial query.
		{sql: `WITH big AS (SELECT 50 AS floor) SELECT c.region, count(*), sum(o.total) FROM jc c JOIN jo o USING (customer_id), big WHERE o.total > big.floor GROUP BY c.region ORDER BY 1`, ordered: true},
		{sql: `WITH paid AS (SELECT plan FROM jo_plans WHERE fee > $1) SELECT count(*), max(c.name), min(c.name) FROM jc c JOIN paid USING (plan)`, args: []any{5}},
		{sql: `WITH w AS (SELECT 'north'::text AS r) SELECT c.customer_id, rank() OVER (ORDER BY c.name, c.customer_id) FROM jc c, w WHERE c.region = w.r ORDER BY 2 LIMIT 10`, ordered: true},
		// A CTE over a tree, referenced once, runs as the derived table
		// PostgreSQL makes of it: over every shard when its rows are
		// per-shard rows joined or compared on the key.
		{sql: `WITH t AS (SELECT customer_id, total FROM jo) SELECT count(*), sum(total) FROM t`},
		{sql: `WITH t AS (SELECT customer_id, sum(total) AS s FROM jo GROUP BY customer_id) SELECT count(*), max(s), sum(s) FROM t`},
		{sql: `WITH t AS (SELECT customer_id, total FROM jo WHERE status = 'paid') SELECT c.region, count(*), sum(t.total) FROM jc c JOIN t ON t.customer_id = c.customer_id GROUP BY c.region ORDER BY 1`, ordered: true},
		{sql: `WITH t AS (SELECT customer_id, order_id FROM jo WHERE total > 50) SELECT customer_id, order_id FROM t ORDER BY 1, 2`, ordered: true},
		{sql: `WITH t AS (SELECT customer_id, order_id FROM jo WHERE status = 'void') SELECT c.customer_id, t.order_id FROM jc c LEFT JOIN t ON t.customer_id = c.customer_id`},
		{sql: `WITH t(k, amt) AS (SELECT cust, price FROM ji) SELECT c.customer_id, x.amt FROM jc c JOIN t x ON x.k = c.customer_id WHERE x.amt > $1`, args: []any{20}},
		{sql: `WITH t AS (SELECT cust FROM ji WHERE qty > 3) SELECT count(*) FROM jc c WHERE c.customer_id IN (SELECT cust FROM t)`},
		{sql: `WITH t AS (SELECT customer_id, order_id, total FROM jo WHERE total > 20) SELECT c.customer_id, t.order_id, t.total FROM jc c LEFT JOIN t USING (customer_id)`},
		{sql: `WITH o AS (SELECT customer_id, total FROM jo WHERE total > 10), t AS (SELECT customer_id, total * 2 AS twice FROM o) SELECT count(*), sum(twice) FROM t`},
		{sql: `WITH big AS (SELECT 50 AS floor), t AS NOT MATERIALIZED (SELECT customer_id, total FROM jo) SELECT t.customer_id, t.total FROM t, big WHERE t.total > big.floor ORDER BY 1, 2`, ordered: true},
		// The join form the refusal of a scalar subquery beside
		// aggregates names.
		{sql: `SELECT c.name, c.customer_id, count(o.order_id) FROM jc c LEFT JOIN jo o USING (customer_id) GROUP BY c.name, c.customer_id`},
		// An aggregate in a subquery that names no outer column aggregates
		// the subquery, on each shard.
		{sql: `SELECT o.customer_id, o.order_id, (SELECT max(fee) FROM jo_plans) AS top_fee, (SELECT count(*) FROM jo_plans p WHERE p.plan = c.plan) AS n FROM jo o JOIN jc c USING (customer_id) ORDER BY 1, 2`, ordered: true},
		{sql: `SELECT customer_id, order_id, (SELECT min(p.fee) FROM jo_plans p WHERE p.fee > jo.total / 10) FROM jo WHERE total > $1`, args: []any{40}},
	}
	// Refused, with a hint that names the fix.
	refusedCases := []struct{ sql, hint string }{
		{`SELECT * FROM jo a JOIN jo b ON a.order_id = b.order_id WHERE a.customer_id = 1`, "shard keys"},
		{`SELECT * FROM jo a, jo b WHERE a.customer_id = 1`, "equal shard keys"},
		{`SELECT * FROM jo a WHERE a.total > (SELECT avg(total) FROM jo)`, "equal shard keys"},
		{`SELECT * FROM jo JOIN jo_status USING (status) WHERE customer_id = 1`, "reference table"},
		{`SELECT * FROM jo a JOIN jo b USING (customer_id) JOIN jo_status s ON s.status = b.status WHERE a.customer_id = 1`, "reference table"},
		{`SELECT c.name, (SELECT count(*) FROM jo o WHERE o.customer_id = c.customer_id) FROM jc c GROUP BY c.name, c.customer_id`, "join the subquery's table and group by its columns"},
		{`SELECT p.title, count(o.total) FROM jo_plans p LEFT JOIN jc c USING (plan) LEFT JOIN jo o USING (customer_id) GROUP BY 1`, "customer_id = <value>"},
		{`SELECT count(*) FROM jc c JOIN ji i ON i.line = c.customer_id`, "shard keys"},
		{`SELECT * FROM jo UNION SELECT * FROM jo`, "list the columns instead of *"},
		{`SELECT customer_id FROM jo UNION ALL SELECT 1`, "Read a tree in every branch"},
		{`SELECT customer_id, count(*) FROM jo GROUP BY 1 UNION ALL SELECT customer_id, 1 FROM jc`, "customer_id = <value>"},
		{`SELECT DISTINCT c.region, rank() OVER (ORDER BY c.name) FROM jc c`, "remove duplicates in an outer SELECT"},
		{`WITH r AS (SELECT random() AS x) SELECT count(*) FROM jo, r WHERE total > r.x`, "pass it as a parameter"},
		// CTEs over a tree PostgreSQL does not inline: referenced twice,
		// MATERIALIZED.
		{`WITH t AS (SELECT customer_id, total FROM jo) SELECT count(*) FROM t a JOIN t b USING (customer_id)`, "customer_id = <value>"},
		{`WITH t AS MATERIALIZED (SELECT customer_id, total FROM jo) SELECT count(*) FROM t`, "customer_id = <value>"},
		// An aggregate in a subquery over outer columns only aggregates the
		// outer SELECT (one row), which cannot carry the subquery.
		{`SELECT (SELECT max(o.total)) FROM jo o JOIN jc c USING (customer_id)`, "join the subquery's table and group by its columns"},
		{`SELECT (SELECT sum(total) FROM jo_plans LIMIT 1) FROM jo o JOIN jc c USING (customer_id)`, "join the subquery's table and group by its columns"},
		{`SELECT (SELECT max(c.name)) FROM jc c`, "join the subquery's table and group by its columns"},
		// NOT IN over the nullable side of an outer join: customers 61 to
		// 70, with no orders, have a NULL o.customer_id, and NULL NOT IN
		// (the subquery) is true on the shards whose part of it is empty,
		// NULL over all of them. Run on the shards, they came back.
		{`SELECT c.customer_id, o.order_id FROM jc c LEFT JOIN jo o ON o.customer_id = c.customer_id WHERE o.customer_id NOT IN (SELECT cust FROM ji WHERE cust < 5)`, "NOT EXISTS"},
		{`SELECT c.customer_id, o.customer_id IN (SELECT cust FROM ji WHERE cust < 5) FROM jc c LEFT JOIN jo o USING (customer_id)`, "NOT EXISTS"},
	}

	// Writes over several references, compared by their RETURNING rows,
	// their tags and the written table's rows afterwards, in a transaction
	// that is rolled back: fixed to one key, and (after them) over every
	// shard, each shard's part joining within its shard.
	writes := []joinWrite{
		{sql: `UPDATE jo a SET total = b.total FROM jo b WHERE b.customer_id = a.customer_id AND b.order_id = 1 AND a.customer_id = 7 RETURNING a.order_id, a.total`},
		{sql: `DELETE FROM jo a USING jo b WHERE b.customer_id = a.customer_id AND b.order_id = a.order_id + 1 AND a.customer_id = 8 RETURNING a.order_id`},
		{sql: `INSERT INTO jo (customer_id, order_id, total, status) SELECT customer_id, order_id + 100, total, status FROM jo WHERE customer_id = 9 RETURNING order_id, total`},
		{sql: `UPDATE jo a SET status = 'void' WHERE a.customer_id = 14 AND a.total < (SELECT avg(b.total) FROM jo b WHERE b.customer_id = a.customer_id) RETURNING order_id`},
		{sql: `WITH d AS (DELETE FROM jo WHERE customer_id = 11 AND status = 'open' RETURNING total) UPDATE jo SET total = (SELECT coalesce(sum(total), 0) FROM d) WHERE customer_id = 11 AND order_id = 2 RETURNING total`},
		{sql: `UPDATE jo o SET total = o.total + c.customer_id FROM jc c WHERE c.customer_id = o.customer_id AND c.region = 'north' RETURNING o.customer_id, o.order_id, o.total`},
		{sql: `UPDATE jc c SET plan = p.plan FROM jo_plans p, jo o WHERE o.customer_id = c.customer_id AND o.status = 'void' AND p.plan = 'team' RETURNING c.customer_id, c.plan`},
		{sql: `UPDATE jo o SET status = p.title FROM jc c JOIN jo_plans p USING (plan) WHERE c.customer_id = o.customer_id AND o.total > $1 RETURNING o.customer_id, o.order_id, o.status`, args: []any{50}},
		{sql: `DELETE FROM ji i USING jo o WHERE o.customer_id = i.cust AND o.order_id = i.order_id AND o.status = 'paid' RETURNING i.cust, i.order_id, i.line`},
		{sql: `DELETE FROM jo o WHERE NOT EXISTS (SELECT 1 FROM ji i WHERE i.cust = o.customer_id AND i.order_id = o.order_id) RETURNING customer_id, order_id`},
		{sql: `UPDATE jc SET region = 'west' WHERE customer_id IN (SELECT customer_id FROM jo WHERE total > 90) RETURNING customer_id, region`},
		{sql: `DELETE FROM jc c WHERE c.customer_id NOT IN (SELECT cust FROM ji) RETURNING customer_id`},
		// A CTE over a tree, inlined, read by a write over every shard.
		{sql: `WITH t AS (SELECT customer_id, total FROM jo WHERE order_id = 1) UPDATE jc c SET region = 'r' || t.total FROM t WHERE t.customer_id = c.customer_id RETURNING c.customer_id, c.region`},
		{sql: `UPDATE jo o SET total = (SELECT coalesce(sum(i.qty * i.price), 0) FROM ji i WHERE i.cust = o.customer_id AND i.order_id = o.order_id) WHERE o.status = 'open' RETURNING customer_id, order_id, total`},
		{sql: `INSERT INTO ji (cust, order_id, line, qty, sku, price) SELECT o.customer_id, o.order_id, 100, 1, 'Z', o.total FROM jo o JOIN jc c USING (customer_id) WHERE c.plan = $1 RETURNING cust, order_id, line, price`, args: []any{"pro"}},
		{sql: `INSERT INTO jo (customer_id, order_id, total, status) SELECT i.cust, 1000 + max(i.order_id), sum(i.price), 'open' FROM ji i GROUP BY i.cust ON CONFLICT DO NOTHING RETURNING customer_id, order_id, total`},
		{sql: `INSERT INTO jo (customer_id, order_id, total, status) SELECT c.customer_id, 1, 0, 'new' FROM jc c WHERE NOT EXISTS (SELECT 1 FROM jo o WHERE o.customer_id = c.customer_id) RETURNING customer_id, status`},
	}
	refusedCases = append(refusedCases, []struct{ sql, hint string }{
		{`INSERT INTO jo (customer_id, order_id) SELECT c.customer_id, 1 FROM jc c ORDER BY c.name LIMIT 3`, "customer_id from the shard key"},
		{`UPDATE jo o SET total = 0 FROM ji i WHERE i.order_id = o.order_id`, "shard keys"},
		{`DELETE FROM jo o WHERE o.total > (SELECT avg(total) FROM jo)`, "equal shard keys"},
	}...)

	plain := regexp.MustCompile(`\b(jo|jc|ji)\b`)
	onPlain := func(sql string) string { return plain.ReplaceAllString(sql, "${1}_plain") }
	modes := map[string]pgx.QueryExecMode{"extended": pgx.QueryExecModeCacheStatement, "simple": pgx.QueryExecModeSimpleProtocol}
	for name, mode := range modes {
		for _, tc := range cases {
			t.Run(name+"/"+tc.sql, func(t *testing.T) {
				args := append([]any{mode}, tc.args...)
				gotHead, got, err := queryTyped(t, c, tc.sql, args...)
				if err != nil {
					t.Fatalf("through the tree: %v", err)
				}
				wantHead, want, err := queryTyped(t, c, onPlain(tc.sql), args...)
				if err != nil {
					t.Fatalf("on the plain table: %v", err)
				}
				if gotHead != wantHead {
					t.Fatalf("columns through the tree %s, on one table %s", gotHead, wantHead)
				}
				if len(want) == 0 {
					t.Fatal("the statement returns no row: the case proves nothing")
				}
				if !tc.ordered {
					slices.Sort(got)
					slices.Sort(want)
				}
				if !slices.Equal(got, want) {
					t.Fatalf("%d rows through the tree, %d on one table; first difference:\n%s", len(got), len(want), firstDiff(got, want))
				}
			})
		}
		for _, tc := range refusedCases {
			t.Run(name+"/refused/"+tc.sql, func(t *testing.T) {
				_, _, err := queryTyped(t, c, tc.sql, mode)
				var pe *pgconn.PgError
				if !errors.As(err, &pe) || pe.Code != "0A000" || !strings.Contains(pe.Hint, tc.hint) {
					t.Fatalf("got %v (hint %q), want 0A000 with a hint naming %q", err, hintOf(err), tc.hint)
				}
			})
		}
		for _, w := range writes {
			t.Run(name+"/write/"+w.sql, func(t *testing.T) { w.compare(t, c, mode, onPlain) })
		}
	}
}

// joinWrite is a write compared with plain PostgreSQL.
type joinWrite struct {
	sql  string
	args []any
}

// compare runs the write through the proxy and, rewritten by onPlain, on
// the plain tables, each in a transaction that is rolled back, and
// compares their RETURNING rows, tags and the written table's rows after
// the write (read in the same transaction).
func (w joinWrite) compare(t *testing.T, c *pgx.Conn, mode pgx.QueryExecMode, onPlain func(string) string) {
	t.Helper()
	target := regexp.MustCompile(`^(?:WITH .*\) )?(?:UPDATE|DELETE FROM|INSERT INTO) (?:ONLY )?(\w+)`).FindStringSubmatch(w.sql)
	if target == nil {
		t.Fatalf("no written table in %s", w.sql)
	}
	run := func(sql, table string) (string, []string, string, []string) {
		ctx := context.Background()
		tx, err := c.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		rows, err := tx.Query(ctx, sql, append([]any{mode}, w.args...)...)
		if err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		var head []string
		for _, f := range rows.FieldDescriptions() {
			head = append(head, f.Name)
		}
		out, err := collectStrings(rows)
		if err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		tag := rows.CommandTag().String()
		after, err := tx.Query(ctx, "SELECT * FROM "+table, mode)
		if err != nil {
			t.Fatal(err)
		}
		contents, err := collectStrings(after)
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(out)
		slices.Sort(contents)
		return strings.Join(head, ",") + " " + tag, out, tag, contents
	}
	gotHead, got, gotTag, gotRows := run(w.sql, target[1])
	wantHead, want, wantTag, wantRows := run(onPlain(w.sql), onPlain(target[1]))
	if gotHead != wantHead || !slices.Equal(got, want) || len(want) == 0 {
		t.Fatalf("through the trees %s %v, on the plain tables %s %v", gotHead, got, wantHead, want)
	}
	if gotTag != wantTag || !slices.Equal(gotRows, wantRows) {
		t.Fatalf("%s afterwards: %d rows through the trees (%s), %d on the plain tables (%s); first difference:\n%s",
			target[1], len(gotRows), gotTag, len(wantRows), wantTag, firstDiff(gotRows, wantRows))
	}
}

// TestJoinsMixedShard puts shard 0 of a colocation group in the state of
// a split source before the release (each member's table there also holds
// a copy of every row of shard 1, and the shard is marked mixed): every
// tree reference of a join over several shards reads it through the slot
// predicate of its own tree's key, so the preserved side of a RIGHT or
// FULL join, and each side of a self-join, sees each row once, and
// aggregates over joins of the two trees equal plain PostgreSQL's.
func TestJoinsMixedShard(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := connect(t, p.DSN("lattice"))
	const rows = 400
	mustExec(t, c, "CREATE TABLE mj (k text PRIMARY KEY, v int NOT NULL)")
	mustExec(t, c, "INSERT INTO mj SELECT 'm' || g, g FROM generate_series(1, 400) g")
	mustExec(t, c, "SELECT lattice_create_tree('mj', 'k', shard_count => 4)")
	// A member keyed by a column of another name, and plain copies of both.
	const mkCols = "(kk text, n int, w int, PRIMARY KEY (kk, n))"
	const mkFill = "SELECT 'm' || g, n, (g * 7 + n) % 11 FROM generate_series(1, 400) g, generate_series(1, 1 + g % 3) n"
	mustExec(t, c, "CREATE TABLE mk "+mkCols)
	mustExec(t, c, "INSERT INTO mk "+mkFill)
	mustExec(t, c, "SELECT lattice_create_tree('mk', 'kk', colocate_with => 'mj')")
	mustExec(t, c, "CREATE TABLE mj_plain (k text PRIMARY KEY, v int NOT NULL)")
	mustExec(t, c, "INSERT INTO mj_plain SELECT 'm' || g, g FROM generate_series(1, 400) g")
	mustExec(t, c, "CREATE TABLE mk_plain "+mkCols)
	mustExec(t, c, "INSERT INTO mk_plain "+mkFill)
	store := harnessStore(t)
	tree, m := storedTree(t, ctx, store, "mj")
	member, _ := storedTree(t, ctx, store, "mk")
	nodeIndex := func(name string) int { return int(name[1] - '1') }
	srcConn := ctConnect(t, ctx, testNodeDSN(t, nodeIndex(m.Shards[0].Node)))
	movedConn := ctConnect(t, ctx, testNodeDSN(t, nodeIndex(m.Shards[1].Node)))
	for _, tr := range []*shardmap.Tree{tree, member} {
		var buf strings.Builder
		if _, err := movedConn.PgConn().CopyTo(ctx, &buf, "COPY "+pgshard.ShardTable(tr, 1)+" TO STDOUT"); err != nil {
			t.Fatal(err)
		}
		if tag, err := srcConn.PgConn().CopyFrom(ctx, strings.NewReader(buf.String()), "COPY "+pgshard.ShardTable(tr, 0)+" FROM STDIN"); err != nil || tag.RowsAffected() == 0 {
			t.Fatalf("copying shard 1 of %s into shard 0: %v, %v", tr.Name, tag, err)
		}
	}
	next := m.Clone()
	s0 := next.Shards[0]
	s0.Mixed = true
	next.Shards[0] = s0
	if err := store.SwapMap(ctx, next, m.Epoch); err != nil {
		t.Fatal(err)
	}
	waitAck(t, ctx, store, "mj", next.Epoch)

	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeCacheStatement} {
		for _, sql := range []string{
			"SELECT a.k FROM mj a JOIN mj b ON a.k = b.k",
			"SELECT b.k FROM mj a RIGHT JOIN mj b ON a.k = b.k AND a.v < 0",
			"SELECT coalesce(a.k, b.k) FROM mj a FULL JOIN mj b ON a.k = b.k AND a.v = b.v + 1",
			"SELECT a.k FROM mj a WHERE NOT EXISTS (SELECT 1 FROM mj b WHERE b.k = a.k AND b.v <> a.v)",
		} {
			got, err := queryStrings(t, c, sql, mode)
			if err != nil {
				t.Fatalf("%s: %v", sql, err)
			}
			seen := map[string]int{}
			for _, k := range got {
				seen[k]++
			}
			for k, n := range seen {
				if n != 1 && !strings.Contains(sql, "FULL") || n > 2 {
					t.Fatalf("%s (mode %v): key %s read %d times", sql, mode, k, n)
				}
			}
			want := rows
			if strings.Contains(sql, "FULL") {
				want = 2 * rows // no row matches: each side's rows once, padded
			}
			if len(got) != want || len(seen) != rows {
				t.Fatalf("%s (mode %v): %d rows of %d keys, want %d rows of %d keys", sql, mode, len(got), len(seen), want, rows)
			}
		}
		// Aggregated in two steps, each reference of each node's partial
		// query through its own tree's predicate.
		plain := regexp.MustCompile(`\b(mj|mk)\b`)
		for _, sql := range []string{
			"SELECT count(*), sum(b.w), avg(b.w) FROM mj a JOIN mk b ON b.kk = a.k",
			"SELECT a.v % 7 AS g, count(b.n), max(b.kk) FROM mj a LEFT JOIN mk b ON b.kk = a.k AND b.n > 1 GROUP BY 1 ORDER BY 1",
			"SELECT count(DISTINCT a.k), count(*) FROM mj a JOIN mj b ON a.k = b.k",
			"SELECT count(a.k), count(b.kk), count(*) FROM mj a FULL JOIN mk b ON b.kk = a.k AND b.w > 5",
			"SELECT DISTINCT b.n FROM mk b WHERE EXISTS (SELECT 1 FROM mj a WHERE a.k = b.kk AND a.v > 100) ORDER BY 1",
			"SELECT count(*), min(a.k) FROM mj a WHERE a.k NOT IN (SELECT kk FROM mk WHERE n = 3)",
			"SELECT b.w, count(*) FROM mk b JOIN mj a ON a.k = b.kk GROUP BY b.w HAVING count(*) > 30 ORDER BY 1",
			// A window partitioned by the key, per shard.
			"SELECT b.kk, b.n, sum(b.w) OVER (PARTITION BY a.k ORDER BY b.n), count(*) OVER (PARTITION BY b.kk) FROM mj a JOIN mk b ON b.kk = a.k ORDER BY 1, 2",
			// Set operations, whole per shard, each branch's reference
			// through its own tree's predicate.
			"SELECT k, v FROM mj UNION ALL SELECT kk, w FROM mk ORDER BY 1, 2",
			"SELECT k FROM mj EXCEPT SELECT kk FROM mk WHERE n = 2 ORDER BY 1",
			"SELECT kk FROM mk INTERSECT ALL SELECT k FROM mj ORDER BY 1",
			// Set operations in the final step: a row read twice would
			// count twice.
			"SELECT v % 7 FROM mj EXCEPT ALL SELECT w FROM mk ORDER BY 1",
			"SELECT v FROM mj INTERSECT ALL SELECT a.v FROM mj a JOIN mk b ON b.kk = a.k ORDER BY 1",
			"SELECT v % 5 AS r FROM mj UNION SELECT n FROM mk ORDER BY r",
			// Windows beside aggregates, in the aggregate's final step.
			"SELECT a.v % 7 AS g, count(*), rank() OVER (ORDER BY count(*) DESC, a.v % 7) FROM mj a JOIN mk b ON b.kk = a.k GROUP BY 1 ORDER BY 1",
			// CTEs over a tree, inlined: each reference inside them
			// through its own tree's predicate.
			"WITH t AS (SELECT kk, w FROM mk WHERE n > 1) SELECT count(*), sum(t.w) FROM mj a JOIN t ON t.kk = a.k",
			"WITH t AS (SELECT kk, w FROM mk) SELECT kk, w FROM t ORDER BY 1, 2",
			"WITH t AS (SELECT k FROM mj WHERE v % 2 = 0) SELECT count(*), max(b.kk) FROM mk b WHERE b.kk IN (SELECT k FROM t)",
		} {
			gotHead, got, err := queryTyped(t, c, sql, mode)
			if err != nil {
				t.Fatalf("%s (mode %v): %v", sql, mode, err)
			}
			wantHead, want, err := queryTyped(t, c, plain.ReplaceAllString(sql, "${1}_plain"), mode)
			if err != nil {
				t.Fatalf("%s on the plain tables: %v", sql, err)
			}
			if gotHead != wantHead || !slices.Equal(got, want) {
				t.Fatalf("%s (mode %v): through the trees %s %v, on the plain tables %s %v", sql, mode, gotHead, got, wantHead, want)
			}
		}
		// Writes over both trees without the key: the written table's part
		// writes only the shard's own slots, and each read reference reads
		// through its own predicate, so no row is written, returned or
		// inserted twice (an INSERT ... SELECT that read shard 0 whole
		// would insert shard 1's keys there too; a NOT EXISTS without the
		// written table's filter would delete shard 0's copies).
		onPlain := func(sql string) string { return plain.ReplaceAllString(sql, "${1}_plain") }
		for _, w := range []joinWrite{
			{sql: "UPDATE mk b SET w = b.w + a.v FROM mj a WHERE a.k = b.kk AND a.v % 3 = 0 RETURNING b.kk, b.n, b.w"},
			{sql: "DELETE FROM mj a USING mk b WHERE b.kk = a.k AND b.n = 3 RETURNING a.k, a.v"},
			{sql: "DELETE FROM mk b WHERE EXISTS (SELECT 1 FROM mj a WHERE a.k = b.kk AND a.v > $1) RETURNING kk, n", args: []any{350}},
			{sql: "UPDATE mj SET v = -v WHERE k IN (SELECT kk FROM mk WHERE w = 3) RETURNING k, v"},
			{sql: "WITH t AS (SELECT kk, w FROM mk WHERE n = 1) UPDATE mj a SET v = a.v + t.w FROM t WHERE t.kk = a.k RETURNING a.k, a.v"},
			// Rows that find no partner: only the written table's own
			// filter keeps the shard's copies of moved rows out.
			{sql: "DELETE FROM mk b WHERE NOT EXISTS (SELECT 1 FROM mj a WHERE a.k = b.kk AND a.v % 4 = 0) RETURNING kk, n"},
			{sql: "UPDATE mj SET v = v + 1000 WHERE k NOT IN (SELECT kk FROM mk WHERE n = 2) RETURNING k, v"},
			{sql: "INSERT INTO mk (kk, n, w) SELECT a.k, 10, a.v FROM mj a WHERE a.v % 5 = 0 RETURNING kk, n, w"},
		} {
			t.Run(fmt.Sprintf("%v/%s", mode, w.sql), func(t *testing.T) { w.compare(t, c, mode, onPlain) })
		}
	}
}
