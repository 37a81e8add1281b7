package pgshard

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

func TestNormalizeSpec(t *testing.T) {
	c, err := NewCluster([]Node{{Name: "n1", DSN: "postgres://u@h/shop"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.normalizeSpec(TreeSpec{Table: "t", KeyColumn: "k"})
	if err != nil {
		t.Fatal(err)
	}
	if want := (TreeSpec{Tenant: "shop", Table: "t", KeyColumn: "k", ShardCount: 64, SlotCount: 4096}); !reflect.DeepEqual(got, want) {
		t.Errorf("defaults: %+v, want %+v", got, want)
	}
	for _, tc := range []struct {
		spec TreeSpec
		code string
	}{
		{TreeSpec{Table: "", KeyColumn: "k"}, "22023"},
		{TreeSpec{Table: "t", KeyColumn: ""}, "22023"},
		{TreeSpec{Table: "lattice_owner", KeyColumn: "k"}, "42939"},
		{TreeSpec{Table: "t", KeyColumn: "k", ShardCount: -1}, "22023"},
		{TreeSpec{Table: "t", KeyColumn: "k", ShardCount: 4097}, "22023"},
		{TreeSpec{Table: "t", KeyColumn: "k", SlotCount: 1000}, "22023"},
		{TreeSpec{Table: "t", KeyColumn: "k", SlotCount: 1}, "22023"},
		{TreeSpec{Table: "t", KeyColumn: "k", SlotCount: 1 << 17}, "22023"},
		{TreeSpec{Table: "t", KeyColumn: "k", SlotCount: 32}, "22023"}, // default 64 shards > 32 slots
		{TreeSpec{Table: "t", KeyColumn: "k", SlotCount: 32, ShardCount: 32}, ""},
		{TreeSpec{Table: "t", KeyColumn: "k", SlotCount: 1 << 16, ShardCount: 1}, ""},
	} {
		_, err := c.normalizeSpec(tc.spec)
		if got := errCode(err); got != tc.code {
			t.Errorf("%+v: code %q (%v), want %q", tc.spec, got, err, tc.code)
		}
	}
}

func errCode(err error) string {
	var e *sqlstate.Error
	if errors.As(err, &e) {
		return e.Code
	}
	if err != nil {
		return "not *sqlstate.Error: " + err.Error()
	}
	return ""
}

// catalogue is a table that meets every rule, keyed by sku.
func catalogue() *tableInfo {
	return &tableInfo{
		Name: "catalogue", Kind: "r", Persistence: "p",
		Columns: []columnInfo{
			{Num: 1, Name: "sku", Type: "text", NotNull: true},
			{Num: 2, Name: "name", Type: "character varying(200)", NotNull: true, Default: "'unnamed'::character varying", Collation: `pg_catalog."C"`},
			{Num: 3, Name: "qty", Type: "integer", Default: "0"},
			{Num: 4, Name: "total", Type: "integer", Generated: "s", Default: "(qty * 2)"},
		},
		Constraints: []constraintInfo{
			{Name: "catalogue_pkey", Type: "p", Def: "PRIMARY KEY (sku)", Validated: true},
			{Name: "catalogue_name_key", Type: "u", Def: "UNIQUE (sku, name)", Validated: true},
			{Name: "catalogue_qty_check", Type: "c", Def: "CHECK ((qty >= 0))", Validated: true},
		},
		Indexes: []indexInfo{
			{Name: "catalogue_name_key", Unique: true, Valid: true, Constraint: true, Keys: []int16{1, 2},
				Def: "CREATE UNIQUE INDEX catalogue_name_key ON public.catalogue USING btree (sku, name)"},
			{Name: "catalogue_pkey", Unique: true, Primary: true, Valid: true, Constraint: true, Keys: []int16{1},
				Def: "CREATE UNIQUE INDEX catalogue_pkey ON public.catalogue USING btree (sku)"},
			{Name: "by name", Valid: true, Keys: []int16{0},
				Def:    `CREATE INDEX "by name" ON public.catalogue USING btree (lower((name)::text)) WHERE (qty > 0)`,
				Prefix: `CREATE INDEX "by name" ON public.catalogue USING `},
		},
	}
}

func TestCheckTable(t *testing.T) {
	for _, tc := range []struct {
		name   string
		key    string
		change func(ti *tableInfo)
		code   string
		msg    string
	}{
		{"ok", "sku", func(*tableInfo) {}, "", ""},
		{"view", "sku", func(ti *tableInfo) { ti.Kind = "v" }, "42809", `"catalogue" is not a table`},
		{"partitioned", "sku", func(ti *tableInfo) { ti.Kind = "p" }, "0A000", "partitioned"},
		{"already a tree", "sku", func(ti *tableInfo) { ti.Triggers = []string{"lattice_fence"} }, "42P07", `relation "catalogue" is already a tree`},
		{"inheritance", "sku", func(ti *tableInfo) { ti.Inherits = true }, "0A000", "inheritance"},
		{"unlogged", "sku", func(ti *tableInfo) { ti.Persistence = "u" }, "0A000", "unlogged"},
		{"missing key", "nope", func(*tableInfo) {}, "42703", `column "nope" of relation "catalogue" does not exist`},
		{"numeric key", "sku", func(ti *tableInfo) { ti.Columns[0].Type = "numeric(10,2)" }, "0A000", "type numeric(10,2)"},
		{"generated key", "total", func(ti *tableInfo) {}, "0A000", "generated"},
		{"nondeterministic key", "sku", func(ti *tableInfo) {
			ti.Columns[0].Nondeterministic, ti.Columns[0].Collation = true, `public.ci`
		}, "0A000", "nondeterministic"},
		{"serial key", "qty", func(ti *tableInfo) { ti.Columns[2].FromSequence = true }, "0A000", `shard key column "qty" takes its default from a sequence`},
		{"identity key", "qty", func(ti *tableInfo) { ti.Columns[2].Identity = "d" }, "0A000", `shard key column "qty" is an identity column`},
		{"serial column", "sku", func(ti *tableInfo) { ti.Columns[2].FromSequence = true }, "0A000", `column "qty" of "catalogue" takes its default`},
		{"key not in pk", "qty", func(ti *tableInfo) {}, "42P16", `shard key column "qty" is not part of the primary key`},
		{"no pk", "sku", func(ti *tableInfo) { ti.Indexes = ti.Indexes[:1] }, "42P16", "has no primary key"},
		{"unique without key", "sku", func(ti *tableInfo) { ti.Indexes[0].Keys = []int16{2} }, "42P16", `unique index "catalogue_name_key"`},
		{"key only in include", "sku", func(ti *tableInfo) { ti.Indexes[0].Keys = []int16{2} }, "42P16", "does not include"},
		{"unique expression", "sku", func(ti *tableInfo) { ti.Indexes[2].Unique = true }, "42P16", `unique index "by name"`},
		{"invalid index", "sku", func(ti *tableInfo) { ti.Indexes[2].Valid = false }, "55000", "invalid"},
		// The table's own foreign keys are checked by checkTreeForeignKey
		// (TestCheckTreeForeignKey), which knows the trees; unvalidated, here.
		{"fk out not valid", "sku", func(ti *tableInfo) {
			ti.Constraints = append(ti.Constraints, constraintInfo{Name: "fk", Type: "f", Outgoing: true, From: "catalogue", To: "makers", FromSQL: "catalogue"})
		}, "55000", `constraint "fk" of "catalogue" is not validated`},
		{"fk in", "sku", func(ti *tableInfo) {
			ti.Constraints = append(ti.Constraints, constraintInfo{Name: "fk", Type: "f", Validated: true, From: "orders", To: "catalogue", FromSQL: "orders"})
		}, "0A000", `foreign key "fk" of table "orders" references "catalogue"`},
		{"exclusion", "sku", func(ti *tableInfo) {
			ti.Constraints = append(ti.Constraints, constraintInfo{Name: "ex", Type: "x", Validated: true})
		}, "0A000", "exclusion"},
		{"not valid", "sku", func(ti *tableInfo) { ti.Constraints[2].Validated = false }, "55000", "not validated"},
		{"trigger", "sku", func(ti *tableInfo) { ti.Triggers = []string{"audit"} }, "0A000", `trigger "audit"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ti := catalogue()
			tc.change(ti)
			kt, err := checkTable(ti, tc.key)
			if got := errCode(err); got != tc.code {
				t.Fatalf("code %q (%v), want %q", got, err, tc.code)
			}
			if err != nil && !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("message %q, want it to contain %q", err.Error(), tc.msg)
			}
			if err == nil && kt != shardmap.KeyText {
				t.Errorf("key type %s", kt)
			}
		})
	}
}

func TestBuildDDL(t *testing.T) {
	ti := catalogue()
	ti.Options = []string{"fillfactor=90", "autovacuum_enabled=false"}
	got, err := buildDDL(ti)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		`CREATE TABLE {{table}} (
    "sku" text NOT NULL,
    "name" character varying(200) COLLATE pg_catalog."C" DEFAULT 'unnamed'::character varying NOT NULL,
    "qty" integer DEFAULT 0,
    "total" integer GENERATED ALWAYS AS ((qty * 2)) STORED,
    CONSTRAINT "catalogue_pkey" PRIMARY KEY (sku),
    CONSTRAINT "catalogue_name_key" UNIQUE (sku, name),
    CONSTRAINT "catalogue_qty_check" CHECK ((qty >= 0))
) WITH (fillfactor = '90', autovacuum_enabled = 'false')`,
		`CREATE INDEX "by name" ON {{table}} USING btree (lower((name)::text)) WHERE (qty > 0)`,
	}
	if !slices.Equal(got, want) {
		t.Errorf("DDL:\n%s\nwant:\n%s", strings.Join(got, ";\n"), strings.Join(want, ";\n"))
	}

	ti.Indexes[2].Def = `CREATE INDEX "by name" ON public.other USING btree (name)`
	if _, err := buildDDL(ti); err == nil {
		t.Error("an index definition that does not match its prefix was accepted")
	}
}

func TestBuildDDLUniqueIndex(t *testing.T) {
	ti := catalogue()
	ti.Indexes = append(ti.Indexes, indexInfo{Name: "u", Unique: true, Valid: true, Keys: []int16{1, 3},
		Def:    `CREATE UNIQUE INDEX u ON public.catalogue USING btree (sku, qty) INCLUDE (name)`,
		Prefix: `CREATE UNIQUE INDEX u ON public.catalogue USING `})
	got, err := buildDDL(ti)
	if err != nil {
		t.Fatal(err)
	}
	if want := `CREATE UNIQUE INDEX "u" ON {{table}} USING btree (sku, qty) INCLUDE (name)`; got[len(got)-1] != want {
		t.Errorf("got %s, want %s", got[len(got)-1], want)
	}
}

func TestCopyColumns(t *testing.T) {
	if got := copyColumns(catalogue()); got != `"sku", "name", "qty"` {
		t.Errorf("copyColumns = %s", got)
	}
}
