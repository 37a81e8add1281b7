package proxy

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/sqlstate"
)

// Commit across nodes (docs/DESIGN.md, "Transactions across nodes").
//
// The decision is a row in lattice_meta.commit_decisions of the
// transaction's own database on the catalog node, written inside the
// catalog node's part of the transaction, as Citus writes its transaction
// records: the other participants that wrote are PREPAREd, then the catalog
// node inserts the row and COMMITs in one phase (that commit is the
// decision), then the others are COMMIT PREPARED. A participant that wrote
// nothing is not prepared: it commits with the rest. When the catalog node
// is not a participant, a transaction of its own on the catalog node holds
// the decision the same way.

// gidPrefix marks the prepared transactions of Lattice in pg_prepared_xacts.
// A gid is lattice_<proxy>_<sequence>_<pid>, where pid is the catalog
// node's backend that holds the decision: the recoverer looks it up to
// know whether that transaction can still commit.
const gidPrefix = "lattice_"

// Crash points of the test-only hook TwoPhaseConfig.CrashAt.
const (
	// CrashAfterPrepare: the other writers are prepared, the catalog node
	// has not committed (no decision).
	CrashAfterPrepare = "after-prepare"
	// CrashAfterDecision: the catalog node committed the decision, COMMIT
	// PREPARED was not sent.
	CrashAfterDecision = "after-decision"
	// StallAfterPrepare does not crash: after the PREPAREs it waits until
	// another proxy's recoverer has rolled them back, then records the
	// decision, which must then fail.
	StallAfterPrepare = "stall-after-prepare"
)

// decisionTable is the decision log, one per tenant database on the
// catalog node. A row with state 'committed' is the commit decision, made
// by the transaction that inserts it; a row with state 'aborted' is a
// recoverer's claim on a transaction that had no decision, so that its
// decision can no longer be inserted (the gid is the key). Committed rows
// are removed by the recoverer once no participant is prepared; aborted
// ones once the transaction that would have decided has ended.
const decisionTable = "lattice_meta.commit_decisions"

var decisionDDL = []string{
	`CREATE SCHEMA IF NOT EXISTS lattice_meta`,
	`CREATE TABLE IF NOT EXISTS ` + decisionTable + ` (
		gid          text PRIMARY KEY,
		state        text NOT NULL CHECK (state IN ('committed', 'aborted')),
		participants text[] NOT NULL,
		created      timestamptz NOT NULL DEFAULT now()
	)`,
	// The tenant's role has no right on the table: the decision is inserted
	// by this function, which runs as the control role and takes only a gid
	// whose last part is the calling backend's pid, the backend that holds
	// the decision (DESIGN section 15).
	`CREATE OR REPLACE FUNCTION ` + decideFunction + `(gid text, participants text[]) RETURNS void
	LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $decide$
	BEGIN
		IF gid !~ ('^lattice_[0-9a-f]+_[0-9]+_' || pg_backend_pid() || '$') THEN
			RAISE EXCEPTION 'a commit decision is made only by the backend its gid names'
				USING ERRCODE = '42501';
		END IF;
		INSERT INTO ` + decisionTable + ` (gid, state, participants) VALUES (gid, 'committed', participants);
	END
	$decide$`,
	`REVOKE ALL ON ` + decisionTable + ` FROM PUBLIC`,
	`REVOKE ALL ON FUNCTION ` + decideFunction + `(text, text[]) FROM PUBLIC`,
}

// decideFunction inserts a committed decision for the tenant's role.
const decideFunction = "lattice_meta.decide_commit"

// decisionGrants let tenant's role call decideFunction, and nothing else
// in lattice_meta.
func decisionGrants(tenant string) []string {
	role := pgx.Identifier{pgshard.TenantRole(tenant)}.Sanitize()
	return []string{
		`GRANT USAGE ON SCHEMA lattice_meta TO ` + role,
		`GRANT EXECUTE ON FUNCTION ` + decideFunction + `(text, text[]) TO ` + role,
	}
}

// askWrote asks a participant whether its transaction wrote: a transaction
// id is assigned by its first write or row lock. Its tag is "SELECT 1" when
// it did.
const askWrote = `SELECT 1 WHERE pg_current_xact_id_if_assigned() IS NOT NULL`

