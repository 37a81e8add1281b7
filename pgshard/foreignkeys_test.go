package pgshard

import (
	"strings"
	"testing"

	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

func TestCheckTreeForeignKey(t *testing.T) {
	orders := &shardmap.Tree{Name: "orders", KeyColumn: "cid", Group: "customers"}
	customers := &shardmap.Tree{Name: "customers", KeyColumn: "customer_id"}
	lone := &shardmap.Tree{Name: "lone", KeyColumn: "customer_id"}
	fk := func(to string, fkCols, pkCols []string, del, upd string) constraintInfo {
		return constraintInfo{Name: "fk", Type: "f", Outgoing: true, From: "orders", To: to, FkCols: fkCols, PkCols: pkCols,
			DelAction: del, UpdAction: upd, MatchType: "s", Validated: true}
	}
	keyed := []string{"cid", "order_id"}
	for _, tc := range []struct {
		name  string
		group string
		con   constraintInfo
		to    fkTarget
		hint  string // "" means allowed
	}{
		{"colocated, keys paired", "customers", fk("customers", []string{"cid"}, []string{"customer_id"}, "c", "a"), fkTarget{tree: customers}, ""},
		{"to itself, keys paired", "customers", fk("orders", keyed, []string{"cid", "parent"}, "a", "r"), fkTarget{self: true}, ""},
		{"reference table", "customers", fk("plans", []string{"plan_id"}, []string{"plan_id"}, "r", "a"), fkTarget{reference: true}, ""},
		{"a group of its own", "", fk("customers", []string{"cid"}, []string{"customer_id"}, "a", "a"), fkTarget{tree: customers}, "colocate_with"},
		{"another group", "customers", fk("lone", []string{"cid"}, []string{"customer_id"}, "a", "a"), fkTarget{tree: lone}, "colocate_with"},
		{"an ordinary table", "customers", fk("loose", []string{"x"}, []string{"id"}, "a", "a"), fkTarget{}, "lattice_create_reference_table"},
		{"keys not paired", "customers", fk("customers", []string{"order_id"}, []string{"customer_id"}, "a", "a"), fkTarget{tree: customers}, "FOREIGN KEY (cid, ...)"},
		{"keys crossed", "customers", fk("customers", []string{"order_id", "cid"}, []string{"customer_id", "x"}, "a", "a"), fkTarget{tree: customers}, "as a pair"},
		{"to itself, not paired", "customers", fk("orders", []string{"order_id"}, []string{"cid"}, "a", "a"), fkTarget{self: true}, "as a pair"},
		{"SET NULL", "customers", fk("customers", []string{"cid"}, []string{"customer_id"}, "n", "a"), fkTarget{tree: customers}, "NO ACTION or RESTRICT"},
		{"ON UPDATE CASCADE", "customers", fk("customers", []string{"cid"}, []string{"customer_id"}, "a", "c"), fkTarget{tree: customers}, "NO ACTION or RESTRICT"},
		{"cascade from a reference table", "customers", fk("plans", []string{"plan_id"}, []string{"plan_id"}, "c", "a"), fkTarget{reference: true}, "NO ACTION or RESTRICT"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkTreeForeignKey(orders, tc.group, tc.con, tc.to)
			switch {
			case tc.hint == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.hint != "" && (errCode(err) != "0A000" || !strings.Contains(sqlstate.As(err).Hint, tc.hint)):
				t.Fatalf("%v (hint %q), want 0A000 with a hint naming %q", err, sqlstate.As(err).Hint, tc.hint)
			}
		})
	}
}

func TestForeignKeyStatement(t *testing.T) {
	con := constraintInfo{Name: "Items Order", FkCols: []string{"cid", "order_id"}, PkCols: []string{"cid", "order_id"},
		DelAction: "c", UpdAction: "r", MatchType: "f", Deferrable: true, InitiallyDeferred: true, To: "orders"}
	for _, tc := range []struct {
		to   fkTarget
		want string
	}{
		{fkTarget{tree: &shardmap.Tree{Name: "orders"}}, `ALTER TABLE {{table}} ADD CONSTRAINT "Items Order" FOREIGN KEY ("cid", "order_id") REFERENCES {{schema}}."orders" ("cid", "order_id") MATCH FULL ON UPDATE RESTRICT ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED`},
		{fkTarget{self: true}, `ALTER TABLE {{table}} ADD CONSTRAINT "Items Order" FOREIGN KEY ("cid", "order_id") REFERENCES {{table}} ("cid", "order_id") MATCH FULL ON UPDATE RESTRICT ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED`},
		{fkTarget{reference: true}, `ALTER TABLE {{table}} ADD CONSTRAINT "Items Order" FOREIGN KEY ("cid", "order_id") REFERENCES "public"."orders" ("cid", "order_id") MATCH FULL ON UPDATE RESTRICT ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED`},
	} {
		if got := foreignKeyStatement(con, tc.to); got != tc.want {
			t.Errorf("got  %s\nwant %s", got, tc.want)
		}
	}
	plain := constraintInfo{Name: "fk", FkCols: []string{"plan_id"}, PkCols: []string{"plan_id"}, DelAction: "a", UpdAction: "a", MatchType: "s", To: "plans"}
	if got, want := foreignKeyStatement(plain, fkTarget{reference: true}), `ALTER TABLE {{table}} ADD CONSTRAINT "fk" FOREIGN KEY ("plan_id") REFERENCES "public"."plans" ("plan_id")`; got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}
