package pgshard

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestTenantRole(t *testing.T) {
	long := strings.Repeat("t", 63)
	for _, c := range []struct{ tenant, want string }{
		{"lattice", "lattice_lattice"},
		{"shop", "lattice_shop"},
		{long, "lattice_" + strings.Repeat("t", 46) + "_"},
	} {
		got := TenantRole(c.tenant)
		if !strings.HasPrefix(got, c.want) || len(got) > 63 {
			t.Errorf("TenantRole(%q) = %q, want %q... within 63 bytes", c.tenant, got, c.want)
		}
	}
	if TenantRole(long) == TenantRole(long[:62]+"u") {
		t.Error("two long tenant names share a role")
	}
}

// Client sessions connect as the tenant's role, never with the control
// role's password.
func TestClientDSN(t *testing.T) {
	for _, dsn := range []string{
		"postgres://control:secret@db1:5432/lattice?sslmode=disable",
		"host=db1 port=5432 user=control password=secret dbname=lattice",
	} {
		c, err := NewCluster([]Node{{Name: "n1", DSN: dsn, Password: "flag-secret"}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		c.SetPassfile("/etc/lattice/pgpass")
		got, err := c.ClientDSN("n1", "shop")
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := pgconn.ParseConfig(got)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.User != "lattice_shop" || cfg.Database != "shop" || strings.Contains(got, "secret") || !strings.Contains(got, "passfile") {
			t.Errorf("ClientDSN(%q) = %q: user %q, database %q", dsn, got, cfg.User, cfg.Database)
		}
	}
}
