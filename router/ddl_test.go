package router

import (
	"strings"
	"testing"
)

// TestDDLRender checks what each tree's table gets: the statement with the
// tree qualified by the shard schema (and by public for the template) at
// its token, and the DDL log entry for shards created later.
func TestDDLRender(t *testing.T) {
	cases := []struct {
		sql     string
		op      DDLOp
		tree    string // "" for DROP INDEX, whose table the proxy finds
		render  string // for schema lattice_s0007
		public  string // for the template; "" when the same as render with public
		log     string
		conc    bool
		tag     string
		errCode string
	}{
		{sql: `ALTER TABLE catalogue ADD COLUMN color text`, op: DDLAlter, tree: "catalogue",
			render: `ALTER TABLE lattice_s0007.catalogue ADD COLUMN color text`,
			public: `ALTER TABLE public.catalogue ADD COLUMN color text`,
			log:    `ALTER TABLE {{table}} ADD COLUMN color text`, tag: "ALTER TABLE"},
		{sql: `alter table if exists public . catalogue /* c */ alter column qty set not null`, op: DDLAlter, tree: "catalogue",
			render: `alter table if exists lattice_s0007.catalogue /* c */ alter column qty set not null`,
			log:    `alter table if exists {{table}} /* c */ alter column qty set not null`, tag: "ALTER TABLE"},
		{sql: `ALTER TABLE "MixedCase" RENAME COLUMN v TO w`, op: DDLAlter, tree: "MixedCase",
			render: `ALTER TABLE lattice_s0007."MixedCase" RENAME COLUMN v TO w`,
			log:    `ALTER TABLE {{table}} RENAME COLUMN v TO w`, tag: "ALTER TABLE"},
		{sql: `ALTER TABLE orders ADD CONSTRAINT ex EXCLUDE USING gist (id WITH =, customer WITH <>)`, op: DDLAlter, tree: "orders",
			render: `ALTER TABLE lattice_s0007.orders ADD CONSTRAINT ex EXCLUDE USING gist (id WITH =, customer WITH <>)`,
			log:    `ALTER TABLE {{table}} ADD CONSTRAINT ex EXCLUDE USING gist (id WITH =, customer WITH <>)`, tag: "ALTER TABLE"},
		{sql: `CREATE INDEX CONCURRENTLY IF NOT EXISTS c_name ON catalogue USING btree (name) WHERE qty > 0`, op: DDLCreateIndex, tree: "catalogue", conc: true,
			render: `CREATE INDEX CONCURRENTLY IF NOT EXISTS c_name ON lattice_s0007.catalogue USING btree (name) WHERE qty > 0`,
			log:    `CREATE INDEX IF NOT EXISTS c_name ON {{table}} USING btree (name) WHERE qty > 0`, tag: "CREATE INDEX"},
		{sql: `CREATE UNIQUE INDEX ON catalogue (name, sku)`, op: DDLCreateIndex, tree: "catalogue",
			render: `CREATE UNIQUE INDEX ON lattice_s0007.catalogue (name, sku)`,
			log:    `CREATE UNIQUE INDEX ON {{table}} (name, sku)`, tag: "CREATE INDEX"},
		{sql: `DROP INDEX CONCURRENTLY IF EXISTS "C_Name" CASCADE`, op: DDLDropIndex, conc: true,
			render: `DROP INDEX CONCURRENTLY IF EXISTS lattice_s0007."C_Name" CASCADE`,
			public: `DROP INDEX CONCURRENTLY IF EXISTS public."C_Name" CASCADE`,
			log:    `DROP INDEX IF EXISTS {{schema}}."C_Name" CASCADE`, tag: "DROP INDEX"},
		{sql: `TRUNCATE TABLE catalogue RESTART IDENTITY`, op: DDLTruncate, tree: "catalogue",
			render: `TRUNCATE TABLE lattice_s0007.catalogue RESTART IDENTITY`, tag: "TRUNCATE TABLE"},
		{sql: `DROP TABLE IF EXISTS catalogue`, op: DDLDropTable, tree: "catalogue", tag: "DROP TABLE"},

		{sql: `ALTER TABLE catalogue DROP COLUMN sku`, errCode: "0A000"},
		{sql: `ALTER TABLE catalogue ADD UNIQUE (name)`, errCode: "42P16"},
		{sql: `CREATE UNIQUE INDEX u ON catalogue (lower(sku))`, errCode: "42P16"},
		{sql: `ALTER TABLE orders ADD EXCLUDE USING gist (id WITH <>)`, errCode: "42P16"},
		{sql: `ALTER TABLE catalogue ADD COLUMN n int DEFAULT nextval('s')`, errCode: "0A000"},
		{sql: `ALTER TABLE catalogue RENAME TO x`, errCode: "0A000"},
		{sql: `ALTER TABLE catalogue OWNER TO bob`, errCode: "0A000"},
		{sql: `CREATE TABLE x (id int, FOREIGN KEY (id) REFERENCES public.orders (total))`, errCode: "0A000"}, // not the tree's key (on its key: golden, Catalog)

		// Foreign keys (foreignkey.go): within a colocation group on the
		// paired keys, or to a reference table.
		{sql: `ALTER TABLE invoices ADD CONSTRAINT inv_acct FOREIGN KEY (account_id) REFERENCES accounts (account_id) ON DELETE CASCADE`, op: DDLAlter, tree: "invoices",
			render: `ALTER TABLE lattice_s0007.invoices ADD CONSTRAINT inv_acct FOREIGN KEY (account_id) REFERENCES lattice_s0007.accounts (account_id) ON DELETE CASCADE`,
			public: `ALTER TABLE public.invoices ADD CONSTRAINT inv_acct FOREIGN KEY (account_id) REFERENCES public.accounts (account_id) ON DELETE CASCADE`,
			log:    `ALTER TABLE {{table}} ADD CONSTRAINT inv_acct FOREIGN KEY (account_id) REFERENCES {{schema}}.accounts (account_id) ON DELETE CASCADE`, tag: "ALTER TABLE"},
		{sql: `alter table public.payments add foreign key (invoice_id, acct) references invoices(invoice_id, account_id)`, op: DDLAlter, tree: "payments",
			render: `alter table lattice_s0007.payments add foreign key (invoice_id, acct) references lattice_s0007.invoices(invoice_id, account_id)`,
			public: `alter table public.payments add foreign key (invoice_id, acct) references public.invoices(invoice_id, account_id)`,
			log:    `alter table {{table}} add foreign key (invoice_id, acct) references {{schema}}.invoices(invoice_id, account_id)`, tag: "ALTER TABLE"},
		{sql: `ALTER TABLE accounts ADD FOREIGN KEY (plan_id) REFERENCES plans (plan_id)`, op: DDLAlter, tree: "accounts",
			render: `ALTER TABLE lattice_s0007.accounts ADD FOREIGN KEY (plan_id) REFERENCES public.plans (plan_id)`,
			log:    `ALTER TABLE {{table}} ADD FOREIGN KEY (plan_id) REFERENCES public.plans (plan_id)`, tag: "ALTER TABLE"},
		{sql: `ALTER TABLE invoices ADD FOREIGN KEY (invoice_id) REFERENCES accounts (account_id)`, errCode: "0A000"}, // keys not paired
		{sql: `ALTER TABLE invoices ADD FOREIGN KEY (account_id) REFERENCES accounts`, errCode: "0A000"},              // referenced columns not named
		{sql: `ALTER TABLE invoices ADD FOREIGN KEY (account_id) REFERENCES orders (id)`, errCode: "0A000"},           // not colocated
		{sql: `ALTER TABLE invoices ADD FOREIGN KEY (account_id) REFERENCES customers (id)`, errCode: "0A000"},        // an ordinary table
		{sql: `ALTER TABLE invoices ADD FOREIGN KEY (account_id) REFERENCES accounts (account_id) ON DELETE SET NULL`, errCode: "0A000"},
		{sql: `ALTER TABLE invoices ADD FOREIGN KEY (account_id) REFERENCES accounts (account_id) ON UPDATE CASCADE`, errCode: "0A000"},
		{sql: `ALTER TABLE accounts ADD FOREIGN KEY (plan_id) REFERENCES plans (plan_id) ON DELETE CASCADE`, errCode: "0A000"},
		{sql: `ALTER TABLE invoices ADD COLUMN n int, ADD FOREIGN KEY (account_id) REFERENCES accounts (account_id)`, errCode: "0A000"},
		{sql: `ALTER TABLE plans ADD FOREIGN KEY (plan_id) REFERENCES accounts (account_id)`, errCode: "0A000"}, // reference table to a tree
	}
	for _, tc := range cases {
		t.Run(tc.sql, func(t *testing.T) {
			p := planOne(t, tc.sql)
			if tc.errCode != "" {
				if p.Kind != Refused || p.Err.Code != tc.errCode {
					t.Fatalf("plan %s, want Refused %s", p, tc.errCode)
				}
				if p.Err.Hint == "" {
					t.Errorf("refusal without a hint: %s", p)
				}
				return
			}
			if p.Kind != DDL || p.DDL.Op != tc.op || p.DDL.Concurrently != tc.conc || p.Tag != tc.tag {
				t.Fatalf("plan %s, want DDL op=%s concurrently=%v tag=%s", p, tc.op, tc.conc, tc.tag)
			}
			if got := ""; p.Tree != nil {
				got = p.Tree.Name
				if got != tc.tree {
					t.Errorf("tree %q, want %q", got, tc.tree)
				}
			} else if tc.tree != "" {
				t.Errorf("no tree, want %q", tc.tree)
			}
			if tc.render != "" {
				if got := p.RenderDDL("lattice_s0007"); got != tc.render {
					t.Errorf("render\n got %s\nwant %s", got, tc.render)
				}
				want := tc.public
				if want == "" {
					want = strings.Replace(tc.render, "lattice_s0007", "public", 1)
				}
				if got := p.RenderDDL("public"); got != want {
					t.Errorf("template\n got %s\nwant %s", got, want)
				}
			}
			if got := p.DDL.Log(); got != tc.log {
				t.Errorf("log\n got %q\nwant %q", got, tc.log)
			}
		})
	}
}
