package migrator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lattice-db/lattice/btreeindex"
	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// ShadowSpec names one shadow copy: the rows of some slots of a tree, from a
// source shard table to a target shard table, possibly on another node.
type ShadowSpec struct {
	ID        string // migration id; names the publication and the replication slot
	Tree      *shardmap.Tree
	SourceDSN string // the tenant database on the source node
	TargetDSN string // the tenant database on the target node
	Source    int    // shard index of the source table
	Target    int    // shard index of the target table
	Slots     [][2]int
	// Whole says the source table holds rows of Slots only (a move or a
	// resize, which takes an unmixed shard with all its slots), so the copy reads the
	// table without the slot filter.
	Whole bool
	// Fresh says the target tables hold rows of Slots only (a split, a
	// move or a resize, not a fold's survivor), so one connection may
	// empty them and copy with FREEZE (freezeTargets).
	Fresh bool
	// Reindex rebuilds the target's indexes in the copy's transaction (a
	// resize): a btree index filled row by row splits its pages half and
	// half whatever its fillfactor, a built one packs them to it. A target
	// whose indexes the copy built after filling it (pgshard/deferindex.go) needs
	// no rebuild.
	Reindex bool
	// Workers is how many connection pairs a Whole copy uses at once, one
	// page range each (copychunks.go); below 1, one.
	Workers int
	// Members are the tables the copy moves when Tree is in a colocation
	// group: every member, Tree among them, in one publication, one
	// replication slot and one snapshot, a COPY each in one target
	// transaction (docs/DESIGN.md section 4.1). Nil: Tree alone.
	Members []*shardmap.Tree
	// borrowSource, if set, lends the connection to the source that sets
	// the copy up and reads its rows (a spare); otherwise the copy opens
	// one to SourceDSN. borrowTarget, likewise, the target connection the
	// copy and the stream write through; otherwise it is opened to
	// TargetDSN.
	borrowSource, borrowTarget func(context.Context) (borrowed, error)
}

// sourceConn is a connection to the source: the one that sets the copy
// up, or one that drops it.
func (sp ShadowSpec) sourceConn(ctx context.Context) (borrowed, error) {
	if sp.borrowSource != nil {
		return sp.borrowSource(ctx)
	}
	return ownConnTo(ctx, sp.SourceDSN)
}

// targetConn is a connection to the target, not labelled for the run
// (connectShadowTarget labels one).
func (sp ShadowSpec) targetConn(ctx context.Context) (borrowed, error) {
	if sp.borrowTarget != nil {
		return sp.borrowTarget(ctx)
	}
	return ownConnTo(ctx, sp.TargetDSN)
}

// trees are the trees whose tables the copy moves.
func (sp ShadowSpec) trees() []*shardmap.Tree {
	if len(sp.Members) == 0 {
		return []*shardmap.Tree{sp.Tree}
	}
	return sp.Members
}

// Name is the publication and replication slot name of the shadow copy.
func (sp ShadowSpec) Name() string { return "lattice_m_" + sp.ID }

func (sp ShadowSpec) validate() error {
	if sp.ID == "" || strings.ContainsFunc(sp.ID, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_')
	}) {
		return fmt.Errorf("migrator: migration id %q must be lower-case letters, digits and _", sp.ID)
	}
	if len(sp.Name()) > 63 {
		return fmt.Errorf("migrator: migration id %q is too long", sp.ID)
	}
	if len(sp.Slots) == 0 {
		return errors.New("migrator: a shadow copy needs at least one slot range")
	}
	return nil
}

// progressTable records, in the target schema, how far a shadow copy has
// applied: the copy and each applied batch commit it in the same
// transaction as the rows, which makes a restart resume exactly once.
func progressTable(target int) string {
	return pgx.Identifier{shardmap.SchemaName(target), "lattice_progress"}.Sanitize()
}

// ShadowStats is what a running shadow copy has done so far.
type ShadowStats struct {
	RowsCopied  int64
	BytesCopied int64 // COPY data of this run's copy; 0 when an earlier run did the copy
	RowsApplied int64
	Applied     pglogrepl.LSN // every source change up to here is in the target
	Copied      bool
}

