package migrator

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lattice-db/lattice/btreeindex"
	"github.com/lattice-db/lattice/pgshard"
)

// A copy of whole tables (a move, a resize) is split into page ranges of
// the source tables, copied at once over up to ShadowSpec.Workers pairs of
// connections (--copy-workers), each pair one source transaction under the
// slot's exported snapshot and one target transaction: one COPY pipe keeps
// one core of the target busy parsing and inserting, and a node with cores
// to spare can take more. On 2 cores shared by both nodes, one pair was
// fastest (docs/DESIGN.md section 5.1, step 3).
//
// Restart safety: the target's moving slots are emptied, and committed,
// before any range is copied. The ranges of the extra connections commit
// first; the range of the shadow's own target connection commits last, in
// the transaction that also inserts the progress row, and only once every
// other range committed. A crash before that commit leaves ranges in the
// target and no progress row, so the next run empties the moving slots
// again and copies everything under a new slot's snapshot: exactly once.
// The extra target connections carry the run's application name, so that a
// later run ends them as it ends the shadow's own (takeover.go).

// copyChunkMinPages is the fewest source pages (8 KiB each) a range covers:
// a smaller table is copied over fewer connections, or the shadow's alone,
// where opening connections would cost more than it saves.
const copyChunkMinPages = 128

// copyChunk is one page range [from, to) of a table's source; to < 0 is
// the table's end, and from = 0 with to < 0 the whole table.
type copyChunk struct {
	st       *shadowTable
	from, to int64
}

// copyChunks plans the ranges of every table: a table the copy filters by
// slot (a split or a fold, its source holding other slots too) is one
// range; a whole table is cut into up to one even page range per worker.
func (sh *Shadow) copyChunks(ctx context.Context, src *pgx.Conn) ([]copyChunk, error) {
	sp := sh.spec
	var chunks []copyChunk
	for _, t := range sp.trees() {
		st := sh.tables[t.Name]
		if !sp.Whole {
			chunks = append(chunks, copyChunk{st: st, to: -1})
			continue
		}
		var pages int64
		if err := src.QueryRow(ctx, `SELECT pg_relation_size($1::regclass) / current_setting('block_size')::bigint`,
			pgshard.ShardTable(t, sp.Source)).Scan(&pages); err != nil {
			return nil, fmt.Errorf("migrator: size of %s on the source: %w", t.Name, err)
		}
		for _, r := range pageRanges(pages, sp.workers()) {
			chunks = append(chunks, copyChunk{st: st, from: r[0], to: r[1]})
		}
	}
	return chunks, nil
}

// workers is the connection pairs a Whole copy uses at once.
func (sp ShadowSpec) workers() int { return max(1, sp.Workers) }

// pageRanges cuts a table of pages into up to workers even ranges
// [from, to) of at least copyChunkMinPages each, or one. The last is open
// (to = -1): rows the snapshot sees lie below the size read before it, but
// a range that misses none does not depend on it.
func pageRanges(pages int64, workers int) [][2]int64 {
	n := max(1, min(int64(workers), pages/copyChunkMinPages))
	out := make([][2]int64, n)
	for i := range n {
		out[i] = [2]int64{i * pages / n, (i + 1) * pages / n}
	}
	out[n-1][1] = -1
	return out
}

