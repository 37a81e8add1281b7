package router

import (
	"slices"
	"testing"
)

// TestSubqueryCallLevels checks which calls inside subqueries of a
// fan-out the proxy reads as possibly belonging to the outer SELECT: an
// aggregate among them makes the SELECT aggregating, and the rest go to
// the proxy's check for user-defined aggregates.
func TestSubqueryCallLevels(t *testing.T) {
	const join = ` FROM accounts a JOIN invoices i USING (account_id)`
	cases := []struct {
		sql     string
		outer   bool   // refused as an aggregating SELECT with a subquery
		call    string // a call the proxy checks in the catalog
		checked bool
	}{
		{sql: `SELECT (SELECT max(i.amount))` + join, outer: true},
		{sql: `SELECT (SELECT max(amount))` + join, outer: true},
		{sql: `SELECT (SELECT max(amount) FROM plans)` + join, outer: true},
		{sql: `SELECT (SELECT max(x.amount) FROM plans x)` + join, call: "max"},
		{sql: `SELECT (SELECT max(fee) FROM plans)` + join, call: "max"},
		{sql: `SELECT (SELECT count(*) FROM plans WHERE plans.id = a.plan_id)` + join, call: "count"},
		{sql: `SELECT (SELECT max((SELECT a.name FROM regions LIMIT 1)) FROM plans)` + join, outer: true},
		{sql: `SELECT (SELECT max((SELECT r.name FROM regions r LIMIT 1)) FROM plans)` + join, call: "max"},
		{sql: `SELECT (SELECT max(s.v) FROM (SELECT 1 AS v) s)` + join, call: "max"},
		{sql: `SELECT (SELECT max(v) FROM (SELECT 1 AS v) s)` + join, call: "max"},
		{sql: `SELECT (SELECT max(name) FROM (SELECT 1 AS v) s)` + join, outer: true},
		{sql: `SELECT (SELECT max(z) FROM plans x JOIN regions y USING (id))` + join, call: "max"},
		{sql: `SELECT (SELECT max(a.name) FROM (plans x JOIN regions y USING (id)) j)` + join, outer: true},
		{sql: `SELECT (SELECT my_total(i.amount))` + join, call: "my_total", checked: true},
		{sql: `SELECT (SELECT lower(a.name))` + join, call: "lower", checked: true},
		{sql: `SELECT (SELECT my_total(fee) FROM plans)` + join, call: "my_total"},
		{sql: `SELECT sku, (SELECT count(*) FROM plans) FROM catalogue`, call: "count"},
		{sql: `SELECT sku, (SELECT max(price) FROM plans) FROM catalogue`, outer: true},
		{sql: `SELECT (SELECT max(c.price)) FROM catalogue c`, outer: true},
		{sql: `SELECT sku, (SELECT my_total(c.qty)) FROM catalogue c`, call: "my_total", checked: true},
	}
	p := NewPlanner(100)
	for _, tc := range cases {
		t.Run(tc.sql, func(t *testing.T) {
			plans, err := p.Plan(tc.sql, testTrees(), 1)
			if err != nil || len(plans) != 1 {
				t.Fatalf("plan: %v %v", plans, err)
			}
			pl := plans[0]
			if tc.outer {
				if pl.Kind != Refused || pl.Err.Code != "0A000" {
					t.Fatalf("got %s, want refused as aggregating", pl)
				}
				return
			}
			if pl.Kind != FanOut || pl.Agg != nil {
				t.Fatalf("got %s %v, want a fan-out of rows", pl, pl.Err)
			}
			if got := slices.Contains(pl.Calls, tc.call); got != tc.checked {
				t.Fatalf("calls %v: %s checked %v, want %v", pl.Calls, tc.call, got, tc.checked)
			}
		})
	}
}
