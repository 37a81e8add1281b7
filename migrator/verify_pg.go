package migrator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lattice-db/lattice/btreeindex"
	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/shardmap"
)

// rowTextSettings make a row's text the same on every node, whatever the
// server's defaults: the checksum hashes it, and the write log keeps it
// (writelog_pg.go).
var rowTextSettings = [][2]string{{"TimeZone", "'UTC'"}, {"DateStyle", "'ISO, YMD'"}, {"IntervalStyle", "'postgres'"},
	{"extra_float_digits", "3"}, {"bytea_output", "'hex'"}}

// settingsSQL is rowTextSettings as statements (SET LOCAL) or as the SET
// clauses of a function.
func settingsSQL(function bool) string {
	parts := make([]string, len(rowTextSettings))
	for i, kv := range rowTextSettings {
		if function {
			parts[i] = "SET " + kv[0] + " = " + kv[1]
		} else {
			parts[i] = "SET LOCAL " + kv[0] + " = " + kv[1]
		}
	}
	if function {
		return strings.Join(parts, " ")
	}
	return strings.Join(parts, "; ")
}

// maxDiffRows bounds the differing rows a verification keeps for a repair,
// and maxDiffSlots the slots it looks for them in.
const (
	maxDiffRows  = 1000
	maxDiffSlots = 64
)

// pgSnapshots are the exported snapshots of one move: a REPEATABLE READ
// transaction on each side, held open from the freeze until the comparison
// has imported them on connections of its own.
type pgSnapshots struct {
	nodes    clusterNodes
	t        *shardmap.Tree   // the first of trees, for the tenant
	trees    []*shardmap.Tree // every table of the move (a colocation group's members)
	mig      *shardmap.Migration
	timeout  time.Duration
	src, tgt borrowed // the exporting transactions
	srcID    string
	tgtID    string
	// The comparison's transactions, which import the snapshots.
	isrc, itgt borrowed
}

func (c clusterNodes) connectTenant(ctx context.Context, node, tenant string) (*pgx.Conn, error) {
	dsn, err := c.TenantDSN(node, tenant)
	if err != nil {
		return nil, err
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("migrator: verification: node %s: %w", node, err)
	}
	cfg.DialFunc = pgshard.ResetOnGiveUp(cfg.DialFunc) // a repair must not land late
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("migrator: verification: connect to %s: %w", node, err)
	}
	return conn, nil
}

func (c clusterNodes) OpenSnapshots(ctx context.Context, ts []*shardmap.Tree, mig *shardmap.Migration, timeout time.Duration) (Snapshots, error) {
	t := ts[0]
	s := &pgSnapshots{nodes: c, t: t, trees: ts, mig: mig, timeout: timeout}
	var err error
	if s.src, err = c.borrow(ctx, mig.SourceNode, t.Tenant); err != nil {
		return nil, err
	}
	if s.tgt, err = c.borrow(ctx, mig.TargetNode, t.Tenant); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// TakeTarget implements Snapshots: one round trip, which ends the
// target's earlier exporting transaction, if any.
func (s *pgSnapshots) TakeTarget(ctx context.Context) error {
	again := s.tgtID != ""
	s.tgtID = ""
	return export(ctx, s.tgt.Conn, again, &s.tgtID)
}

// TakeSource implements Snapshots.
func (s *pgSnapshots) TakeSource(ctx context.Context) error {
	return export(ctx, s.src.Conn, false, &s.srcID)
}

// export opens a REPEATABLE READ transaction on c and exports its
// snapshot into *id, in one round trip; again ends the one open first.
func export(ctx context.Context, c *pgx.Conn, again bool, id *string) error {
	sql := "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SELECT pg_export_snapshot()"
	if again {
		sql = "ROLLBACK; " + sql
	}
	rs, err := c.PgConn().Exec(ctx, sql).ReadAll()
	if err != nil {
		return fmt.Errorf("migrator: export snapshot: %w", err)
	}
	if last := rs[len(rs)-1]; len(last.Rows) == 1 {
		*id = string(last.Rows[0][0])
		return nil
	}
	return errors.New("migrator: export snapshot: no snapshot name")
}

// both runs f and g at once and returns the first error.
func both(f, g func() error) error {
	done := make(chan error, 1)
	go func() { done <- g() }()
	err := f()
	if gerr := <-done; err == nil {
		err = gerr
	}
	return err
}

func (s *pgSnapshots) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, b := range []*borrowed{&s.src, &s.tgt, &s.isrc, &s.itgt} {
		b.giveBack(ctx)
	}
}

