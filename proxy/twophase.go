package proxy

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lattice-db/lattice/pgshard"
)

// gidPrefix marks the prepared transactions of Lattice in pg_prepared_xacts.
const gidPrefix = "lattice_"

// Crash points of the test-only hook TwoPhaseConfig.CrashAt.
const (
	CrashAfterPrepare  = "after-prepare"  // after the first PREPARE TRANSACTION succeeded, before the decision
	CrashAfterDecision = "after-decision" // after the commit decision is durable, before COMMIT PREPARED
)

// logTable is the decision log, in the catalog node's own database. A row
// lives from before the first PREPARE TRANSACTION until every participant
// finished; state is 'preparing', then 'committed' (the decision) or
// 'aborted'. Rows change state only with a conditional UPDATE, so that a
// coordinator's commit decision and a recoverer's abort exclude each other.
const logTable = "lattice_meta.transactions"

var logDDL = []string{
	`CREATE SCHEMA IF NOT EXISTS lattice_meta`,
	`CREATE TABLE IF NOT EXISTS ` + logTable + ` (
		gid          text PRIMARY KEY,
		database     text NOT NULL,
		participants text[] NOT NULL,
		state        text NOT NULL CHECK (state IN ('preparing', 'committed', 'aborted')),
		created      timestamptz NOT NULL DEFAULT now(),
		owner        text NOT NULL
	)`,
}

// TwoPhaseConfig configures the two-phase commit coordinator.
type TwoPhaseConfig struct {
	Cluster *pgshard.Cluster
	// RecoverEvery is how often the recoverer looks for prepared
	// transactions left behind; 0 means 10 s.
	RecoverEvery time.Duration
	// AbortAfter is how old a prepared transaction without a commit
	// decision must be before the recoverer rolls it back; it must exceed
	// any prepare phase. 0 means 1 min.
	AbortAfter time.Duration
	// CrashAt is a test-only hook (cmd/lattice reads it from the
	// LATTICE_TEST_CRASH_2PC environment variable at start): at that point
	// of every two-phase commit (CrashAfterPrepare, CrashAfterDecision) the
	// proxy kills itself with SIGKILL, so that crash recovery can be tested
	// for real. Never set it in production.
	CrashAt string
	Log     *slog.Logger
}

// TwoPhase commits transactions that span several nodes with PostgreSQL's
// two-phase commit, recording the decision durably on the catalog node, and
// finishes what a crashed coordinator left prepared (RunRecoverer).
type TwoPhase struct {
	cfg   TwoPhaseConfig
	owner string // this proxy, in gids and log rows
	seq   atomic.Uint64
	live  sync.Map // gid -> struct{}: this proxy's commits in progress
	ready atomic.Bool
	mu    sync.Mutex // serializes creating the log
}

// NewTwoPhase returns a coordinator with a fresh identity for this proxy.
func NewTwoPhase(cfg TwoPhaseConfig) *TwoPhase {
	if cfg.RecoverEvery <= 0 {
		cfg.RecoverEvery = 10 * time.Second
	}
	if cfg.AbortAfter <= 0 {
		cfg.AbortAfter = time.Minute
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	return &TwoPhase{cfg: cfg, owner: hex.EncodeToString(b[:])}
}

// logPool is the control pool of the catalog node's own database.
func (t *TwoPhase) logPool(ctx context.Context) (*pgxpool.Pool, error) {
	c := t.cfg.Cluster
	return c.Admin(ctx, c.Catalog().Name, c.DefaultTenant())
}

// ensureLog creates the decision log once. Proxies starting together may
// race on CREATE ... IF NOT EXISTS; the loser finds the table there.
func (t *TwoPhase) ensureLog(ctx context.Context) error {
	if t.ready.Load() {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ready.Load() {
		return nil
	}
	pool, err := t.logPool(ctx)
	if err != nil {
		return err
	}
	for _, ddl := range logDDL {
		if _, err = pool.Exec(ctx, ddl); err != nil {
			break
		}
	}
	if err != nil {
		var exists bool
		if e := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, logTable).Scan(&exists); e != nil || !exists {
			return fmt.Errorf("create the transaction log %s: %w", logTable, err)
		}
	}
	t.ready.Store(true)
	return nil
}

// logWrite changes the decision log with synchronous commit, so that a
// decision is on disk before the proxy acts on it. It returns the rows
// affected.
func (t *TwoPhase) logWrite(ctx context.Context, sql string, args ...any) (int64, error) {
	pool, err := t.logPool(ctx)
	if err != nil {
		return 0, err
	}
	var n int64
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL synchronous_commit TO on"); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, sql, args...)
		n = tag.RowsAffected()
		return err
	})
	return n, err
}