// copyRows pipes a binary COPY of the moving rows of each table, read
// under the slot's exported snapshot, into the target tables, and commits
// them with the progress row (see the top of this file), and returns the
// rows and bytes of COPY data it moved. It calls imported once every
// source transaction has imported the snapshot and every extra connection
// pair is ready to copy, before its own copies begin.
func (sh *Shadow) copyRows(ctx context.Context, src *pgx.Conn, snapshot string, start pglogrepl.LSN, imported func() error) (int64, int64, error) {
	sp := sh.spec
	chunks, err := sh.copyChunks(ctx, src)
	if err != nil {
		return 0, 0, err
	}
	extra := min(sp.workers(), len(chunks)) - 1
	// One connection filling targets that hold the moving slots alone
	// empties them in its own transaction and copies with FREEZE
	// (freezeTargets); otherwise each target's moving slots are deleted
	// first.
	freeze := sp.Fresh && extra == 0
	if !freeze {
		if err := clearTargets(ctx, sh.target.Conn, sp); err != nil {
			return 0, 0, err
		}
	}
	queue := make(chan copyChunk, len(chunks))
	for _, c := range chunks {
		queue <- c
	}
	close(queue)
	copyCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		rows, bytes int64
		err         error
	}
	results := make(chan result, extra)
	var importing sync.WaitGroup
	importing.Add(extra)
	for range extra {
		go func() {
			n, b, err := sh.copyOnNewConns(copyCtx, snapshot, queue, importing.Done)
			if err != nil {
				cancel()
			}
			results <- result{n, b, err}
		}()
	}
	tx, rebuild, rows, bytes, err := sh.copyOwn(copyCtx, src, snapshot, queue, freeze, func() error {
		importing.Wait()
		if err := copyCtx.Err(); err != nil {
			return err // a worker failed; its error is the cause
		}
		return imported()
	})
	if tx != nil {
		defer tx.Rollback(context.Background())
	}
	if err != nil {
		cancel()
	}
	errs := []error{err}
	for range extra {
		r := <-results
		rows, bytes, errs = rows+r.rows, bytes+r.bytes, append(errs, r.err)
	}
	if err := firstCause(errs); err != nil {
		return 0, 0, err
	}
	built := time.Now()
	if err := rebuild.Build(ctx, tx); err != nil {
		return 0, 0, err
	}
	if !rebuild.Empty() {
		sh.log.Info("indexes built after the copy", "tables", len(rebuild.Tables), "statements", rebuild.Statements(), "took", time.Since(built))
	}
	if sp.Reindex {
		for _, t := range sp.trees() {
			table := pgshard.ShardTable(t, sp.Target)
			if rebuild.Tables[table] {
				continue // built whole after the copy
			}
			if _, err := tx.Exec(ctx, "REINDEX TABLE "+table); err != nil {
				return 0, 0, fmt.Errorf("migrator: rebuild the indexes of %s on the target: %w", t.Name, err)
			}
		}
	}
	if _, err := tx.Exec(ctx, "INSERT INTO "+progressTable(sp.Target)+" (migration, applied_lsn, rows_copied) VALUES ($1, $2::pg_lsn, $3)",
		sp.ID, start.String(), rows); err != nil {
		return 0, 0, err
	}
	crashPoint("copy")
	if err := tx.Commit(ctx); err != nil {
		return 0, 0, err
	}
	return rows, bytes, nil
}

// firstCause is the first error of errs that is not the cancellation
// another worker's failure caused, or the first error.
func firstCause(errs []error) error {
	var first error
	for _, err := range errs {
		if err != nil && !errors.Is(err, context.Canceled) {
			return err
		}
		if first == nil {
			first = err
		}
	}
	return first
}

// copyOwn copies ranges from the queue over the shadow's own connections,
// in the target transaction it returns open, for copyRows to commit last,
// with the indexes it dropped to build after the copy (pgshard/deferindex.go).
// It calls imported once its source transaction has imported the
// snapshot.
func (sh *Shadow) copyOwn(ctx context.Context, src *pgx.Conn, snapshot string, queue <-chan copyChunk, freeze bool, imported func() error) (pgx.Tx, pgshard.IndexRebuild, int64, int64, error) {
	var rebuild pgshard.IndexRebuild
	err := useSnapshot(ctx, src, snapshot)
	if err == nil {
		err = imported()
	}
	if err != nil {
		return nil, rebuild, 0, 0, err
	}
	defer src.Exec(context.Background(), "ROLLBACK")
	tx, err := sh.target.Begin(ctx)
	if err != nil {
		return nil, rebuild, 0, 0, err
	}
	if freeze {
		if freeze, err = freezeTargets(ctx, tx, sh.spec); err != nil {
			return tx, rebuild, 0, 0, err
		}
	}
	if freeze {
		if rebuild, err = pgshard.DropIndexes(ctx, tx, targetTables(sh.spec)); err != nil {
			return tx, rebuild, 0, 0, err
		}
	}
	rows, bytes, err := sh.copyQueue(ctx, src, tx, queue, freeze)
	return tx, rebuild, rows, bytes, err
}