// Shadow is a running shadow copy: the copy under an exported snapshot is
// done (or was done before a restart) and the stream applies later changes.
type Shadow struct {
	spec ShadowSpec
	log  *slog.Logger

	repl   *pgconn.PgConn
	target borrowed
	tables map[string]*shadowTable // by tree name, which is the table's name in every shard schema

	mu      sync.Mutex
	stats   ShadowStats
	advance *sync.Cond // signalled when stats.Applied moves or the stream ends
	err     error      // why the stream ended
	waiters int        // WaitApplied calls in progress
	// endReceive ends the stream's current receive, so that a first waiter
	// gets its keepalive request sent at once; nil between receives.
	endReceive context.CancelFunc
	done       bool

	cancel context.CancelFunc
	exited chan struct{}
}

// shadowTable is one table a shadow copy moves.
type shadowTable struct {
	tree *shardmap.Tree
	cols []string // table columns in order
	pkey []string // primary key columns
}

// StartShadow creates the publication and slot if needed, copies the moving
// rows under the slot's snapshot unless an earlier run committed the copy,
// and starts streaming the changes after it into the target.
func StartShadow(ctx context.Context, spec ShadowSpec, log *slog.Logger) (*Shadow, error) {
	if err := spec.validate(); err != nil {
		return nil, err
	}
	sh := &Shadow{spec: spec, log: log.With("migration", spec.ID)}
	sh.advance = sync.NewCond(&sh.mu)
	if err := sh.start(ctx); err != nil {
		sh.closeConns()
		return nil, err
	}
	runCtx, cancel := context.WithCancel(context.Background())
	sh.cancel, sh.exited = cancel, make(chan struct{})
	go sh.stream(runCtx)
	return sh, nil
}

func (sh *Shadow) start(ctx context.Context) error {
	sp := sh.spec
	var err error
	var ended int
	if sh.target, ended, err = connectShadowTarget(ctx, sp); err != nil {
		return err
	}
	if ended > 0 {
		sh.log.Warn("ended an earlier run's connections on the target, so that nothing they sent can commit now", "connections", ended)
	}
	sh.tables = map[string]*shadowTable{}
	for _, t := range sp.trees() {
		st := &shadowTable{tree: t}
		if st.cols, st.pkey, err = tableColumns(ctx, sh.target.Conn, pgshard.ShardTable(t, sp.Target)); err != nil {
			return err
		}
		sh.tables[t.Name] = st
	}
	if err := replicaForForeignKeys(ctx, sh.target.Conn, shadowTables(sp)); err != nil {
		return err
	}
	if _, err := sh.target.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+progressTable(sp.Target)+
		` (migration text PRIMARY KEY, applied_lsn pg_lsn NOT NULL, rows_copied bigint NOT NULL)`); err != nil {
		return fmt.Errorf("migrator: progress table: %w", err)
	}
	var applied string
	var copied int64
	err = sh.target.QueryRow(ctx, "SELECT applied_lsn::text, rows_copied FROM "+progressTable(sp.Target)+
		" WHERE migration = $1", sp.ID).Scan(&applied, &copied)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return sh.copyFresh(ctx)
	case err != nil:
		return fmt.Errorf("migrator: read progress: %w", err)
	}
	lsn, err := pglogrepl.ParseLSN(applied)
	if err != nil {
		return err
	}
	if sh.repl, err = connectReplication(ctx, sp.SourceDSN); err != nil {
		return err
	}
	trouble, err := slotTrouble(ctx, sh.repl, sp.Name())
	if err != nil {
		return err
	}
	if trouble != "" {
		sh.log.Warn("the shadow copy's replication slot cannot serve; copying the moving rows again under a new slot", "why", trouble)
		if _, err := sh.target.Exec(ctx, "DELETE FROM "+progressTable(sp.Target)+" WHERE migration = $1", sp.ID); err != nil {
			return fmt.Errorf("migrator: forget the copy: %w", err)
		}
		sh.repl.Close(ctx)
		sh.repl = nil
		return sh.copyFresh(ctx)
	}
	sh.stats = ShadowStats{RowsCopied: copied, Applied: lsn, Copied: true}
	return sh.startReplication(ctx, lsn)
}

