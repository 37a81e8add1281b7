package integration

import (
	"context"
	"log/slog"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lattice-db/lattice/btreeindex"
	"github.com/lattice-db/lattice/migrator"
	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/shardmap"
)

// BenchmarkSplitCopy measures the shadow copy of a split (half the slots of
// a 1,000,000-row shard, rows of about 100 bytes) against a raw binary
// COPY TO | COPY FROM of the same rows between the same two nodes, side by
// side in one run. LATTICE_SPLIT_ROWS changes the row count.
//
//	go test -run '^$' -bench 'BenchmarkSplitCopy|BenchmarkFoldCopy' -benchtime 1x ./integration
func BenchmarkSplitCopy(b *testing.B) { benchShadowCopy(b, shardmap.Split) }

// BenchmarkFoldCopy measures the shadow copy of a fold (every row of a
// 500,000-row donor into a survivor already holding 500,000 rows) against
// a raw binary COPY of the same rows into a table holding the survivor's:
// the same number of rows moves as in BenchmarkSplitCopy.
func BenchmarkFoldCopy(b *testing.B) { benchShadowCopy(b, shardmap.Fold) }

func benchShadowCopy(b *testing.B, kind shardmap.MigrationKind) {
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
	// A split moves the upper half of the slots of a shard of all rows; a
	// fold moves every slot of a donor of half the rows into a survivor
	// holding the other half (and the raw target holds the same).
	slots, srcRows, dstRows := [][2]int{{2048, 4095}}, rows, 0
	if kind == shardmap.Fold {
		slots, srcRows, dstRows = [][2]int{{0, 4095}}, rows/2, rows/2
	}
	fill := func(table string, from, to int) string {
		return "INSERT INTO " + table + " SELECT 'key-' || g, g, repeat(md5(g::text), 2) FROM generate_series(" +
			strconv.Itoa(from) + ", " + strconv.Itoa(to) + ") g"
	}
	for _, q := range []string{"CREATE SCHEMA lattice_s0000", "CREATE TABLE " + pgshard.ShardTable(tree, 0) + ddl,
		fill(pgshard.ShardTable(tree, 0), 1, srcRows), "VACUUM ANALYZE " + pgshard.ShardTable(tree, 0)} {
		if _, err := src.Exec(ctx, q); err != nil {
			b.Fatal(err)
		}
	}
	pred := btreeindex.SlotPredicate(tree, "", slots)
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	for i := 0; i < b.N; i++ {
		setup := []string{"DROP SCHEMA IF EXISTS lattice_s0001, raw CASCADE", "CREATE SCHEMA lattice_s0001", "CREATE SCHEMA raw",
			"CREATE TABLE " + pgshard.ShardTable(tree, 1) + ddl, "CREATE TABLE raw.bench" + ddl}
		if dstRows > 0 {
			setup = append(setup, fill(pgshard.ShardTable(tree, 1), srcRows+1, srcRows+dstRows), fill("raw.bench", srcRows+1, srcRows+dstRows),
				"VACUUM ANALYZE "+pgshard.ShardTable(tree, 1), "VACUUM ANALYZE raw.bench")
		}
		for _, q := range setup {
			if _, err := dst.Exec(ctx, q); err != nil {
				b.Fatal(err)
			}
		}
		// Raw: the same rows, piped.
		start := time.Now()
		rawCopy := pgshard.PipeCopy(ctx, src.PgConn(), "COPY (SELECT * FROM "+pgshard.ShardTable(tree, 0)+" WHERE "+pred+") TO STDOUT (FORMAT binary)",
			dst.PgConn(), "COPY raw.bench FROM STDIN (FORMAT binary)")
		if err := rawCopy.Err(); err != nil {
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
		shadow := time.Since(start)
		if err := sh.Stop(); err != nil {
			b.Fatal(err)
		}
		if err := migrator.DropShadow(ctx, spec); err != nil {
			b.Fatal(err)
		}
		if copied != rawCopy.Written {
			b.Fatalf("%s copied %d rows, raw %d", kind, copied, rawCopy.Written)
		}
		b.ReportMetric(float64(copied)/raw.Seconds(), "raw_rows/s")
		b.ReportMetric(float64(copied)/shadow.Seconds(), string(kind)+"_rows/s")
		b.ReportMetric(raw.Seconds()/shadow.Seconds(), string(kind)+"/raw")
	}
}
