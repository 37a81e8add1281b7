package migrator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lattice-db/lattice/btreeindex"
	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// Merge conflict rules (lattice_merge's on_conflict): which row a key that
// both trees hold keeps.
const (
	MergeSourceWins = "source" // the source's row replaces the target's
	MergeTargetWins = "target" // the target's row stays (DO NOTHING)
	// any other value names a timestamp column: the newer row wins
)

// MergeSpec is what a merge copies: every column of the source, each of
// which the target must have, with the target's primary key among them.
type MergeSpec struct {
	Source, Target *shardmap.Tree
	// OnConflict is MergeSourceWins, MergeTargetWins or a column of both
	// trees whose newer value wins.
	OnConflict string
}

// CheckMerge refuses a merge the trees cannot take, with the SQLSTATE and
// a hint a client sees.
func CheckMerge(source, target *shardmap.Tree, onConflict string) error {
	if source.Name == target.Name {
		return sqlstate.New(sqlstate.InvalidParameterValue, "lattice_merge: source and target are the same tree %s", source.Name).
			WithHint("Name two different trees.")
	}
	if source.KeyType != target.KeyType {
		return sqlstate.New(sqlstate.DatatypeMismatch, "lattice_merge: tree %s has a %s shard key and tree %s a %s one",
			source.Name, source.KeyType, target.Name, target.KeyType).
			WithHint("Merge trees whose shard keys have the same type (text and varchar, integers, or uuid).")
	}
	if source.KeyColumn != target.KeyColumn {
		return sqlstate.New(sqlstate.DatatypeMismatch, "lattice_merge: tree %s is keyed by %s and tree %s by %s",
			source.Name, source.KeyColumn, target.Name, target.KeyColumn).
			WithHint("Rename one tree's key column so both trees have the same shard key column.")
	}
	for _, c := range source.Columns {
		if !slices.Contains(target.Columns, c) {
			return sqlstate.New(sqlstate.UndefinedColumn, "lattice_merge: tree %s has no column %s of tree %s", target.Name, c, source.Name).
				WithHint("Add the column to the target tree (ALTER TABLE through the proxy) before the merge.")
		}
	}
	switch onConflict {
	case MergeSourceWins, MergeTargetWins:
	default:
		if !slices.Contains(source.Columns, onConflict) {
			return sqlstate.New(sqlstate.InvalidParameterValue, "lattice_merge: on_conflict %q is neither 'source', 'target' nor a column of both trees", onConflict).
				WithHint("Use on_conflict => 'source', 'target' or the name of a timestamp column of both trees.")
		}
	}
	return nil
}

// MergeSource is one shard of the source tree as a merge recorded it: its
// rows are those of the slots it owned (a mixed shard holds others too).
type MergeSource struct {
	Shard int      `json:"shard"`
	Node  string   `json:"node"`
	Slots [][2]int `json:"slots"`
}

// MergeSources lists the shards of m that own slots, as a merge records
// them when it starts or re-drains.
func MergeSources(m *shardmap.Map) []MergeSource {
	var out []MergeSource
	for _, idx := range m.OwningShards() {
		out = append(out, MergeSource{Shard: idx, Node: m.Shards[idx].Node, Slots: m.SlotRanges(idx)})
	}
	return out
}

// SourcesChanged reports whether m no longer routes the recorded shards
// as they were recorded: a fold retired one, a split or move took slots
// from one. The merge then re-drains the source's current shards.
func SourcesChanged(recorded []MergeSource, m *shardmap.Map) bool {
	now := MergeSources(m)
	return !slices.EqualFunc(recorded, now, func(a, b MergeSource) bool {
		return a.Shard == b.Shard && a.Node == b.Node && slices.Equal(a.Slots, b.Slots)
	})
}

// ErrSourceGone: a source shard's table was dropped under the merge (a fold
// retired it). Its rows are in the survivor, which the re-drain reads.
var ErrSourceGone = errors.New("source shard is gone")

// MapReader reads a tree's current map (shardmap.Store does).
type MapReader interface {
	Map(ctx context.Context, tenant, tree string) (*shardmap.Map, error)
}

// MergeCopy upserts the rows of source shards into a target tree on the
// real cluster (docs/DESIGN.md section 5.6).
type MergeCopy struct {
	Cluster *pgshard.Cluster
	Maps    MapReader
	Log     *slog.Logger
	// Patience bounds how long rows wait for a target shard whose
	// ownership record does not yet hold their slot (a migration of the
	// target between its flip and its release); 2 min when zero.
	Patience time.Duration
}