func connectReplication(ctx context.Context, dsn string) (*pgconn.PgConn, error) {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.RuntimeParams["replication"] = "database"
	cfg.RuntimeParams["application_name"] = "lattice-migrator"
	c, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("migrator: replication connection: %w", err)
	}
	return c, nil
}

// copyFresh starts from nothing: whatever an earlier run left of the moving
// slots in the target is deleted, the slot is made anew, and the rows are
// copied under its snapshot and committed with the progress row
// (copychunks.go).
func (sh *Shadow) copyFresh(ctx context.Context) error {
	sp := sh.spec
	lent, err := sp.sourceConn(ctx)
	if err != nil {
		return fmt.Errorf("migrator: connect to source: %w", err)
	}
	defer lent.giveBack(context.Background())
	src := lent.Conn
	pub := pgx.Identifier{sp.Name()}.Sanitize()
	var published []string
	for _, t := range sp.trees() {
		published = append(published, pgshard.ShardTable(t, sp.Source)+" WHERE ("+btreeindex.SlotPredicate(t, "", sp.Slots)+")")
	}
	var exists bool
	if err := src.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_publication WHERE pubname = $1)`, sp.Name()).Scan(&exists); err != nil {
		return err
	}
	if !exists {
		if _, err := src.Exec(ctx, "CREATE PUBLICATION "+pub+" FOR TABLE "+strings.Join(published, ", ")); err != nil {
			return fmt.Errorf("migrator: create publication: %w", err)
		}
	}
	if _, err := src.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
		WHERE slot_name = $1 AND NOT active`, sp.Name()); err != nil {
		return fmt.Errorf("migrator: drop stale slot: %w", err)
	}
	if sh.repl, err = connectReplication(ctx, sp.SourceDSN); err != nil {
		return err
	}
	began := time.Now()
	slot, err := pglogrepl.CreateReplicationSlot(ctx, sh.repl, sp.Name(), "pgoutput",
		pglogrepl.CreateReplicationSlotOptions{Mode: pglogrepl.LogicalReplication, SnapshotAction: "EXPORT_SNAPSHOT"})
	if err != nil {
		return fmt.Errorf("migrator: create replication slot: %w", err)
	}
	start, err := pglogrepl.ParseLSN(slot.ConsistentPoint)
	if err != nil {
		return err
	}
	slotMade := time.Now()
	// The stream starts as soon as every copy transaction has imported the
	// snapshot (the export ends with the next command on the replication
	// connection), so the source decodes its WAL while the rows are copied:
	// logical decoding reads every transaction of the database, published
	// or not (a concurrent copy into the node, a release's deletes), and
	// that reading was otherwise the drain after the copy. Nothing is read
	// from the stream until the copy commits; the source blocks once the
	// socket is full, and the status updates keep wal_sender_timeout from
	// ending the stream meanwhile.
	var keeper *streamKeeper
	startStream := func() error {
		if err := sh.startReplication(ctx, start); err != nil {
			return err
		}
		keeper = sh.keepStream(start)
		return nil
	}
	n, bytes, err := sh.copyRows(ctx, src, slot.SnapshotName, start, startStream)
	if keeper != nil {
		if kerr := keeper.stop(); err == nil {
			err = kerr
		}
	}
	if err != nil {
		return err
	}
	sh.stats = ShadowStats{RowsCopied: n, BytesCopied: bytes, Applied: start, Copied: true}
	sh.log.Info("shadow copy done", "rows", n, "consistent_point", start,
		"slot", slotMade.Sub(began), "copy", time.Since(slotMade))
	return nil
}