// side is one end of a comparison: a connection in a transaction that
// sees the rows to compare, and the shard table.
type side struct {
	conn  *pgx.Conn
	table string
	// from, if set, is what the comparison reads instead of the table: a
	// subquery of the table's columns (the target's rows as of the flip,
	// rebuilt from its write log; writelog_pg.go).
	from string
}

// rows is what the comparison's statements read from.
func (sd side) rows() string {
	if sd.from != "" {
		return sd.from
	}
	return sd.table
}

// beginCompare opens the comparison's transaction on c, under snapshot if
// one is given. Its scans run without parallel workers: the two sides scan
// at once already, and on a small machine the workers only contend with
// them (docs/DESIGN.md 5.5).
func beginCompare(ctx context.Context, c *pgx.Conn, snapshot string, timeout time.Duration) error {
	sql := "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
	if snapshot != "" {
		sql += "; SET TRANSACTION SNAPSHOT " + quoteLiteral(snapshot)
	}
	sql += "; " + settingsSQL(false) + fmt.Sprintf("; SET LOCAL statement_timeout = %d", timeout.Milliseconds()) + "; " + serialScans
	_, err := c.PgConn().Exec(ctx, sql).ReadAll()
	return err
}

// Compare imports the snapshots on new connections, lets the exporting
// transactions go, and compares the moving slots.
func (s *pgSnapshots) Compare(ctx context.Context) (*shardmap.Verification, error) {
	if s.srcID == "" || s.tgtID == "" {
		return nil, errors.New("migrator: a snapshot of the freeze is missing (its export failed)")
	}
	var err error
	if s.isrc, err = s.nodes.borrow(ctx, s.mig.SourceNode, s.t.Tenant); err != nil {
		return nil, err
	}
	if s.itgt, err = s.nodes.borrow(ctx, s.mig.TargetNode, s.t.Tenant); err != nil {
		return nil, err
	}
	src, tgt := s.isrc.Conn, s.itgt.Conn
	if err := beginCompare(ctx, src, s.srcID, s.timeout); err != nil {
		return nil, fmt.Errorf("migrator: import source snapshot: %w", err)
	}
	if err := beginCompare(ctx, tgt, s.tgtID, s.timeout); err != nil {
		return nil, fmt.Errorf("migrator: import target snapshot: %w", err)
	}
	// The imports hold the snapshots now.
	s.src.giveBack(ctx)
	s.tgt.giveBack(ctx)
	// One snapshot a side covers every table of the move. The target's may
	// have been exported after the flip (flipsnap.go): its rows as of the
	// flip are read through the write log, under the same snapshot.
	return compareAsOfFlip(ctx, src, tgt, s.trees, s.mig)
}

// addVerification adds b, one table's comparison, to a, the tables'
// before it (nil for none): a slot differs when it differs in any table.
func addVerification(a, b *shardmap.Verification) *shardmap.Verification {
	if a == nil {
		return b
	}
	a.Rows += b.Rows
	a.BytesScanned += b.BytesScanned
	a.Seconds += b.Seconds
	for _, d := range b.Differ {
		if i := slices.IndexFunc(a.Differ, func(x shardmap.SlotDiff) bool { return x.Slot == d.Slot }); i >= 0 {
			a.Differ[i].SourceRows += d.SourceRows
			a.Differ[i].TargetRows += d.TargetRows
		} else {
			a.Differ = append(a.Differ, d)
		}
	}
	slices.SortFunc(a.Differ, func(x, y shardmap.SlotDiff) int { return x.Slot - y.Slot })
	a.DiffRows = append(a.DiffRows, b.DiffRows...)
	if len(a.DiffRows) > maxDiffRows {
		a.DiffRows, a.DiffRowsCut = a.DiffRows[:maxDiffRows], true
	}
	a.DiffRowsCut = a.DiffRowsCut || b.DiffRowsCut
	return a
}