func (t *TwoPhase) crash(point string) {
	if t.cfg.CrashAt != point {
		return
	}
	t.cfg.Log.Error("test hook LATTICE_TEST_CRASH_2PC: killing the proxy", "point", point)
	if p, err := os.FindProcess(os.Getpid()); err == nil {
		_ = p.Kill()
	}
	select {} // SIGKILL cannot be caught: nothing runs after it
}

// commit commits the transaction held by conns (idle, inside a transaction
// block, in database) on every node: the decision log row, PREPARE
// TRANSACTION everywhere, the commit decision, COMMIT PREPARED everywhere.
// On return the backends are idle; the transaction committed if the error
// is nil.
func (t *TwoPhase) commit(ctx context.Context, database string, conns []*pgshard.Conn) error {
	gid := fmt.Sprintf("%s%s_%d", gidPrefix, t.owner, t.seq.Add(1))
	t.live.Store(gid, struct{}{})
	defer t.live.Delete(gid)
	nodes := make([]string, len(conns))
	for i, be := range conns {
		nodes[i] = be.Node
	}
	if err := t.ensureLog(ctx); err != nil {
		execAll(ctx, conns, "ROLLBACK")
		return Errorf("58000", "cannot commit across nodes: %v", err)
	}
	if _, err := t.logWrite(ctx, `INSERT INTO `+logTable+` (gid, database, participants, state, owner)
		VALUES ($1, $2, $3, 'preparing', $4)`, gid, database, nodes, t.owner); err != nil {
		execAll(ctx, conns, "ROLLBACK")
		return Errorf("58000", "cannot record the transaction in %s on the catalog node: %v", logTable, err)
	}

	errs := execAll(ctx, conns, "PREPARE TRANSACTION "+quoteLiteral(gid))
	var prepared, aborted []*pgshard.Conn
	var first error
	for i, be := range conns {
		switch {
		case errs[i] == nil:
			prepared = append(prepared, be)
		case first == nil:
			first = prepareError(be.Node, errs[i])
		}
		if errs[i] != nil && be.TxStatus != 'I' && !be.Broken() {
			aborted = append(aborted, be)
		}
	}
	if len(prepared) > 0 {
		t.crash(CrashAfterPrepare)
	}
	if first != nil {
		execAll(ctx, aborted, "ROLLBACK")
		t.abort(ctx, gid, prepared)
		return first
	}

	n, err := t.logWrite(ctx, `UPDATE `+logTable+` SET state = 'committed' WHERE gid = $1 AND state = 'preparing'`, gid)
	if err != nil {
		// The decision may or may not be on disk: the recoverer reads it
		// and finishes the transaction either way.
		t.cfg.Log.Error("two-phase commit: recording the decision failed", "gid", gid, "err", err)
		return Errorf("08007", "the outcome of this transaction is unknown: recording the commit decision failed: %v", err)
	}
	if n == 0 {
		// A recoverer judged the prepare phase too long and aborted it.
		t.abort(ctx, gid, prepared)
		return Errorf("40000", "the transaction was rolled back: its prepare phase outlasted the recovery bound")
	}
	t.crash(CrashAfterDecision)

	done := true
	for i, err := range execAll(ctx, conns, "COMMIT PREPARED "+quoteLiteral(gid)) {
		if err != nil {
			done = false
			t.cfg.Log.Warn("two-phase commit: COMMIT PREPARED failed; the recoverer finishes it", "gid", gid, "node", conns[i].Node, "err", err)
		}
	}
	if done {
		t.forget(ctx, gid)
	}
	return nil
}

