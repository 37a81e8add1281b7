package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestReferenceGrants: GRANT and REVOKE on a reference table through the
// proxy change every node's copy, whether they name the table or all the
// tables of public (which PostgreSQL expands on the node it runs on), in
// both protocols; a grant to a role one node lacks changes no copy. A copy
// made later gets the grants the catalog copy has. GRANT on a tree stays
// refused with a hint.
func TestReferenceGrants(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := connect(t, p.DSN("lattice"))
	nodes := []*pgx.Conn{connect(t, testNodeDSN(t, 0)), connect(t, testNodeDSN(t, 1)), connect(t, testNodeDSN(t, 2))}
	for i, n := range nodes {
		mustExec(t, n, `DO $$BEGIN CREATE ROLE grant_reader NOLOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END$$`)
		if i == 0 {
			mustExec(t, n, `DO $$BEGIN CREATE ROLE grant_partial NOLOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END$$`)
		}
	}
	for _, q := range []string{
		// Grants made before the table is a reference table: its copies
		// get them (lattice_add_node builds a copy the same way).
		`CREATE TABLE plans (plan_id int PRIMARY KEY, name text)`,
		`GRANT SELECT ON plans TO grant_reader`,
		`GRANT UPDATE (name) ON plans TO grant_reader WITH GRANT OPTION`,
		`SELECT lattice_create_reference_table('plans')`,
		`CREATE TABLE loose (id int PRIMARY KEY)`,
		`CREATE TABLE cat (k bigint PRIMARY KEY)`,
		`SELECT lattice_create_tree('cat', 'k', shard_count => 3)`,
	} {
		mustExec(t, c, q)
	}
	// privileges reads, per node, whether grant_reader may select from plans.
	privileges := func() string {
		var out []bool
		for _, n := range nodes {
			var ok bool
			if err := n.QueryRow(ctx, `SELECT has_table_privilege('grant_reader', 'public.plans', 'SELECT')`).Scan(&ok); err != nil {
				t.Fatal(err)
			}
			out = append(out, ok)
		}
		return fmt.Sprint(out)
	}
	if got := privileges(); got != "[true true true]" {
		t.Errorf("grant_reader may read plans on the nodes after lattice_create_reference_table: %s, want it everywhere, as granted before", got)
	}
	for i, n := range nodes {
		var col bool
		if err := n.QueryRow(ctx, `SELECT has_column_privilege('grant_reader', 'public.plans', 'name', 'UPDATE WITH GRANT OPTION')`).Scan(&col); err != nil || !col {
			t.Errorf("node %d: grant_reader may update plans.name with grant option: %v, %v; want true, as granted before", i, col, err)
		}
	}
	mustExec(t, c, `REVOKE ALL ON plans FROM grant_reader`)
	mustExec(t, c, `REVOKE ALL (name) ON plans FROM grant_reader`)
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeExec} {
		for _, step := range []struct{ sql, want string }{
			{`GRANT SELECT ON plans TO grant_reader`, "[true true true]"},
			{`REVOKE SELECT ON plans FROM grant_reader`, "[false false false]"},
			{`GRANT SELECT ON ALL TABLES IN SCHEMA public TO grant_reader`, "[true true true]"},
			{`REVOKE ALL ON ALL TABLES IN SCHEMA public FROM grant_reader`, "[false false false]"},
		} {
			if _, err := c.Exec(ctx, step.sql, mode); err != nil {
				t.Fatalf("%v: %s: %v", mode, step.sql, err)
			}
			if got := privileges(); got != step.want {
				t.Errorf("%v: after %s, grant_reader may read plans on the nodes: %s, want %s", mode, step.sql, got, step.want)
			}
		}
	}
	// All the tables of public on the catalog node: its ordinary tables too.
	mustExec(t, c, `GRANT SELECT ON ALL TABLES IN SCHEMA public TO grant_reader`)
	var loose bool
	if err := nodes[0].QueryRow(ctx, `SELECT has_table_privilege('grant_reader', 'public.loose', 'SELECT')`).Scan(&loose); err != nil || !loose {
		t.Errorf("grant_reader may read the ordinary table loose: %v, %v; want true", loose, err)
	}
	mustExec(t, c, `REVOKE ALL ON ALL TABLES IN SCHEMA public FROM grant_reader`)

	// A role only the catalog node has: the grant fails whole.
	for _, q := range []string{`GRANT SELECT ON plans TO grant_partial`, `GRANT SELECT ON ALL TABLES IN SCHEMA public TO grant_partial`} {
		if _, err := c.Exec(ctx, q); sqlStateOf(err) != "42704" {
			t.Errorf("%s: %v, want 42704 from the nodes without the role", q, err)
		}
	}
	var partial bool
	if err := nodes[0].QueryRow(ctx, `SELECT has_table_privilege('grant_partial', 'public.plans', 'SELECT')`).Scan(&partial); err != nil || partial {
		t.Errorf("grant_partial may read the catalog copy of plans after the failed grants: %v, %v", partial, err)
	}

	if _, err := c.Exec(ctx, `GRANT SELECT ON cat TO grant_reader`); sqlStateOf(err) != "0A000" || hintOf(err) == "" {
		t.Errorf("GRANT on a tree: %v (hint %q), want 0A000 with a hint", err, hintOf(err))
	}
}
