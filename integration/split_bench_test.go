package integration

import (
	"context"
	"io"
	"log/slog"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lattice-db/lattice/migrator"
	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/shardmap"
)

// BenchmarkSplitCopy measures the shadow copy of a split (half the slots of
// a 1,000,000-row shard, rows of about 100 bytes) against a raw binary
// COPY TO | COPY FROM of the same rows between the same two nodes, side by
// side in one run. LATTICE_SPLIT_ROWS changes the row count.
//
//	go test -run '^$' -bench BenchmarkSplitCopy -benchtime 1x ./integration
func BenchmarkSplitCopy(b *testing.B) {
	rows := 1_000_000
	if n, err := strconv.Atoi(os.Getenv("LATTICE_SPLIT_ROWS")); err == nil && n > 0 {
		rows = n
	}
	resetNodes(b)
	ctx := context.Background()
	tree := &shardmap.Tree{Tenant: "lattice", Name: "bench", KeyColumn: "k", KeyType: shardmap.KeyText, SlotCount: 4096}
	src, err := pgx.Connect(ctx, testNodeDSN(b, 0))
	if err != nil {
		b.Fatal(err)
	}
	defer src.Close(ctx)
	dst, err := pgx.Connect(ctx, testNodeDSN(b, 1))
	if err != nil {
		b.Fatal(err)
	}
	defer dst.Close(ctx)
	ddl := " (k text PRIMARY KEY, n int8 NOT NULL, pad text NOT NULL)"
	for _, q := range []string{"CREATE SCHEMA lattice_s0000", "CREATE TABLE " + pgshard.ShardTable(tree, 0) + ddl,
		"INSERT INTO " + pgshard.ShardTable(tree, 0) + " SELECT 'key-' || g, g, repeat(md5(g::text), 2) FROM generate_series(1, " + strconv.Itoa(rows) + ") g",
		"VACUUM ANALYZE " + pgshard.ShardTable(tree, 0)} {
		if _, err := src.Exec(ctx, q); err != nil {
			b.Fatal(err)
		}
	}
	slots := [][2]int{{2048, 4095}}
	pred := pgshard.SlotPredicate(tree, "", slots)
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	for i := 0; i < b.N; i++ {
		for _, q := range []string{"DROP SCHEMA IF EXISTS lattice_s0001, raw CASCADE", "CREATE SCHEMA lattice_s0001", "CREATE SCHEMA raw",
			"CREATE TABLE " + pgshard.ShardTable(tree, 1) + ddl, "CREATE TABLE raw.bench" + ddl} {
			if _, err := dst.Exec(ctx, q); err != nil {
				b.Fatal(err)
			}
		}
		// Raw: the same rows, piped.
		start := time.Now()
		pr, pw := io.Pipe()
		done := make(chan error, 1)
		go func() {
			_, err := src.PgConn().CopyTo(ctx, pw, "COPY (SELECT * FROM "+pgshard.ShardTable(tree, 0)+" WHERE "+pred+") TO STDOUT (FORMAT binary)")
			pw.CloseWithError(err)
			done <- err
		}()
		tag, err := dst.PgConn().CopyFrom(ctx, pr, "COPY raw.bench FROM STDIN (FORMAT binary)")
		if err != nil || <-done != nil {
			b.Fatal(err)
		}
		raw := time.Since(start)

		start = time.Now()
		spec := migrator.ShadowSpec{ID: "bench" + strconv.Itoa(i), Tree: tree, SourceDSN: testNodeDSN(b, 0), TargetDSN: testNodeDSN(b, 1),
			Source: 0, Target: 1, Slots: slots}
		sh, err := migrator.StartShadow(ctx, spec, log)
		if err != nil {
			b.Fatal(err)
		}
		copied := sh.Stats().RowsCopied
		split := time.Since(start)
		if err := sh.Stop(); err != nil {
			b.Fatal(err)
		}
		if err := migrator.DropShadow(ctx, spec); err != nil {
			b.Fatal(err)
		}
		if copied != tag.RowsAffected() {
			b.Fatalf("split copied %d rows, raw %d", copied, tag.RowsAffected())
		}
		b.ReportMetric(float64(copied)/raw.Seconds(), "raw_rows/s")
		b.ReportMetric(float64(copied)/split.Seconds(), "split_rows/s")
		b.ReportMetric(raw.Seconds()/split.Seconds(), "split/raw")
	}
}