// abort rolls back the participants that prepared and ends the log row; a
// row whose rollback did not finish is marked aborted for the recoverer.
func (t *TwoPhase) abort(ctx context.Context, gid string, prepared []*pgshard.Conn) {
	for _, err := range execAll(ctx, prepared, "ROLLBACK PREPARED "+quoteLiteral(gid)) {
		if err != nil && !noSuchGID(err) {
			if _, err := t.logWrite(ctx, `UPDATE `+logTable+` SET state = 'aborted' WHERE gid = $1 AND state = 'preparing'`, gid); err != nil {
				t.cfg.Log.Warn("two-phase commit: marking an aborted transaction failed", "gid", gid, "err", err)
			}
			return
		}
	}
	t.forget(ctx, gid)
}

// forget removes a finished transaction's log row. A row left behind is
// removed by the recoverer, so this needs no synchronous commit.
func (t *TwoPhase) forget(ctx context.Context, gid string) {
	pool, err := t.logPool(ctx)
	if err == nil {
		_, err = pool.Exec(ctx, `DELETE FROM `+logTable+` WHERE gid = $1`, gid)
	}
	if err != nil {
		t.cfg.Log.Warn("two-phase commit: removing a finished transaction from the log failed", "gid", gid, "err", err)
	}
}

// prepareError explains a failed PREPARE TRANSACTION; the commonest cause
// is a node configured without prepared transactions.
func prepareError(node string, err error) error {
	var pg *pgconn.PgError
	if errors.As(err, &pg) && pg.Code == "55000" && strings.Contains(pg.Message, "prepared transactions are disabled") {
		e := Errorf("55000", "node %s has max_prepared_transactions = 0, and a transaction across nodes needs two-phase commit; the transaction was rolled back", node)
		e.Hint = "set max_prepared_transactions above 0 on every node (for example to max_connections) and restart it"
		return e
	}
	return err
}

// noSuchGID reports the error of COMMIT/ROLLBACK PREPARED for a gid that is
// already finished.
func noSuchGID(err error) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && pg.Code == "42704"
}

