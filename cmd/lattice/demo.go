package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lattice-db/lattice/localnode"
	"github.com/lattice-db/lattice/pgshard"
)

// demoCmd starts two local PostgreSQL nodes, the embedded Redis and the
// proxy, creates the sample tree, and runs until interrupted.
func demoCmd(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	data := fs.String("data", "", "folder for the demo's PostgreSQL data; created if missing (default ./lattice-demo, or a folder under the system temp dir when PostgreSQL's user cannot enter this one)")
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
	dir, err := demoDataDir(*data)
	if err != nil {
		return err
	}
	log.Info("demo data", "dir", dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := ownedByUs(dir); err != nil {
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
	cfg := serveConfig{Listen: *listen, Admin: *adminAddr, Nodes: nodes, MaxClients: 1000, PoolSize: 32, StartupTimeout: 10 * time.Second, Coordinator: true, IdleInTransactionTimeout: 5 * time.Minute}

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
		var group *string
		err := r.Scan(&name, &key, &keyType, &shards, &slots, &epoch, &group)
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

// demoDataDir is where the demo keeps its PostgreSQL data: the --data folder
// when given, else ./lattice-demo. Run as root from a folder that PostgreSQL's
// unprivileged user cannot enter (a clone in /root), the default moves to a
// folder of its own under the system temp dir, named after the clone's path
// so that a second run finds the same data.
func demoDataDir(flagValue string) (string, error) {
	if flagValue != "" {
		return filepath.Abs(flagValue)
	}
	dir, err := filepath.Abs("lattice-demo")
	if err != nil {
		return "", err
	}
	if localnode.ServerCanEnter(dir) == nil {
		return dir, nil
	}
	sum := sha256.Sum256([]byte(dir))
	return filepath.Join(os.TempDir(), "lattice-demo-"+hex.EncodeToString(sum[:4])), nil
}

// ownedByUs refuses a data folder that another user made or that is a
// symbolic link: under a shared temp dir, its name can be guessed.
func ownedByUs(dir string) error {
	st, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !st.IsDir() || (ok && int(sys.Uid) != os.Geteuid()) {
		return fmt.Errorf("demo: %s is not a folder of this user's; remove it or pass --data", dir)
	}
	return nil
}