// rowTree is what a RowDiff of t's table names (RowDiff.Tree).
func rowTree(t *shardmap.Tree) string {
	if t.Group == "" {
		return ""
	}
	return t.Name
}

// WrittenSince implements Comparison: the logged keys of slots.
func (s *pgSnapshots) WrittenSince(ctx context.Context, slots []int) ([]shardmap.RowDiff, error) {
	return s.nodes.loggedKeys(ctx, s.trees, s.mig, slots)
}

// DiffNow lists the keys of slots whose rows differ on source and target
// as they are now, leaving out the keys in ignore; each side is read in a
// transaction of its own.
func (c clusterNodes) DiffNow(ctx context.Context, t *shardmap.Tree, mig *shardmap.Migration, slots []int, ignore []shardmap.RowDiff, timeout time.Duration) ([]shardmap.RowDiff, error) {
	src, err := c.connectTenant(ctx, mig.SourceNode, t.Tenant)
	if err != nil {
		return nil, err
	}
	defer src.Close(context.Background())
	tgt, err := c.connectTenant(ctx, mig.TargetNode, t.Tenant)
	if err != nil {
		return nil, err
	}
	defer tgt.Close(context.Background())
	for _, conn := range []*pgx.Conn{src, tgt} {
		if err := beginCompare(ctx, conn, "", timeout); err != nil {
			return nil, err
		}
	}
	return diffSides(ctx, t, side{conn: src, table: pgshard.ShardTable(t, mig.Source)}, side{conn: tgt, table: pgshard.ShardTable(t, mig.Target)}, slots, ignore)
}

// diffSides lists the differing keys of each slot, leaving out ignore.
func diffSides(ctx context.Context, t *shardmap.Tree, a, b side, slots []int, ignore []shardmap.RowDiff) ([]shardmap.RowDiff, error) {
	skip := map[shardmap.RowDiff]bool{}
	for _, d := range ignore {
		if d.Tree == rowTree(t) {
			skip[shardmap.RowDiff{Slot: d.Slot, Key: d.Key}] = true
		}
	}
	var out []shardmap.RowDiff
	for _, slot := range slots {
		rows, _, err := diffRows(ctx, t, a, b, slot, maxDiffRows+len(ignore))
		if err != nil {
			return nil, err
		}
		for _, d := range rows {
			if !skip[shardmap.RowDiff{Slot: d.Slot, Key: d.Key}] {
				out = append(out, shardmap.RowDiff{Slot: d.Slot, Key: d.Key, Tree: rowTree(t)})
			}
		}
	}
	return out, nil
}

// slotSum is a row count and sum of row hashes on one side: of one slot,
// or of all the moving slots.
type slotSum struct {
	rows int64
	sum  string // numeric, as text: a sum of int8 hashes does not fit in one
}

// totalSQL counts the rows of the slots and sums their hashes (rowHashSQL,
// rowhash_pg.go): order-independent, and unlike XOR a pair of equal rows
// does not cancel, while the count catches a row lost and another doubled.
func totalSQL(t *shardmap.Tree, from, hash string, slots [][2]int) string {
	return fmt.Sprintf("SELECT count(*), coalesce(sum(%s), 0)::text FROM %s x WHERE %s", hash, from, btreeindex.SlotPredicate(t, "x", slots))
}

// slotSumsSQL is totalSQL per slot of chunk.
func slotSumsSQL(t *shardmap.Tree, from, hash string, chunk [2]int) string {
	return fmt.Sprintf("SELECT %s AS slot, count(*), sum(%s)::text FROM %s x WHERE %s GROUP BY 1",
		btreeindex.SlotExpr(t, "x"), hash, from, btreeindex.SlotPredicate(t, "x", [][2]int{chunk}))
}

func readTotal(ctx context.Context, sd side, t *shardmap.Tree, hash string, slots [][2]int) (slotSum, error) {
	var s slotSum
	err := sd.conn.QueryRow(ctx, totalSQL(t, sd.rows(), hash, slots)).Scan(&s.rows, &s.sum)
	return s, err
}

