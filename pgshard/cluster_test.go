package pgshard

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestNewClusterValidates(t *testing.T) {
	for _, tc := range []struct {
		name  string
		nodes []Node
		want  string
	}{
		{"none", nil, "at least one node"},
		{"unnamed", []Node{{DSN: "postgres://u@h/db"}}, "has no name"},
		{"duplicate", []Node{{Name: "n1", DSN: "postgres://u@h/db"}, {Name: "n1", DSN: "postgres://u@h2/db"}}, "used twice"},
		{"bad dsn", []Node{{Name: "n1", DSN: "postgres://u@h:notaport/db"}}, "node n1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewCluster(tc.nodes, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to mention %q", err, tc.want)
			}
		})
	}
}

func TestClusterNodes(t *testing.T) {
	c, err := NewCluster([]Node{
		{Name: "n1", DSN: "postgres://lattice@10.0.0.5:5432/shop?sslmode=disable"},
		{Name: "n2", DSN: "host=10.0.0.6 user=lattice dbname=other"},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := c.Catalog().Name; got != "n1" {
		t.Errorf("Catalog = %s", got)
	}
	if got := c.DefaultTenant(); got != "shop" {
		t.Errorf("DefaultTenant = %q, want shop", got)
	}
	if n, ok := c.Node("n2"); !ok || n.DSN != "host=10.0.0.6 user=lattice dbname=other" {
		t.Errorf("Node(n2) = %v, %v", n, ok)
	}
	if _, ok := c.Node("n3"); ok {
		t.Error("Node(n3) found")
	}
	if got := strings.Join(c.NodeNames(), ","); got != "n1,n2" {
		t.Errorf("NodeNames = %s", got)
	}
	if _, err := c.TenantDSN("n3", "x"); err == nil {
		t.Error("TenantDSN of an unknown node succeeded")
	}
	if _, err := c.TenantDSN("n1", ""); err == nil {
		t.Error("TenantDSN of an empty tenant succeeded")
	}
}

func TestDefaultTenantFromUser(t *testing.T) {
	c, err := NewCluster([]Node{{Name: "n1", DSN: "host=h user=alice"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.DefaultTenant(); got != "alice" {
		t.Errorf("DefaultTenant = %q, want the user name", got)
	}
}

func TestWithDatabase(t *testing.T) {
	for _, tc := range []struct {
		dsn, db, want string
	}{
		{"postgres://u:p@h:5432/lattice?sslmode=disable", "shop", "postgres://u:p@h:5432/shop?sslmode=disable"},
		{"postgresql://u@h", "shop", "postgresql://u@h/shop"},
		{"postgres://u@h/x?dbname=y&sslmode=disable", "shop", "postgres://u@h/shop?sslmode=disable"},
		{"postgres://u@h/x", "my db/1", "postgres://u@h/my%20db/1"},
		{"host=h user=u dbname=lattice", "shop", "host=h user=u dbname=lattice dbname='shop'"},
		{"host=h user=u", `it's\`, `host=h user=u dbname='it\'s\\'`},
		{"", "shop", "dbname='shop'"},
	} {
		got, err := withDatabase(tc.dsn, tc.db)
		if err != nil {
			t.Errorf("withDatabase(%q, %q): %v", tc.dsn, tc.db, err)
			continue
		}
		if got != tc.want {
			t.Errorf("withDatabase(%q, %q) = %q, want %q", tc.dsn, tc.db, got, tc.want)
		}
		cfg, err := pgconn.ParseConfig(got)
		if err != nil || cfg.Database != tc.db {
			t.Errorf("%q parses to database %q, %v", got, cfg.Database, err)
		}
	}
}

func TestAdminAfterClose(t *testing.T) {
	c, err := NewCluster([]Node{{Name: "n1", DSN: "postgres://u@127.0.0.1:1/db"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	p1, err := c.Admin(t.Context(), "n1", "a")
	if err != nil {
		t.Fatal(err)
	}
	if p2, _ := c.Admin(t.Context(), "n1", "a"); p2 != p1 {
		t.Error("Admin did not cache the pool")
	}
	if p3, _ := c.Admin(t.Context(), "n1", "b"); p3 == p1 {
		t.Error("two tenants share a pool")
	}
	c.Close()
	if _, err := c.Admin(t.Context(), "n1", "a"); err != ErrClusterClosed {
		t.Errorf("Admin after Close: %v", err)
	}
}
