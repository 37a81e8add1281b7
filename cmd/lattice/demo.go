package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lattice-db/lattice/localnode"
	"github.com/lattice-db/lattice/pgshard"
)

// demoCmd starts two local PostgreSQL nodes, the embedded Redis and the
// proxy, creates the sample tree, and runs until interrupted.
func demoCmd(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	data := fs.String("data", "lattice-demo", "folder for the demo's PostgreSQL data; created if missing")
	listen := fs.String("listen", "127.0.0.1:6432", "address for PostgreSQL clients")
	adminAddr := fs.String("admin", "127.0.0.1:9090", "address of the admin endpoint")
	rows := fs.Int("rows", 10000, "sample rows in tree catalogue")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	log, err := newLogger("info")
	if err != nil {
		return err
	}
	if err := localnode.EnsureTools(ctx); err != nil {
		return err
	}
	dir, err := filepath.Abs(*data)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var nodes nodeFlags
	for i := 1; i <= 2; i++ {
		name := fmt.Sprintf("n%d", i)
		pg, err := localnode.StartPostgres(ctx, filepath.Join(dir, name), name, localnode.PostgresOptions{})
		if err != nil {
			return fmt.Errorf("start node %s: %w", name, err)
		}
		defer pg.Stop()
		nodes = append(nodes, pgshard.Node{Name: name, DSN: pg.DSN("lattice")})
		log.Info("node up", "name", name, "dsn", pg.DSN("lattice"))
	}
	cfg := serveConfig{Listen: *listen, Admin: *adminAddr, Nodes: nodes, MaxClients: 1000, PoolSize: 32, StartupTimeout: 10 * time.Second, Coordinator: true}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	addrs := make(chan [2]string, 1)
	errc := make(chan error, 1)
	go func() {
		errc <- serve(ctx, cfg, log, func(pg, adm string) { addrs <- [2]string{pg, adm} })
	}()
	var pgAddr, adm string
	select {
	case a := <-addrs:
		pgAddr, adm = a[0], a[1]
	case err := <-errc:
		return err
	}
	dsn := fmt.Sprintf("postgres://lattice@%s/lattice?sslmode=disable", pgAddr)
	if err := loadSample(ctx, dsn, *rows, log); err != nil {
		cancel()
		<-errc
		return fmt.Errorf("sample data: %w", err)
	}
	fmt.Printf(`
Lattice demo is running.
  connect:  psql "%s"
  try:      SELECT * FROM lattice_shards('catalogue');
            SELECT * FROM catalogue WHERE sku = 'sku-00042';
  page:     http://%s/   (slot maps, shards and reshards, live)
  reshard:  lattice reshard catalogue 32 --wait --admin %s
  metrics:  http://%s/metrics
Press Ctrl-C to stop; everything started here stops with it.
`, dsn, adm, adm, adm)
	return <-errc
}

// loadSample creates catalogue through the proxy as an ordinary table, fills
// it, and turns it into a tree, which spreads the rows over the shards.
func loadSample(ctx context.Context, dsn string, rows int, log *slog.Logger) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	trees, err := conn.Query(ctx, "SELECT * FROM lattice_trees()")
	if err != nil {
		return err
	}
	names, err := pgx.CollectRows(trees, func(r pgx.CollectableRow) (string, error) {
		var name, key, keyType string
		var shards, slots int32
		var epoch int64
		err := r.Scan(&name, &key, &keyType, &shards, &slots, &epoch)
		return name, err
	})
	if err != nil {
		return err
	}
	for _, n := range names {
		if n == "catalogue" {
			log.Info("tree catalogue already exists; keeping its data")
			return nil
		}
	}
	steps := []string{
		`DROP TABLE IF EXISTS catalogue`,
		`CREATE TABLE catalogue (sku text PRIMARY KEY, name text NOT NULL, price numeric(10,2) NOT NULL, qty integer NOT NULL DEFAULT 0)`,
		fmt.Sprintf(`INSERT INTO catalogue SELECT 'sku-' || lpad(i::text, 5, '0'), 'item ' || i, (i %% 1000) / 10.0 + 1, i %% 50 FROM generate_series(1, %d) i`, rows),
		`SELECT lattice_create_tree('catalogue', 'sku')`,
	}
	for _, q := range steps {
		if _, err := conn.Exec(ctx, q); err != nil {
			return fmt.Errorf("%s: %w", q, err)
		}
	}
	log.Info("tree catalogue created", "rows", rows)
	return nil
}