func readSums(ctx context.Context, sd side, t *shardmap.Tree, hash string, chunk [2]int) (map[int]slotSum, error) {
	rows, err := sd.conn.Query(ctx, slotSumsSQL(t, sd.rows(), hash, chunk))
	if err != nil {
		return nil, err
	}
	out := map[int]slotSum{}
	for rows.Next() {
		var slot int
		var s slotSum
		if err := rows.Scan(&slot, &s.rows, &s.sum); err != nil {
			return nil, err
		}
		out[slot] = s
	}
	return out, rows.Err()
}

// compareSlots compares the moving slots in one statement a side (the two
// sides in parallel), each scanning its table once under the statement
// timeout: the rows and the sum of their hashes over all the slots. Only
// when those differ does it sum each range slot by slot (a scan a range and
// side) to name the differing slots, and then find their differing rows.
func compareSlots(ctx context.Context, t *shardmap.Tree, mig *shardmap.Migration, src, tgt side, slots [][2]int) (*shardmap.Verification, error) {
	start := time.Now()
	v := &shardmap.Verification{At: start.UTC()}
	var size int64
	for _, sd := range []side{src, tgt} {
		var n int64
		if err := sd.conn.QueryRow(ctx, "SELECT pg_table_size($1::regclass)", sd.table).Scan(&n); err != nil {
			return nil, err
		}
		size += n
	}
	v.BytesScanned = size
	hash, err := rowHashSQL(ctx, src.conn, src.table)
	if err != nil {
		return nil, err
	}
	var a, b slotSum
	err = both(func() (err error) { a, err = readTotal(ctx, src, t, hash, slots); return },
		func() (err error) { b, err = readTotal(ctx, tgt, t, hash, slots); return })
	if err != nil {
		return nil, fmt.Errorf("migrator: verify the slots of migration %s: %w", mig.ID, err)
	}
	v.Rows = a.rows
	if a != b {
		if err := findSlots(ctx, t, mig, src, tgt, hash, slots, v); err != nil {
			return nil, err
		}
		v.BytesScanned += size * int64(len(slots))
	}
	for i, d := range v.Differ {
		// Each differing slot costs a scan of both tables.
		if len(v.DiffRows) >= maxDiffRows || i >= maxDiffSlots {
			v.DiffRowsCut = true
			break
		}
		rows, cut, err := diffRows(ctx, t, src, tgt, d.Slot, maxDiffRows-len(v.DiffRows))
		if err != nil {
			return nil, err
		}
		v.DiffRows = append(v.DiffRows, rows...)
		v.DiffRowsCut = v.DiffRowsCut || cut
	}
	v.Seconds = time.Since(start).Seconds()
	return v, nil
}

// findSlots sets v.Differ to the slots whose sums differ, for moving slots
// whose totals differ.
func findSlots(ctx context.Context, t *shardmap.Tree, mig *shardmap.Migration, src, tgt side, hash string, slots [][2]int, v *shardmap.Verification) error {
	for _, ch := range slots {
		var a, b map[int]slotSum
		err := both(func() (err error) { a, err = readSums(ctx, src, t, hash, ch); return },
			func() (err error) { b, err = readSums(ctx, tgt, t, hash, ch); return })
		if err != nil {
			return fmt.Errorf("migrator: verify slots %d-%d of migration %s: %w", ch[0], ch[1], mig.ID, err)
		}
		for s := ch[0]; s <= ch[1]; s++ {
			if a[s] != b[s] {
				v.Differ = append(v.Differ, shardmap.SlotDiff{Slot: s, SourceRows: a[s].rows, TargetRows: b[s].rows})
			}
		}
	}
	if len(v.Differ) == 0 {
		// The slots' sums add up to the totals read under the same
		// snapshots: this cannot pass as a match.
		return fmt.Errorf("migrator: migration %s: the totals of its slots differ but no slot does", mig.ID)
	}
	return nil
}

// keyExpr is the row literal of the primary key columns of alias x.
func keyExpr(ctx context.Context, c *pgx.Conn, table string) (string, error) {
	_, pkey, err := tableColumns(ctx, c, table)
	if err != nil {
		return "", err
	}
	return recordKey("x", pkey), nil
}