// DrainShard upserts the rows of src into the target tree: for each target
// shard, the rows whose slot it owns go through a staging table on its node.
// It returns the rows written.
func (mc *MergeCopy) DrainShard(ctx context.Context, spec MergeSpec, src MergeSource) (int64, error) {
	patience := mc.Patience
	if patience <= 0 {
		patience = 2 * time.Minute
	}
	deadline := time.Now().Add(patience)
	pending := [][2]int{{0, spec.Target.SlotCount - 1}}
	conns := &mergeConns{cluster: mc.Cluster, tenant: spec.Target.Tenant, open: map[string]*pgx.Conn{}}
	defer conns.close()
	var total int64
	for wait := 50 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		m, err := mc.Maps.Map(ctx, spec.Target.Tenant, spec.Target.MapName())
		if err != nil {
			return total, err
		}
		crashPoint("merge_route")
		var left [][2]int
		for _, idx := range m.OwningShards() {
			slots := intersect(pending, m.SlotRanges(idx))
			if len(slots) == 0 {
				continue
			}
			n, rest, err := mc.transfer(ctx, conns, spec, src, idx, m.Shards[idx].Node, slots)
			total += n
			if errors.Is(err, ErrSourceGone) {
				return total, err
			}
			if err != nil {
				// A fence or a dropped donor of the target: the slots go
				// round again on a newer map.
				if !retryable(err) {
					return total, err
				}
				mc.Log.Info("merge: target shard refused a batch; routing again", "tree", spec.Target.Name, "shard", idx, "err", err)
				rest = slots
			}
			left = append(left, rest...)
		}
		if len(left) == 0 {
			return total, nil
		}
		pending = mergeRanges(left, nil)
		if time.Now().After(deadline) {
			return total, fmt.Errorf("migrator: merge: no shard of tree %s took slots %v within %s", spec.Target.Name, pending, patience)
		}
		select {
		case <-ctx.Done():
			return total, ctx.Err()
		case <-time.After(wait):
		}
	}
}

// retryable: the target's routing moved under the batch; a newer map
// places it.
func retryable(err error) bool {
	return sqlstate.Is(err, sqlstate.SlotMoved) || sqlstate.Is(err, sqlstate.UndefinedTable) ||
		sqlstate.Is(err, sqlstate.LockNotAvailable) || sqlstate.Is(err, sqlstate.DeadlockDetected)
}

// stageTable is the temporary table a transfer stages rows in; it is
// dropped at its transaction's end, so nothing of it outlives a crash.
const stageTable = "lattice_merge_stage"

// transfer copies the rows of src whose target slot is in slots into
// target shard idx on node, in one transaction there. The write is taken
// only for the slots the shard's ownership record holds, read under a
// share lock: a migration's fence takes slots out of that record in its own
// transaction, after a lock on the table that waits for this one, so a row
// is either written before the fence (and the migration's stream carries
// it) or routed again. It returns the slots of slots whose rows it did not
// write.
func (mc *MergeCopy) transfer(ctx context.Context, conns *mergeConns, spec MergeSpec, src MergeSource, idx int, node string, slots [][2]int) (int64, [][2]int, error) {
	srcConn, err := conns.get(ctx, "source:"+src.Node, src.Node)
	if err != nil {
		return 0, nil, err
	}
	dstConn, err := conns.get(ctx, "target:"+node, node)
	if err != nil {
		return 0, nil, err
	}
	cols := columnList(spec.Source.Columns)
	target := pgshard.ShardTable(spec.Target, idx)
	out := "COPY (SELECT " + cols + " FROM " + pgshard.ShardTable(spec.Source, src.Shard) +
		" WHERE " + btreeindex.SlotPredicate(spec.Source, "", src.Slots) +
		" AND " + btreeindex.SlotPredicate(spec.Target, "", slots) + ") TO STDOUT"

	var written int64
	var left [][2]int
	err = pgx.BeginFunc(ctx, dstConn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "CREATE TEMP TABLE "+stageTable+" ON COMMIT DROP AS SELECT "+cols+" FROM "+target+" WITH NO DATA"); err != nil {
			return err
		}
		r := pgshard.PipeCopy(ctx, srcConn.PgConn(), out, tx.Conn().PgConn(), "COPY "+stageTable+" ("+cols+") FROM STDIN")
		if err := r.Err(); err != nil {
			if sqlstate.Is(r.ReadErr, sqlstate.UndefinedTable) {
				return fmt.Errorf("%w: shard %d of tree %s on %s: %v", ErrSourceGone, src.Shard, spec.Source.Name, src.Node, r.ReadErr)
			}
			return fmt.Errorf("migrator: merge: shard %d into %s: %w", src.Shard, target, err)
		}
		crashPoint("merge_copy")
		// Table lock before the record's row lock, the fence's order, so the
		// two never deadlock.
		if _, err := tx.Exec(ctx, "LOCK TABLE "+target+" IN ROW EXCLUSIVE MODE"); err != nil {
			return err
		}
		var owned string
		err = tx.QueryRow(ctx, "SELECT slots::text FROM "+pgx.Identifier{shardmap.SchemaName(idx), pgshard.OwnerTable}.Sanitize()+
			" WHERE tree = $1 FOR SHARE", spec.Target.Name).Scan(&owned)
		if errors.Is(err, pgx.ErrNoRows) {
			owned = "{}"
		} else if err != nil {
			return err
		}
		pk, err := primaryKey(ctx, tx, target)
		if err != nil {
			return err
		}
		for _, c := range pk {
			if !slices.Contains(spec.Source.Columns, c) {
				return sqlstate.New(sqlstate.DatatypeMismatch, "lattice_merge: the primary key column %s of tree %s is not a column of tree %s",
					c, spec.Target.Name, spec.Source.Name).WithHint("Merge trees with the same primary key.")
			}
		}
		slot := btreeindex.SlotExpr(spec.Target, "")
		tag, err := tx.Exec(ctx, "WITH moved AS (DELETE FROM "+stageTable+" WHERE "+slot+"::int4 <@ $1::int4multirange RETURNING "+cols+") "+
			"INSERT INTO "+target+" AS t ("+cols+") SELECT "+cols+" FROM moved "+upsertClause(spec, pk), owned)
		if err != nil {
			return err
		}
		written = tag.RowsAffected()
		rows, err := tx.Query(ctx, "SELECT DISTINCT "+slot+" FROM "+stageTable+" ORDER BY 1")
		if err != nil {
			return err
		}
		ss, err := pgx.CollectRows(rows, pgx.RowTo[int])
		if err != nil {
			return err
		}
		left = ranges(ss)
		return nil
	})
	if err != nil {
		// A connection that failed mid-copy may be in any state.
		conns.drop(ctx, "source:"+src.Node)
		conns.drop(ctx, "target:"+node)
		return 0, nil, err
	}
	return written, left, nil
}