// RunRecoverer finishes the prepared transactions with a Lattice gid on
// every node, at once and then every RecoverEvery until ctx ends.
func (t *TwoPhase) RunRecoverer(ctx context.Context) {
	t.checkNodes(ctx)
	for {
		if err := t.recoverOnce(ctx); err != nil && ctx.Err() == nil {
			t.cfg.Log.Warn("two-phase recovery pass failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(t.cfg.RecoverEvery):
		}
	}
}

// checkNodes warns at start about nodes that cannot take part in a
// transaction across nodes.
func (t *TwoPhase) checkNodes(ctx context.Context) {
	c := t.cfg.Cluster
	for _, node := range c.NodeNames() {
		pool, err := c.Admin(ctx, node, c.DefaultTenant())
		if err != nil {
			continue
		}
		var n int
		if err := pool.QueryRow(ctx, `SELECT current_setting('max_prepared_transactions')::int`).Scan(&n); err == nil && n == 0 {
			t.cfg.Log.Error("node has max_prepared_transactions = 0: transactions across nodes will fail there", "node", node)
		}
	}
}

type logRow struct {
	state string
	age   time.Duration
}

type preparedXact struct {
	node, database, gid string
	age                 time.Duration
}

// recoverOnce is one pass of the recoverer. The log is read before the
// nodes: a commit decision is recorded only after every PREPARE succeeded,
// so a prepared transaction seen afterwards whose row was not 'committed'
// at the read either gets its decision later (and is young) or never.
func (t *TwoPhase) recoverOnce(ctx context.Context) error {
	if err := t.ensureLog(ctx); err != nil {
		return err
	}
	pool, err := t.logPool(ctx)
	if err != nil {
		return err
	}
	rows, err := pool.Query(ctx, `SELECT gid, state, extract(epoch FROM now() - created)::float8 FROM `+logTable)
	if err != nil {
		return err
	}
	log := map[string]logRow{}
	for rows.Next() {
		var gid, state string
		var age float64
		if err := rows.Scan(&gid, &state, &age); err != nil {
			rows.Close()
			return err
		}
		log[gid] = logRow{state: state, age: time.Duration(age * float64(time.Second))}
	}
	if err := rows.Err(); err != nil {
		return err
	}

	c := t.cfg.Cluster
	var xacts []preparedXact
	complete := true
	for _, node := range c.NodeNames() {
		px, err := t.preparedOn(ctx, node)
		if err != nil {
			complete = false
			t.cfg.Log.Warn("two-phase recovery: cannot list prepared transactions", "node", node, "err", err)
			continue
		}
		xacts = append(xacts, px...)
	}

	pending := map[string]bool{}
	for _, x := range xacts {
		if _, live := t.live.Load(x.gid); live {
			pending[x.gid] = true
			continue
		}
		row, logged := log[x.gid]
		var action string
		switch {
		case logged && row.state == "committed":
			action = "COMMIT PREPARED"
		case logged && row.state == "aborted":
			action = "ROLLBACK PREPARED"
		case x.age < t.cfg.AbortAfter:
			pending[x.gid] = true
			continue
		case logged:
			// No decision yet and too old: abort, unless the coordinator
			// records its decision first.
			n, err := t.logWrite(ctx, `UPDATE `+logTable+` SET state = 'aborted' WHERE gid = $1 AND state = 'preparing'`, x.gid)
			if err != nil || n == 0 {
				pending[x.gid] = true
				continue
			}
			log[x.gid] = logRow{state: "aborted", age: row.age}
			action = "ROLLBACK PREPARED"
		default:
			// No log row: no commit decision was ever recorded.
			action = "ROLLBACK PREPARED"
		}
		if err := t.finishPrepared(ctx, x, action); err != nil {
			pending[x.gid] = true
			t.cfg.Log.Warn("two-phase recovery: cannot finish a prepared transaction", "gid", x.gid, "node", x.node, "action", action, "err", err)
			continue
		}
		t.cfg.Log.Info("two-phase recovery finished a prepared transaction", "gid", x.gid, "node", x.node, "database", x.database, "action", action)
	}
	if !complete {
		return nil
	}
	for gid, row := range log {
		if _, live := t.live.Load(gid); live || pending[gid] {
			continue
		}
		if row.state == "preparing" && row.age < t.cfg.AbortAfter {
			continue // a coordinator may be about to prepare
		}
		if _, err := pool.Exec(ctx, `DELETE FROM `+logTable+` WHERE gid = $1 AND state = $2`, gid, row.state); err != nil {
			return err
		}
	}
	return nil
}

// preparedOn lists node's prepared transactions with a Lattice gid, in
// every database (pg_prepared_xacts is cluster-wide).
func (t *TwoPhase) preparedOn(ctx context.Context, node string) ([]preparedXact, error) {
	c := t.cfg.Cluster
	pool, err := c.Admin(ctx, node, c.DefaultTenant())
	if err != nil {
		return nil, err
	}
	rows, err := pool.Query(ctx, `SELECT gid, database::text, extract(epoch FROM now() - prepared)::float8
		FROM pg_prepared_xacts WHERE starts_with(gid, $1)`, gidPrefix)
	if err != nil {
		return nil, err
	}
	var out []preparedXact
	for rows.Next() {
		x := preparedXact{node: node}
		var age float64
		if err := rows.Scan(&x.gid, &x.database, &age); err != nil {
			rows.Close()
			return nil, err
		}
		x.age = time.Duration(age * float64(time.Second))
		out = append(out, x)
	}
	return out, rows.Err()
}

// finishPrepared runs COMMIT PREPARED or ROLLBACK PREPARED where x lives:
// it must run in x's database.
func (t *TwoPhase) finishPrepared(ctx context.Context, x preparedXact, action string) error {
	pool, err := t.cfg.Cluster.Admin(ctx, x.node, x.database)
	if err != nil {
		return err
	}
	_, err = pool.Exec(ctx, action+" "+quoteLiteral(x.gid))
	if noSuchGID(err) {
		return nil
	}
	return err
}