// rowHashes reads key -> row hash of one slot.
func rowHashes(ctx context.Context, sd side, t *shardmap.Tree, key string, slot int) (map[string]string, error) {
	rows, err := sd.conn.Query(ctx, fmt.Sprintf("SELECT %s, "+textRowHash+"::text FROM %s x WHERE %s",
		key, sd.rows(), btreeindex.SlotPredicate(t, "x", [][2]int{{slot, slot}})))
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for rows.Next() {
		var k, h string
		if err := rows.Scan(&k, &h); err != nil {
			return nil, err
		}
		out[k] = h
	}
	return out, rows.Err()
}

// diffRows lists at most limit keys of slot whose rows differ.
func diffRows(ctx context.Context, t *shardmap.Tree, src, tgt side, slot, limit int) ([]shardmap.RowDiff, bool, error) {
	key, err := keyExpr(ctx, src.conn, src.table)
	if err != nil {
		return nil, false, err
	}
	a, err := rowHashes(ctx, src, t, key, slot)
	if err != nil {
		return nil, false, err
	}
	b, err := rowHashes(ctx, tgt, t, key, slot)
	if err != nil {
		return nil, false, err
	}
	var out []shardmap.RowDiff
	add := func(k string) bool {
		if len(out) >= limit {
			return false
		}
		out = append(out, shardmap.RowDiff{Slot: slot, Key: k, Tree: rowTree(t)})
		return true
	}
	for k, sa := range a {
		if sb, ok := b[k]; !ok || sb != sa {
			if !add(k) {
				return out, true, nil
			}
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			if !add(k) {
				return out, true, nil
			}
		}
	}
	return out, false, nil
}

// RepairRows makes the target's row of each key in diffs the source's
// (deleting it where the source has none), in one target transaction.
func (c clusterNodes) RepairRows(ctx context.Context, t *shardmap.Tree, mig *shardmap.Migration, diffs []shardmap.RowDiff) error {
	src, err := c.connectTenant(ctx, mig.SourceNode, t.Tenant)
	if err != nil {
		return err
	}
	defer src.Close(context.Background())
	tgt, err := c.connectTenant(ctx, mig.TargetNode, t.Tenant)
	if err != nil {
		return err
	}
	defer tgt.Close(context.Background())
	srcTable, tgtTable := pgshard.ShardTable(t, mig.Source), pgshard.ShardTable(t, mig.Target)
	cols, _, err := tableColumns(ctx, src, srcTable)
	if err != nil {
		return err
	}
	key, err := keyExpr(ctx, src, srcTable)
	if err != nil {
		return err
	}
	tx, err := tgt.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, "SET LOCAL "+pgshard.MigratorSetting+" = 'on'"); err != nil {
		return err
	}
	for _, d := range diffs {
		pred := btreeindex.SlotPredicate(t, "x", [][2]int{{d.Slot, d.Slot}})
		if _, err := tx.Exec(ctx, fmt.Sprintf("DELETE FROM %s x WHERE %s AND %s = $1", tgtTable, pred, key), d.Key); err != nil {
			return err
		}
		// The source's row, if it has one, as the text of its row type:
		// source and target tables have the template's definition.
		var row *string
		err := src.QueryRow(ctx, fmt.Sprintf("SELECT x.*::text FROM %s x WHERE %s AND %s = $1", srcTable, pred, key), d.Key).Scan(&row)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		if row != nil {
			if _, err := tx.Exec(ctx, fmt.Sprintf("INSERT INTO %s (%s) SELECT (r).* FROM (SELECT $1::%s AS r) s",
				tgtTable, quoteAll(cols), tgtTable), *row); err != nil {
				return err
			}
		}
	}
	return tx.Commit(ctx)
}

// formatSlots lists slots for a message: "17, 300".
func formatSlots(d []shardmap.SlotDiff) string {
	parts := make([]string, len(d))
	for i, x := range d {
		parts[i] = strconv.Itoa(x.Slot)
	}
	return strings.Join(parts, ", ")
}

// serialScans keeps a comparison's scans to its own backend: its two sides
// already scan at once, and a Gather's workers beside them hand every row
// to the leader through a queue, CPU the sides need on a small machine.
const serialScans = "SET LOCAL max_parallel_workers_per_gather = 0"
