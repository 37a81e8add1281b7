package integration

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lattice-db/lattice/pgshard"
)

// TestPresenceCountsOwnRole: a freeze counts as a proxy's presence only a
// session of the control role with a presence name. A tenant's role that
// reaches a node with such an application_name (from a function body, or
// around the proxy) is not taken for a proxy cut off from Redis, which
// would make every freeze wait out its budget (issue 17, item 4).
func TestPresenceCountsOwnRole(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const cluster, imposter = "presence-test", "lattice_presence_imposter"
	admin := connect(t, testNodeDSN(t, 0))
	mustExec(t, admin, `DROP ROLE IF EXISTS `+imposter)
	mustExec(t, admin, `CREATE ROLE `+imposter+` LOGIN`)
	t.Cleanup(func() {
		if c, err := pgx.Connect(context.Background(), testNodeDSN(t, 0)); err == nil {
			c.Exec(context.Background(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '`+imposter+`'`)
			c.Exec(context.Background(), `DROP ROLE IF EXISTS `+imposter)
			c.Close(context.Background())
		}
	})
	named := func(user, name string) *pgx.Conn {
		cfg, err := pgx.ParseConfig(testNodeDSN(t, 0))
		if err != nil {
			t.Fatal(err)
		}
		if user != "" {
			cfg.User = user
		}
		cfg.RuntimeParams["application_name"] = name
		c, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatalf("connect as %q: %v", user, err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		return c
	}
	proxy, fake := pgshard.PresenceName(cluster, "real"), pgshard.PresenceName(cluster, "fake")
	named("", proxy)
	named(imposter, fake)

	got, err := ctCluster(t, 1).Present(ctx, cluster, "n1")
	if err != nil {
		t.Fatal(err)
	}
	if !got[proxy] || got[fake] || len(got) != 1 {
		t.Fatalf("present: %v; want only %q, the control role's session (not %s's %q)", got, proxy, imposter, fake)
	}
}

// TestPresentAfterLookConnectionEnds: the connection a node's looks keep
// is never pinged before a look, so a look that finds it ended (the node
// restarted, or ended the session) opens a new one and looks again, and
// the freeze waiting for it does not fail.
func TestPresentAfterLookConnectionEnds(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const cluster = "present-look-ends"
	c := ctCluster(t, 1)
	c.WarmPresence(ctx, cluster)
	admin := connect(t, testNodeDSN(t, 0))
	var ended int
	if err := admin.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
WHERE pid <> pg_backend_pid() AND application_name = 'lattice-admin' AND query LIKE '%FROM pg_stat_activity WHERE application_name LIKE%'`).Scan(&ended); err != nil {
		t.Fatal(err)
	}
	if ended != 1 {
		t.Fatalf("ended %d look connections, want 1", ended)
	}
	if _, err := c.Present(ctx, cluster, "n1"); err != nil {
		t.Fatalf("present after the look connection ended: %v", err)
	}
}