// TwoPhaseConfig configures the two-phase commit coordinator.
type TwoPhaseConfig struct {
	Cluster *pgshard.Cluster
	// RecoverEvery is how often the recoverer looks for prepared
	// transactions left behind; 0 means 10 s.
	RecoverEvery time.Duration
	// AbortAfter is how old a prepared transaction without a commit
	// decision must be before the recoverer rolls it back while the
	// transaction that would decide it may still be running; it should
	// exceed any prepare phase. 0 means 1 min.
	AbortAfter time.Duration
	// CrashAt is a test-only hook (cmd/lattice reads it from the
	// LATTICE_TEST_CRASH_2PC environment variable at start): at that point
	// of every two-phase commit (CrashAfterPrepare, CrashAfterDecision) the
	// proxy kills itself with SIGKILL, so that crash recovery can be tested
	// for real; StallAfterPrepare waits instead. Never set it in production.
	CrashAt string
	Log     *slog.Logger
}

// TwoPhase commits transactions that span several nodes, and finishes what
// a crashed coordinator left prepared (RunRecoverer).
type TwoPhase struct {
	cfg     TwoPhaseConfig
	owner   string // this proxy, in gids
	seq     atomic.Uint64
	live    sync.Map // gid -> struct{}: this proxy's commits in progress
	ready   sync.Map // tenant database -> struct{}: its decision log exists
	tenants sync.Map // tenant database -> struct{}: databases the recoverer reads
	mu      sync.Mutex
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
	t := &TwoPhase{cfg: cfg, owner: hex.EncodeToString(b[:])}
	if cfg.Cluster != nil {
		t.tenants.Store(cfg.Cluster.DefaultTenant(), struct{}{})
	}
	return t
}

// logPool is the control pool of database on the catalog node.
func (t *TwoPhase) logPool(ctx context.Context, database string) (*pgxpool.Pool, error) {
	c := t.cfg.Cluster
	return c.Admin(ctx, c.Catalog().Name, database)
}

// ensureLog creates database's decision log once. Proxies starting
// together may race on CREATE ... IF NOT EXISTS; the loser finds the table
// there.
func (t *TwoPhase) ensureLog(ctx context.Context, database string) error {
	if _, ok := t.ready.Load(database); ok {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.ready.Load(database); ok {
		return nil
	}
	if err := t.cfg.Cluster.EnsureRole(ctx, t.cfg.Cluster.Catalog().Name, database); err != nil {
		return err
	}
	pool, err := t.logPool(ctx, database)
	if err != nil {
		return err
	}
	// One transaction under a lock: CREATE ... IF NOT EXISTS and CREATE OR
	// REPLACE FUNCTION race with themselves across proxies, and a log
	// without its function or grants would refuse every decision.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('lattice_meta.commit_decisions'))`); err != nil {
			return err
		}
		for _, ddl := range append(decisionDDL, decisionGrants(database)...) {
			if _, err := tx.Exec(ctx, ddl); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("create the decision log %s in database %s: %w", decisionTable, database, err)
	}
	t.tenants.Store(database, struct{}{})
	t.ready.Store(database, struct{}{})
	return nil
}

func (t *TwoPhase) crash(ctx context.Context, point, gid string) {
	switch {
	case t.cfg.CrashAt != point:
	case point == StallAfterPrepare:
		t.stall(ctx, gid)
	default:
		t.cfg.Log.Error("test hook LATTICE_TEST_CRASH_2PC: killing the proxy", "point", point)
		if p, err := os.FindProcess(os.Getpid()); err == nil {
			_ = p.Kill()
		}
		select {} // SIGKILL cannot be caught: nothing runs after it
	}
}