// streamKeeper sends standby status updates on a started stream that is
// not read yet (the copy runs), every statusInterval, reporting the
// consistent point: the source ends a stream it hears nothing from for
// wal_sender_timeout (60 s by default), which a long copy outlasts.
type streamKeeper struct {
	cancel context.CancelFunc
	done   chan error
}

func (sh *Shadow) keepStream(at pglogrepl.LSN) *streamKeeper {
	ctx, cancel := context.WithCancel(context.Background())
	k := &streamKeeper{cancel: cancel, done: make(chan error, 1)}
	go func() {
		tick := time.NewTicker(statusInterval)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				k.done <- nil
				return
			case <-tick.C:
				if err := pglogrepl.SendStandbyStatusUpdate(ctx, sh.repl, pglogrepl.StandbyStatusUpdate{WALWritePosition: at}); err != nil {
					k.done <- fmt.Errorf("migrator: standby status during the copy: %w", err)
					return
				}
			}
		}
	}()
	return k
}

// stop ends the updates, before the stream's own loop takes the
// connection, and returns why they failed, if they did.
func (k *streamKeeper) stop() error {
	k.cancel()
	return <-k.done
}

func (sh *Shadow) startReplication(ctx context.Context, from pglogrepl.LSN) error {
	err := pglogrepl.StartReplication(ctx, sh.repl, sh.spec.Name(), from, pglogrepl.StartReplicationOptions{
		Mode:       pglogrepl.LogicalReplication,
		PluginArgs: []string{"proto_version '1'", "publication_names " + quoteLiteral(sh.spec.Name())},
	})
	if err != nil {
		return fmt.Errorf("migrator: start replication: %w", err)
	}
	return nil
}

// Stats is a snapshot of the shadow copy's progress.
func (sh *Shadow) Stats() ShadowStats {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.stats
}

// WaitApplied waits until every source change before lsn is in the target.
// The stream asks the source for a keepalive while it waits, so an idle
// source still reports its position.
func (sh *Shadow) WaitApplied(ctx context.Context, lsn pglogrepl.LSN) error {
	stop := context.AfterFunc(ctx, func() {
		sh.mu.Lock()
		sh.advance.Broadcast()
		sh.mu.Unlock()
	})
	defer stop()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.waiters++
	defer func() { sh.waiters-- }()
	if sh.waiters == 1 && sh.endReceive != nil && sh.stats.Applied < lsn {
		sh.endReceive()
	}
	for sh.stats.Applied < lsn {
		if sh.done {
			return fmt.Errorf("migrator: shadow copy %s stopped: %w", sh.spec.ID, sh.err)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		sh.advance.Wait()
	}
	return nil
}

// Stop ends the stream and closes the connections. The slot, publication and
// progress row stay, so a later StartShadow resumes.
func (sh *Shadow) Stop() error {
	sh.cancel()
	<-sh.exited
	sh.closeConns()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if errors.Is(sh.err, context.Canceled) {
		return nil
	}
	return sh.err
}

func (sh *Shadow) closeConns() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if sh.repl != nil {
		sh.repl.Close(ctx)
	}
	sh.target.giveBack(ctx)
}

// DropShadow removes what a shadow copy made: its slot and publication on
// the source and its progress row on the target. Missing pieces are fine, so
// a reaper can run it for a migration in any state.
func DropShadow(ctx context.Context, spec ShadowSpec) error {
	if err := spec.validate(); err != nil {
		return err
	}
	src, err := spec.sourceConn(ctx)
	if err != nil {
		return err
	}
	err = dropShadowSource(ctx, spec, src.Conn)
	src.giveBack(ctx)
	if err != nil {
		return err
	}
	tgt, err := spec.targetConn(ctx)
	if err != nil {
		return err
	}
	defer tgt.giveBack(ctx)
	return dropShadowProgress(ctx, spec, tgt.Conn)
}

// dropShadowSource drops the shadow copy's slot and publication.
func dropShadowSource(ctx context.Context, spec ShadowSpec, src *pgx.Conn) error {
	if err := dropSlot(ctx, src, spec.Name()); err != nil {
		return err
	}
	if err := dropPublication(ctx, src, spec.Name()); err != nil {
		return fmt.Errorf("migrator: drop publication: %w", err)
	}
	return nil
}