// mergeConns are a drain's own connections, one per role and node, named
// lattice-merge in pg_stat_activity: a transfer holds a target table's
// lock through its staging, which must not starve the control pools.
type mergeConns struct {
	cluster *pgshard.Cluster
	tenant  string
	open    map[string]*pgx.Conn
}

func (c *mergeConns) get(ctx context.Context, key, node string) (*pgx.Conn, error) {
	if conn := c.open[key]; conn != nil {
		return conn, nil
	}
	dsn, err := c.cluster.TenantDSN(node, c.tenant)
	if err != nil {
		return nil, err
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("migrator: merge: node %s: %w", node, err)
	}
	cfg.RuntimeParams["application_name"] = MergeApplication
	cfg.DialFunc = pgshard.ResetOnGiveUp(cfg.DialFunc) // an upsert must not land after the merge moved on
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("migrator: merge: node %s: %w", node, err)
	}
	c.open[key] = conn
	return conn, nil
}

func (c *mergeConns) drop(ctx context.Context, key string) {
	if conn := c.open[key]; conn != nil {
		_ = conn.Close(ctx)
		delete(c.open, key)
	}
}

func (c *mergeConns) close() {
	for k := range c.open {
		c.drop(context.Background(), k)
	}
}

// MergeApplication is the application_name of a merge's connections.
const MergeApplication = "lattice-merge"

// upsertClause is the ON CONFLICT clause of spec's rule, on the target's
// primary key pk.
func upsertClause(spec MergeSpec, pk []string) string {
	conflict := "ON CONFLICT (" + columnList(pk) + ") "
	var set []string
	for _, c := range spec.Source.Columns {
		if !slices.Contains(pk, c) {
			q := pgx.Identifier{c}.Sanitize()
			set = append(set, q+" = EXCLUDED."+q)
		}
	}
	if spec.OnConflict == MergeTargetWins || len(set) == 0 {
		return conflict + "DO NOTHING"
	}
	upd := conflict + "DO UPDATE SET " + strings.Join(set, ", ")
	if spec.OnConflict == MergeSourceWins {
		return upd
	}
	// The newer row wins; a row with a timestamp beats one without, and a
	// tie keeps the target's.
	ts := pgx.Identifier{spec.OnConflict}.Sanitize()
	return upd + " WHERE EXCLUDED." + ts + " IS NOT NULL AND (t." + ts + " IS NULL OR EXCLUDED." + ts + " > t." + ts + ")"
}

// primaryKey lists the primary key columns of table, in key order.
func primaryKey(ctx context.Context, tx pgx.Tx, table string) ([]string, error) {
	rows, err := tx.Query(ctx, `SELECT a.attname FROM pg_index i
		JOIN LATERAL unnest(i.indkey) WITH ORDINALITY k(attnum, n) ON true
		JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
		WHERE i.indrelid = $1::regclass AND i.indisprimary ORDER BY k.n`, table)
	if err != nil {
		return nil, err
	}
	pk, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	if len(pk) == 0 {
		return nil, fmt.Errorf("migrator: merge: %s has no primary key", table)
	}
	return pk, nil
}

func columnList(cols []string) string {
	q := make([]string, len(cols))
	for i, c := range cols {
		q[i] = pgx.Identifier{c}.Sanitize()
	}
	return strings.Join(q, ", ")
}

// intersect is the slots in both sorted, disjoint inclusive range lists.
func intersect(a, b [][2]int) [][2]int {
	var out [][2]int
	for i, j := 0, 0; i < len(a) && j < len(b); {
		lo, hi := max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
		if lo <= hi {
			out = append(out, [2]int{lo, hi})
		}
		if a[i][1] < b[j][1] {
			i++
		} else {
			j++
		}
	}
	return out
}