// stall waits until no node holds gid prepared, for at most a minute.
func (t *TwoPhase) stall(ctx context.Context, gid string) {
	t.cfg.Log.Warn("test hook LATTICE_TEST_CRASH_2PC: stalling until another proxy rolls the transaction back", "gid", gid)
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		left := false
		for _, node := range t.cfg.Cluster.NodeNames() {
			xs, err := t.preparedOn(ctx, node)
			for _, x := range xs {
				left = left || x.gid == gid
			}
			left = left || err != nil
		}
		if !left {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// participant is one node's part of a transaction: a pooled backend of a
// session, or a control transaction (DDL, or the catalog node's decision
// when no statement ran there).
type participant struct {
	node string
	be   *pgshard.Conn
	tx   pgx.Tx
}

// pid is the participant's backend process on its node.
func (p participant) pid() uint32 {
	if p.be != nil {
		return p.be.PID()
	}
	return p.tx.Conn().PgConn().PID()
}

// mayBeOpen reports whether the participant may still be inside its
// transaction after a failed statement (a control transaction cannot say).
func (p participant) mayBeOpen() bool {
	if p.be != nil {
		return p.be.TxStatus != 'I' && !p.be.Broken()
	}
	return true
}

// execParts runs sqls[i] on participant i: backends at once in one round
// trip, control transactions one after the other. It returns each one's
// command tag and error.
func execParts(ctx context.Context, parts []participant, sqls []string) ([]string, []error) {
	tags, errs := make([]string, len(parts)), make([]error, len(parts))
	var conns []*pgshard.Conn
	var connSQL []string
	var at []int
	for i, p := range parts {
		if p.be != nil {
			conns, connSQL, at = append(conns, p.be), append(connSQL, sqls[i]), append(at, i)
			continue
		}
		tag, err := p.tx.Exec(ctx, sqls[i])
		tags[i], errs[i] = tag.String(), err
	}
	ctags, cerrs := execEach(ctx, conns, connSQL)
	for j, i := range at {
		tags[i], errs[i] = ctags[j], cerrs[j]
	}
	return tags, errs
}

// execSame runs sql on every participant (execParts).
func execSame(ctx context.Context, parts []participant, sql string) []error {
	sqls := make([]string, len(parts))
	for i := range sqls {
		sqls[i] = sql
	}
	_, errs := execParts(ctx, parts, sqls)
	return errs
}

// commit commits the transaction held by conns (idle, inside a transaction
// block, in database) on every node. On return the backends are idle; the
// transaction committed if the error is nil.
func (t *TwoPhase) commit(ctx context.Context, database string, conns []*pgshard.Conn) error {
	parts := make([]participant, len(conns))
	for i, be := range conns {
		parts[i] = participant{node: be.Node, be: be}
	}
	return t.commitParts(ctx, database, parts)
}

// CommitTxs commits control transactions of database, one per node,
// together (pgshard.CommitFunc): the DDL of a tree uses it.
func (t *TwoPhase) CommitTxs(ctx context.Context, database string, nodes []string, txs []pgx.Tx) error {
	parts := make([]participant, len(txs))
	for i, tx := range txs {
		parts[i] = participant{node: nodes[i], tx: tx}
	}
	return t.commitParts(ctx, database, parts)
}

// commitParts commits parts together. Participants known to have written
// (a data-changing command tag, or a control transaction) are prepared at
// once; the others are asked whether they wrote, in the same round trip.
// When no decision is needed (one writer or none) nothing is prepared and
// every participant commits in one phase; otherwise the catalog node's
// part records the decision and commits in one phase (decide).
func (t *TwoPhase) commitParts(ctx context.Context, database string, parts []participant) error {
	catalog := t.cfg.Cluster.Catalog().Name
	var holder *participant
	var writers, unsure []participant
	for i, p := range parts {
		switch {
		case p.node == catalog && holder == nil:
			holder = &parts[i]
		case p.tx != nil || p.be.Wrote:
			writers = append(writers, p)
		default:
			unsure = append(unsure, p)
		}
	}
	// needed reports whether n writers other than the catalog node's part
	// need a recorded decision.
	needed := func(n int) bool { return n >= 2 || (holder != nil && n >= 1) }

	everyone := parts
	var gid string
	var prepared []participant
	ownHolder := false
	defer func() {
		if gid != "" {
			t.live.Delete(gid)
		}
		if ownHolder {
			// No-op once committed; either way the connection goes back.
			_ = holder.tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	// fail rolls back everything prepared or still open.
	fail := func(err error) error {
		t.abort(ctx, gid, prepared)
		var open []participant
		for _, p := range everyone {
			if !contains(prepared, p) && p.mayBeOpen() && !(ownHolder && p == *holder) {
				open = append(open, p)
			}
		}
		execSame(ctx, open, "ROLLBACK")
		return err
	}
	// start names the transaction, first opening a transaction on the
	// catalog node to hold the decision if none of the client's ran there.
	start := func() error {
		if holder == nil {
			h, err := t.openHolder(ctx, database)
			if err != nil {
				return sqlstate.New(sqlstate.SystemError, "cannot commit across nodes: cannot open a transaction on the catalog node to record the decision: %v", err)
			}
			holder, ownHolder = &h, true
			everyone = append(slices.Clone(parts), h)
		}
		if err := t.ensureLog(ctx, database); err != nil {
			return sqlstate.New(sqlstate.SystemError, "cannot commit across nodes: %v", err)
		}
		gid = fmt.Sprintf("%s%s_%d_%d", gidPrefix, t.owner, t.seq.Add(1), holder.pid())
		t.live.Store(gid, struct{}{})
		return nil
	}

	// Round 1: PREPARE the writers if a decision is needed already, and
	// ask the others whether they wrote.
	if needed(len(writers)) {
		if err := start(); err != nil {
			return fail(err)
		}
	}
	var round []participant
	var sqls []string
	if gid != "" {
		for _, p := range writers {
			round, sqls = append(round, p), append(sqls, "PREPARE TRANSACTION "+quoteLiteral(gid))
		}
		writers = nil
	}
	for _, p := range unsure {
		round, sqls = append(round, p), append(sqls, askWrote)
	}
	var readers []participant
	var first error
	tags, errs := execParts(ctx, round, sqls)
	for i, p := range round {
		switch {
		case errs[i] != nil:
			first = cmp.Or(first, prepareError(p.node, errs[i]))
		case sqls[i] != askWrote:
			prepared = append(prepared, p)
		case tags[i] == "SELECT 1":
			writers = append(writers, p)
		default:
			readers = append(readers, p)
		}
	}
	if first != nil {
		return fail(first)
	}
	if gid == "" {
		if !needed(len(writers)) {
			return commitOnePhase(ctx, holder, writers, readers)
		}
		if err := start(); err != nil {
			return fail(err)
		}
	}
	// Round 2: PREPARE the writers found by asking.
	for i, err := range execSame(ctx, writers, "PREPARE TRANSACTION "+quoteLiteral(gid)) {
		if err == nil {
			prepared = append(prepared, writers[i])
		} else {
			first = cmp.Or(first, prepareError(writers[i].node, err))
		}
	}
	if len(prepared) > 0 {
		t.crash(ctx, CrashAfterPrepare, gid)
		t.crash(ctx, StallAfterPrepare, gid)
	}
	if first != nil {
		return fail(first)
	}

	// The decision: the catalog node's part commits with its row.
	if err := t.decide(ctx, *holder, gid, prepared); err != nil {
		if errors.Is(err, errOutcomeUnknown) {
			t.cfg.Log.Error("two-phase commit: the outcome of the decision is unknown; the recoverer finishes the transaction", "gid", gid, "err", err)
			execSame(ctx, readers, "ROLLBACK")
			return sqlstate.New(sqlstate.TransactionResolutionUnknown, "the outcome of this transaction is unknown: the connection to the catalog node was lost while it committed: %v", err)
		}
		return fail(err)
	}
	t.crash(ctx, CrashAfterDecision, gid)

	finish := append(slices.Clone(prepared), readers...)
	sqls = sqls[:0]
	for i := range finish {
		if i < len(prepared) {
			sqls = append(sqls, "COMMIT PREPARED "+quoteLiteral(gid))
		} else {
			sqls = append(sqls, "COMMIT")
		}
	}
	_, errs = execParts(ctx, finish, sqls)
	for i, err := range errs[:len(prepared)] {
		if err != nil {
			t.cfg.Log.Warn("two-phase commit: COMMIT PREPARED failed; the recoverer finishes it", "gid", gid, "node", finish[i].node, "err", err)
		}
	}
	return nil
}

// commitOnePhase commits a transaction with at most one participant that
// wrote: every part commits at once, and only the writer's (or the catalog
// node's) failure is the transaction's.
func commitOnePhase(ctx context.Context, holder *participant, writers, readers []participant) error {
	all := slices.Clone(writers)
	if holder != nil {
		all = append(all, *holder)
	}
	n := len(all)
	all = append(all, readers...)
	var first error
	for i, err := range execSame(ctx, all, "COMMIT") {
		if i < n {
			first = cmp.Or(first, err)
		}
	}
	return first
}

func contains(parts []participant, p participant) bool {
	return slices.ContainsFunc(parts, func(q participant) bool { return q == p })
}

// openHolder opens a transaction on the catalog node to hold the decision
// of a transaction that did not run there. BEGIN is acknowledged before any
// participant prepares: the recoverer relies on the holder's transaction
// having started by then.
func (t *TwoPhase) openHolder(ctx context.Context, database string) (participant, error) {
	pool, err := t.logPool(ctx, database)
	if err != nil {
		return participant{}, err
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return participant{}, err
	}
	return participant{node: t.cfg.Cluster.Catalog().Name, tx: tx}, nil
}

// errOutcomeUnknown marks a decision whose commit was sent but whose answer
// was lost: the decision row tells.
var errOutcomeUnknown = errors.New("outcome unknown")

// decisionLocal makes the decision durable before the commit returns and
// keeps a client's statement_timeout from cancelling it.
const decisionLocal = "SET LOCAL synchronous_commit TO on; SET LOCAL statement_timeout TO 0"

// decide inserts the decision row into h's transaction and commits it; on
// success the transaction is committed. Any other error means h rolled
// back (the transaction is aborted), except errOutcomeUnknown.
func (t *TwoPhase) decide(ctx context.Context, h participant, gid string, prepared []participant) error {
	nodes := make([]string, len(prepared))
	for i, p := range prepared {
		nodes[i] = quoteIdentArray(p.node)
	}
	insert := `SELECT ` + decideFunction + `(` + quoteLiteral(gid) + `, ` + quoteLiteral("{"+strings.Join(nodes, ",")+"}") + `)`
	if h.be != nil {
		tags, errs := execEach(ctx, []*pgshard.Conn{h.be}, []string{decisionLocal + "; " + insert + "; COMMIT"})
		switch {
		case h.be.Broken():
			return fmt.Errorf("%w: %w", errOutcomeUnknown, errs[0])
		case errs[0] != nil:
			if h.be.TxStatus != 'I' {
				execAll(ctx, []*pgshard.Conn{h.be}, "ROLLBACK")
			}
			return decisionError(errs[0])
		case tags[0] != "COMMIT":
			return sqlstate.New(sqlstate.TransactionRollback, "the transaction was rolled back on the catalog node")
		}
		return nil
	}
	_, err := h.tx.Exec(ctx, "SET LOCAL synchronous_commit TO on")
	if err == nil {
		_, err = h.tx.Exec(ctx, insert)
	}
	if err != nil {
		_ = h.tx.Rollback(ctx)
		return decisionError(err)
	}
	if err := h.tx.Commit(ctx); err != nil {
		var pg *pgconn.PgError
		if errors.As(err, &pg) || errors.Is(err, pgx.ErrTxCommitRollback) {
			return decisionError(err)
		}
		return fmt.Errorf("%w: %w", errOutcomeUnknown, err)
	}
	return nil
}

// arrayElemEscaper escapes a text array literal's element. Built once: a
// Replacer builds its tables on first use, which a replacer made per call
// did on every commit across nodes.
var arrayElemEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`)

// quoteIdentArray quotes one element of a text array literal.
func quoteIdentArray(s string) string {
	return `"` + arrayElemEscaper.Replace(s) + `"`
}

// decisionError explains a decision that could not be recorded: a
// recoverer that gave up on the transaction claimed its gid first.
func decisionError(err error) error {
	var pg *pgconn.PgError
	if errors.As(err, &pg) && pg.Code == sqlstate.UniqueViolation && pg.TableName == "commit_decisions" {
		e := sqlstate.New(sqlstate.TransactionRollback, "the transaction was rolled back: its prepare phase outlasted the recovery bound, and a recoverer rolled it back")
		e.Hint = "retry the transaction; if this recurs, raise --tx-abort-after"
		return e
	}
	return err
}

// abort rolls back the participants that prepared. One that cannot be
// reached is left to the recoverer: its gid has no decision.
func (t *TwoPhase) abort(ctx context.Context, gid string, prepared []participant) {
	if len(prepared) == 0 {
		return
	}
	for i, err := range execSame(ctx, prepared, "ROLLBACK PREPARED "+quoteLiteral(gid)) {
		if err != nil && !noSuchGID(err) {
			t.cfg.Log.Warn("two-phase commit: ROLLBACK PREPARED failed; the recoverer finishes it", "gid", gid, "node", prepared[i].node, "err", err)
		}
	}
}

// prepareError explains a failed PREPARE TRANSACTION; the commonest cause
// is a node configured without prepared transactions.
func prepareError(node string, err error) error {
	var pg *pgconn.PgError
	if errors.As(err, &pg) && pg.Code == sqlstate.ObjectNotInPrerequisiteState && strings.Contains(pg.Message, "prepared transactions are disabled") {
		e := sqlstate.New(sqlstate.ObjectNotInPrerequisiteState, "node %s has max_prepared_transactions = 0, and a transaction across nodes needs two-phase commit; the transaction was rolled back", node)
		e.Hint = "set max_prepared_transactions above 0 on every node (for example to max_connections) and restart it"
		return e
	}
	return err
}

// noSuchGID reports the error of COMMIT/ROLLBACK PREPARED for a gid that is
// already finished.
func noSuchGID(err error) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && pg.Code == sqlstate.UndefinedObject
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

// decision is one row of a decision log.
type decision struct {
	state   string
	created time.Time
}

type preparedXact struct {
	node, database, gid string
	age                 time.Duration
}

// recoverOnce is one pass of the recoverer. The decision logs are read
// before the nodes are listed: a committed decision row means every
// participant had prepared, so a row whose gid no node lists afterwards is
// finished and can go.
func (t *TwoPhase) recoverOnce(ctx context.Context) error {
	logs := map[string]map[string]decision{}
	var firstErr error
	t.tenants.Range(func(k, _ any) bool {
		db := k.(string)
		rows, err := t.readLog(ctx, db, nil)
		if err != nil {
			firstErr = cmp.Or(firstErr, fmt.Errorf("read the decision log of database %s: %w", db, err))
			return true
		}
		logs[db] = rows
		return true
	})

	c := t.cfg.Cluster
	byDB := map[string][]preparedXact{}
	listed := map[string]bool{}
	complete := true
	for _, node := range c.NodeNames() {
		px, err := t.preparedOn(ctx, node)
		if err != nil {
			complete = false
			t.cfg.Log.Warn("two-phase recovery: cannot list prepared transactions", "node", node, "err", err)
			continue
		}
		for _, x := range px {
			byDB[x.database] = append(byDB[x.database], x)
			listed[x.gid] = true
		}
	}

	for db, xs := range byDB {
		t.tenants.Store(db, struct{}{})
		var unseen []string
		for _, x := range xs {
			if _, ok := logs[db][x.gid]; !ok {
				unseen = append(unseen, x.gid)
			}
		}
		fresh := map[string]decision{}
		var err error
		if len(unseen) > 0 {
			fresh, err = t.readLog(ctx, db, unseen)
		}
		if err != nil {
			firstErr = cmp.Or(firstErr, fmt.Errorf("read the decision log of database %s: %w", db, err))
			continue
		}
		for _, x := range xs {
			d, ok := logs[db][x.gid]
			if !ok {
				d, ok = fresh[x.gid]
			}
			t.resolve(ctx, x, d, ok)
		}
	}
	if !complete {
		return firstErr
	}
	for db, rows := range logs {
		var done []string
		for gid, d := range rows {
			if _, live := t.live.Load(gid); live || listed[gid] {
				continue
			}
			// A claim stays while the transaction it stopped may still try
			// to record its decision.
			if d.state == "aborted" && !t.writerGone(ctx, gid, d.created) {
				continue
			}
			done = append(done, gid)
		}
		if len(done) == 0 {
			continue
		}
		pool, err := t.logPool(ctx, db)
		if err == nil {
			_, err = pool.Exec(ctx, `DELETE FROM `+decisionTable+` WHERE gid = ANY($1)`, done)
		}
		if err != nil {
			firstErr = cmp.Or(firstErr, fmt.Errorf("clean the decision log of database %s: %w", db, err))
		}
	}
	return firstErr
}

// resolve finishes one prepared transaction left behind: committed when
// its gid has a decision row, rolled back when it has none and the
// transaction that would have recorded it is gone (or, past AbortAfter,
// can no longer record it: the recoverer claims the gid first).
func (t *TwoPhase) resolve(ctx context.Context, x preparedXact, d decision, decided bool) {
	if _, live := t.live.Load(x.gid); live {
		return
	}
	if !decided && t.legacyCommitted(ctx, x.gid) {
		d, decided = decision{state: "committed"}, true
	}
	if !decided {
		if x.age < t.cfg.AbortAfter && !t.writerGone(ctx, x.gid, time.Time{}) {
			return // the coordinator may be about to decide
		}
		state, err := t.claim(ctx, x.database, x.gid)
		if err != nil {
			t.cfg.Log.Warn("two-phase recovery: cannot claim a prepared transaction without a decision", "gid", x.gid, "database", x.database, "err", err)
			return
		}
		d.state = state
	}
	action := "ROLLBACK PREPARED"
	if d.state == "committed" {
		action = "COMMIT PREPARED"
	}
	if err := t.finishPrepared(ctx, x, action); err != nil {
		t.cfg.Log.Warn("two-phase recovery: cannot finish a prepared transaction", "gid", x.gid, "node", x.node, "action", action, "err", err)
		return
	}
	t.cfg.Log.Info("two-phase recovery finished a prepared transaction", "gid", x.gid, "node", x.node, "database", x.database, "action", action)
}

// claim inserts an 'aborted' row for gid unless a decision is there, and
// returns the gid's state. A coordinator's decision that is being inserted
// makes the claim wait for its outcome; one that comes later fails on the
// key.
func (t *TwoPhase) claim(ctx context.Context, database, gid string) (string, error) {
	if err := t.ensureLog(ctx, database); err != nil {
		return "", err
	}
	pool, err := t.logPool(ctx, database)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	tag, err := pool.Exec(ctx, `INSERT INTO `+decisionTable+` (gid, state, participants) VALUES ($1, 'aborted', '{}')
		ON CONFLICT (gid) DO NOTHING`, gid)
	if err != nil {
		return "", err
	}
	if tag.RowsAffected() == 1 {
		return "aborted", nil
	}
	// A new statement: its snapshot sees the row the INSERT waited for.
	var state string
	err = pool.QueryRow(ctx, `SELECT state FROM `+decisionTable+` WHERE gid = $1`, gid).Scan(&state)
	return state, err
}

// legacyLog is the decision log of Lattice before the decision moved into
// the catalog node's own transaction: one table in the default tenant's
// database, rows 'preparing', 'committed' or 'aborted', gids without a pid.
const legacyLog = "lattice_meta.transactions"

// legacyCommitted reports whether gid, in the old format, has a commit
// decision in the old log, so that a transaction an old proxy left
// prepared after deciding it is still committed after an upgrade.
func (t *TwoPhase) legacyCommitted(ctx context.Context, gid string) bool {
	if strings.Count(gid, "_") != 2 {
		return false
	}
	pool, err := t.logPool(ctx, t.cfg.Cluster.DefaultTenant())
	if err != nil {
		return false
	}
	var n int
	err = pool.QueryRow(ctx, `SELECT count(*) FROM `+legacyLog+` WHERE gid = $1 AND state = 'committed'`, gid).Scan(&n)
	return err == nil && n > 0
}

// writerGone reports whether the catalog node's backend named in gid,
// which holds the transaction that records the decision, has no
// transaction begun at or before since (any transaction if since is
// zero): then that transaction has ended.
func (t *TwoPhase) writerGone(ctx context.Context, gid string, since time.Time) bool {
	i := strings.LastIndexByte(gid, '_')
	pid, err := strconv.ParseUint(gid[i+1:], 10, 32)
	if err != nil {
		return false
	}
	pool, err := t.logPool(ctx, t.cfg.Cluster.DefaultTenant())
	if err != nil {
		return false
	}
	var busy bool
	var at *time.Time
	if !since.IsZero() {
		at = &since
	}
	err = pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
		WHERE pid = $1 AND ($2::timestamptz IS NULL OR xact_start <= $2))`, int64(pid), at).Scan(&busy)
	return err == nil && !busy
}

// readLog reads database's decision log, only the given gids unless gids
// is nil. A database without a log has no decisions.
func (t *TwoPhase) readLog(ctx context.Context, database string, gids []string) (map[string]decision, error) {
	out := map[string]decision{}
	pool, err := t.logPool(ctx, database)
	if err != nil {
		return nil, err
	}
	sql := `SELECT gid, state, created FROM ` + decisionTable
	var args []any
	if gids != nil {
		sql += ` WHERE gid = ANY($1)`
		args = append(args, gids)
	}
	rows, err := pool.Query(ctx, sql, args...)
	if err != nil {
		var pg *pgconn.PgError
		if errors.As(err, &pg) && (pg.Code == sqlstate.UndefinedTable || pg.Code == sqlstate.InvalidSchemaName) {
			return out, nil // no log yet
		}
		return nil, err
	}
	for rows.Next() {
		var gid string
		var d decision
		if err := rows.Scan(&gid, &d.state, &d.created); err != nil {
			rows.Close()
			return nil, err
		}
		out[gid] = d
	}
	return out, rows.Err()
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