// dropShadowProgress deletes the shadow copy's progress row.
func dropShadowProgress(ctx context.Context, spec ShadowSpec, tgt *pgx.Conn) error {
	var exists bool
	if err := tgt.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, progressTable(spec.Target)).Scan(&exists); err != nil || !exists {
		return err
	}
	_, err := tgt.Exec(ctx, "DELETE FROM "+progressTable(spec.Target)+" WHERE migration = $1", spec.ID)
	return err
}

// dropPublication drops a publication while its tables are locked against
// writes. A writer builds a table's publication list from the catalog in
// two steps (the publication ids, then each publication), so a publication
// dropped between them fails the write with "cache lookup failed for
// publication" (XX000). Writers wait for the lock instead, and see the
// publication gone when they get it. The lock is taken with a short
// lock_timeout and retried, backing off, as the fence's is, so that
// writers queued behind it are not held for long.
func dropPublication(ctx context.Context, conn *pgx.Conn, name string) error {
	rows, err := conn.Query(ctx, `SELECT format('%I.%I', schemaname, tablename) FROM pg_catalog.pg_publication_tables WHERE pubname = $1`, name)
	if err != nil {
		return err
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	var stmts []string
	if len(tables) > 0 {
		stmts = append(stmts, "LOCK TABLE "+strings.Join(tables, ", ")+" IN SHARE ROW EXCLUSIVE MODE")
	}
	stmts = append(stmts, "DROP PUBLICATION IF EXISTS "+pgx.Identifier{name}.Sanitize())
	return execLocked(ctx, conn, publicationLockTimeout, dropBackoffMax, stmts)
}

// publicationLockTimeout bounds each attempt to lock a publication's tables.
const publicationLockTimeout = 10 * time.Millisecond

// slotReleaseWait bounds how long dropping a slot waits for the walsender
// of a stream just stopped: the server ends it shortly after the client
// closed the connection, and until then the slot is active (55006).
const slotReleaseWait = 10 * time.Second

func dropSlot(ctx context.Context, src *pgx.Conn, name string) error {
	deadline := time.Now().Add(slotReleaseWait)
	for {
		_, err := src.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, name)
		if !sqlstate.Is(err, sqlstate.ObjectInUse) || time.Now().After(deadline) {
			if err != nil {
				return fmt.Errorf("migrator: drop replication slot: %w", err)
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(slotReleasePoll):
		}
	}
}

// slotReleasePoll is how often dropping a slot looks again whether the
// walsender let it go: it usually does within a few milliseconds, and the
// release of every move waits for it.
const slotReleasePoll = 5 * time.Millisecond

// tableColumns reads the visible columns of a table in order, and its
// primary key.
func tableColumns(ctx context.Context, c *pgx.Conn, table string) (cols, pkey []string, err error) {
	rows, err := c.Query(ctx, `SELECT a.attname, coalesce(a.attnum = ANY (i.indkey), false)
		FROM pg_attribute a
		LEFT JOIN pg_index i ON i.indrelid = a.attrelid AND i.indisprimary
		WHERE a.attrelid = $1::regclass AND a.attnum > 0 AND NOT a.attisdropped
		ORDER BY a.attnum`, table)
	if err != nil {
		return nil, nil, err
	}
	for rows.Next() {
		var name string
		var inKey bool
		if err := rows.Scan(&name, &inKey); err != nil {
			return nil, nil, err
		}
		cols = append(cols, name)
		if inKey {
			pkey = append(pkey, name)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("migrator: columns of %s: %w", table, err)
	}
	if len(pkey) == 0 {
		return nil, nil, fmt.Errorf("migrator: %s has no primary key", table)
	}
	return cols, pkey, nil
}

func quoteAll(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = pgx.Identifier{n}.Sanitize()
	}
	return strings.Join(q, ", ")
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