// targetTables are the copy's target tables, quoted.
func targetTables(sp ShadowSpec) []string {
	var tables []string
	for _, t := range sp.trees() {
		tables = append(tables, pgshard.ShardTable(t, sp.Target))
	}
	return tables
}

// clearTargets deletes what an earlier run left of the moving slots in
// the target tables.
func clearTargets(ctx context.Context, c interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, sp ShadowSpec) error {
	for _, t := range sp.trees() {
		if _, err := c.Exec(ctx, "DELETE FROM "+pgshard.ShardTable(t, sp.Target)+" WHERE "+btreeindex.SlotPredicate(t, "", sp.Slots)); err != nil {
			return fmt.Errorf("migrator: clear target slots of %s: %w", t.Name, err)
		}
	}
	return nil
}

// truncateLockWait bounds freezeTargets' wait for the targets' locks.
const truncateLockWait = time.Second

// freezeTargets empties the target tables in tx, which then copies into
// them with COPY FREEZE: PostgreSQL writes the rows frozen and marks
// their pages all-visible, as it may for a table truncated in the
// copying transaction. So the first scan of the copy (the move's
// comparison, then the clients' reads) neither looks up each row's
// transaction nor dirties every page to set its hint bits, and vacuum
// has nothing to freeze later. No client reads the targets before the
// flip, but a session on the node may lock them (a pg_dump of the node
// holds every table for the whole dump), and the TRUNCATE's lock would
// wait for it: it waits truncateLockWait at most. A TRUNCATE that fails
// so, or otherwise (a foreign key from a table outside the copy), is
// undone and the slots are deleted instead, which no reader holds up,
// and copied without FREEZE; it reports whether the copy may freeze.
func freezeTargets(ctx context.Context, tx pgx.Tx, sp ShadowSpec) (bool, error) {
	tables := targetTables(sp)
	sub, err := tx.Begin(ctx)
	if err != nil {
		return false, err
	}
	wait := fmt.Sprintf("SET LOCAL lock_timeout = %d", truncateLockWait.Milliseconds())
	if _, err := sub.Exec(ctx, wait+"; TRUNCATE "+strings.Join(tables, ", ")+"; SET LOCAL lock_timeout = DEFAULT"); err == nil {
		return true, sub.Commit(ctx)
	}
	if err := sub.Rollback(ctx); err != nil {
		return false, err
	}
	return false, clearTargets(ctx, tx, sp)
}

