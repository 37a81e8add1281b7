package integration

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lattice-db/lattice/pgshard"
)

// externalProxyEnv and externalNodeEnv point TestHostileClientExternal at
// a running deployment. With externalProxyEnv set, TestMain starts no
// servers, so that test runs alone.
const (
	externalProxyEnv = "LATTICE_HOSTILE_PROXY_DSN"
	externalNodeEnv  = "LATTICE_HOSTILE_NODE_DSN"
)

// TestHostileClientExternal runs TestHostileClient's attacks against a
// proxy that is already running, such as `lattice demo`:
//
//	LATTICE_HOSTILE_PROXY_DSN='postgres://lattice@127.0.0.1:6432/lattice?sslmode=disable' \
//	LATTICE_HOSTILE_NODE_DSN='postgres://lattice@127.0.0.1:PORT/lattice?sslmode=disable' \
//	go test -count=1 -run '^TestHostileClientExternal$' -v ./integration
//
// The proxy DSN is a user of the tenant that attacks (its database). The
// node DSN, optional, is the catalog node (n1) as the control role, as the
// demo's log prints it: with it the attacks also run as the tenant's role
// on the node (its password, if the node asks for one, from PGPASSFILE),
// and the fence's attack arms a slot fence. Another tenant is the node's
// postgres database.
func TestHostileClientExternal(t *testing.T) {
	proxyDSN := os.Getenv(externalProxyEnv)
	if proxyDSN == "" {
		t.Skip("set " + externalProxyEnv + " to attack a running proxy")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	client := connect(t, proxyDSN)
	h := hostileTenant{db: client.Config().Database, client: client}
	other, otherRole := "postgres", "postgres"
	if nodeDSN := os.Getenv(externalNodeEnv); nodeDSN != "" {
		cl, err := pgshard.NewCluster([]pgshard.Node{{Name: "n1", DSN: nodeDSN}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cl.Close)
		h.cluster = cl
		cfg, err := pgx.ParseConfig(nodeDSN)
		if err != nil {
			t.Fatal(err)
		}
		// The control role's sessions (presence, and this test's) are
		// another role's backends on the node.
		otherRole = cfg.User
		dsn, err := cl.ClientDSN("n1", h.db)
		if err != nil {
			t.Fatal(err)
		}
		direct, err := pgx.Connect(ctx, dsn) // a password from PGPASSFILE, as for the proxy
		if err != nil {
			t.Fatalf("the tenant's role on the node: %v", err)
		}
		t.Cleanup(func() { direct.Close(context.Background()) })
		h.direct = direct
	}
	h.setup(t, ctx)
	h.attack(t, ctx, other, otherRole)
}
