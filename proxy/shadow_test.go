package proxy

import "testing"

// TestNamesRelation finds a bare name as an identifier of its own, in any
// case and quoted, but not qualified nor inside a longer identifier.
func TestNamesRelation(t *testing.T) {
	for _, c := range []struct {
		sql  string
		want bool
	}{
		{`SELECT * FROM orders WHERE id = 1`, true},
		{`select * from ORDERS`, true},
		{`SELECT * FROM "orders"`, true},
		{`SELECT * FROM orders`, true},
		{`UPDATE orders SET v = 1`, true},
		{`SELECT * FROM a JOIN orders o ON o.id = a.id`, true},
		{`SELECT * FROM public.orders`, false},
		{`SELECT * FROM other.orders`, false},
		{`SELECT * FROM "public"."orders"`, false},
		{`SELECT * FROM orders_2024`, false},
		{`SELECT * FROM old_orders`, false},
		{`SELECT * FROM orders$1`, false},
		{`SELECT 1`, false},
	} {
		if got := namesRelation(c.sql, "orders"); got != c.want {
			t.Errorf("%s: %v, want %v", c.sql, got, c.want)
		}
	}
}