// copyOnNewConns copies ranges from the queue over a new pair of
// connections and commits them on the target. It calls ready once its
// source transaction has imported the snapshot and its target transaction
// is open, or once either failed.
func (sh *Shadow) copyOnNewConns(ctx context.Context, snapshot string, queue <-chan copyChunk, ready func()) (int64, int64, error) {
	sp := sh.spec
	var once sync.Once
	defer once.Do(ready)
	src, err := pgx.Connect(ctx, sp.SourceDSN)
	if err != nil {
		return 0, 0, fmt.Errorf("migrator: connect to source: %w", err)
	}
	defer src.Close(context.Background())
	if err := useSnapshot(ctx, src, snapshot); err != nil {
		return 0, 0, err
	}
	cfg, err := shadowTargetConfig(sp.TargetDSN, sp.ID)
	if err != nil {
		return 0, 0, err
	}
	tgt, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return 0, 0, fmt.Errorf("migrator: connect to target: %w", err)
	}
	defer tgt.Close(context.Background())
	if err := replicaForForeignKeys(ctx, tgt, shadowTables(sp)); err != nil {
		return 0, 0, err
	}
	tx, err := tgt.Begin(ctx)
	if err != nil {
		return 0, 0, err
	}
	defer tx.Rollback(context.Background())
	// Ready only once it can take a range: the shadow's own connection,
	// open already, starts when every extra one is, or it would take every
	// range while they still connect to the target.
	once.Do(ready)
	rows, bytes, err := sh.copyQueue(ctx, src, tx, queue, false)
	if err != nil {
		return 0, 0, err
	}
	return rows, bytes, tx.Commit(ctx)
}

// useSnapshot opens a read-only transaction on src that sees what the
// slot's exported snapshot sees.
func useSnapshot(ctx context.Context, src *pgx.Conn, snapshot string) error {
	if _, err := src.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"); err != nil {
		return err
	}
	if _, err := src.Exec(ctx, "SET TRANSACTION SNAPSHOT "+quoteLiteral(snapshot)); err != nil {
		return fmt.Errorf("migrator: use exported snapshot: %w", err)
	}
	return nil
}

// copyQueue copies ranges from the queue until it is empty.
func (sh *Shadow) copyQueue(ctx context.Context, src *pgx.Conn, tx pgx.Tx, queue <-chan copyChunk, freeze bool) (int64, int64, error) {
	var rows, bytes int64
	for c := range queue {
		n, b, err := sh.copyChunk(ctx, src, tx, c, freeze)
		if err != nil {
			return 0, 0, err
		}
		rows, bytes = rows+n, bytes+b
	}
	return rows, bytes, nil
}

// copyChunk pipes one range's rows from src's transaction into the target
// table in tx.
func (sh *Shadow) copyChunk(ctx context.Context, src *pgx.Conn, tx pgx.Tx, c copyChunk, freeze bool) (int64, int64, error) {
	sp := sh.spec
	out := copyOutSQL(sp, c)
	target := pgshard.ShardTable(c.st.tree, sp.Target)
	opts := "FORMAT binary"
	if freeze {
		opts += ", FREEZE"
	}
	r := pgshard.PipeCopy(ctx, src.PgConn(), out, tx.Conn().PgConn(), "COPY "+target+" ("+quoteAll(c.st.cols)+") FROM STDIN ("+opts+")")
	if err := r.Err(); err != nil {
		return 0, 0, fmt.Errorf("migrator: copy %s from shard %d into %d: %w", c.st.tree.Name, sp.Source, sp.Target, err)
	}
	return r.Written, r.Bytes, nil
}

// copyOutSQL is the source's COPY of one range: the moving slots of a
// table the copy filters, a whole table, or a page range of one, which a
// TID range scan reads alone.
func copyOutSQL(sp ShadowSpec, c copyChunk) string {
	cols := quoteAll(c.st.cols)
	source := pgshard.ShardTable(c.st.tree, sp.Source)
	switch {
	case !sp.Whole:
		return "COPY (SELECT " + cols + " FROM " + source + " WHERE " + btreeindex.SlotPredicate(c.st.tree, "", sp.Slots) + ") TO STDOUT (FORMAT binary)"
	case c.from == 0 && c.to < 0:
		return "COPY " + source + " (" + cols + ") TO STDOUT (FORMAT binary)"
	}
	where := fmt.Sprintf("ctid >= '(%d,0)'::tid", c.from)
	if c.to >= 0 {
		where += fmt.Sprintf(" AND ctid < '(%d,0)'::tid", c.to)
	}
	return "COPY (SELECT " + cols + " FROM " + source + " WHERE " + where + ") TO STDOUT (FORMAT binary)"
}
