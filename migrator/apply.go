package migrator

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/shardmap"
)

// Apply batching: a batch is one pipelined round trip and one target
// transaction. It closes at a size bound or after a short delay, so a busy
// source is applied in large transactions and a quiet one promptly.
const (
	maxBatchChanges = 2000
	maxBatchBytes   = 8 << 20
	batchDelay      = 5 * time.Millisecond
	statusInterval  = time.Second
	// While someone waits for a position, the stream asks the source for a
	// keepalive this often, so an idle source still reports how far it is.
	pollInterval = 10 * time.Millisecond
)

// relation is the target-side SQL for one published source relation.
type relation struct {
	table  string // the target shard table
	cols   []string
	keyIdx []int // positions of the primary key columns in cols
	insert string
}

// change is one statement of an apply batch, with text parameters.
type change struct {
	sql  string
	args [][]byte
}

type applyBatch struct {
	changes []change
	bytes   int
	end     pglogrepl.LSN // end of the last source transaction in the batch
	due     time.Time
}

func (b *applyBatch) add(c change) {
	b.changes = append(b.changes, c)
	for _, a := range c.args {
		b.bytes += len(a)
	}
}

func (sh *Shadow) stream(ctx context.Context) {
	defer close(sh.exited)
	err := sh.applyLoop(ctx)
	if err != nil && ctx.Err() != nil {
		// Stopped: a read or write the cancel interrupted fails with what
		// the interrupt did to its connection (a give-up resets it, so
		// "use of closed network connection"), which is the stop itself.
		// The batch it was applying did not commit; a resume applies it.
		err = ctx.Err()
	}
	sh.mu.Lock()
	sh.err, sh.done = err, true
	sh.advance.Broadcast()
	sh.mu.Unlock()
	if err != nil && !errors.Is(err, context.Canceled) {
		sh.log.Error("shadow copy stream stopped", "err", err)
	}
	if errors.Is(err, errSlotUndecodable) {
		sh.dropUndecodableSlot(err)
	}
}

func (sh *Shadow) applied() pglogrepl.LSN {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.stats.Applied
}

// setApplied moves the applied position forward (never back) and wakes
// waiters.
func (sh *Shadow) setApplied(lsn pglogrepl.LSN, rows int) {
	sh.mu.Lock()
	if lsn > sh.stats.Applied {
		sh.stats.Applied = lsn
	}
	sh.stats.RowsApplied += int64(rows)
	sh.advance.Broadcast()
	sh.mu.Unlock()
}

func (sh *Shadow) applyLoop(ctx context.Context) error {
	relations := map[uint32]*relation{}
	var batch applyBatch
	inTx, skipping := false, false
	nextStatus, nextPoll := time.Now(), time.Now()
	for {
		if batch.end != 0 && (len(batch.changes) >= maxBatchChanges || batch.bytes >= maxBatchBytes || !time.Now().Before(batch.due)) {
			if err := sh.flush(ctx, &batch); err != nil {
				return err
			}
		}
		waiting := sh.waiting()
		if !time.Now().Before(nextStatus) || waiting && !time.Now().Before(nextPoll) {
			if err := sh.sendStatus(ctx, waiting); err != nil {
				return err
			}
			nextStatus, nextPoll = time.Now().Add(statusInterval), time.Now().Add(pollInterval)
		}
		deadline := nextStatus
		if waiting && nextPoll.Before(deadline) {
			deadline = nextPoll
		} else if !waiting {
			// A waiter that arrives during the receive is noticed soon.
			deadline = minTime(deadline, time.Now().Add(5*pollInterval))
		}
		if batch.end != 0 && batch.due.Before(deadline) {
			deadline = batch.due
		}
		rctx, cancel := context.WithDeadline(ctx, deadline)
		if !sh.startReceive(cancel, waiting) {
			cancel()
			continue
		}
		msg, err := sh.repl.ReceiveMessage(rctx)
		sh.startReceive(nil, true)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			// A receive that timed out, or that a new waiter ended
			// (WaitApplied), leaves the connection usable.
			if pgconn.Timeout(err) || errors.Is(err, context.Canceled) {
				continue
			}
			return fmt.Errorf("migrator: replication stream: %w", err)
		}
		var data []byte
		switch m := msg.(type) {
		case *pgproto3.CopyData:
			data = m.Data
		case *pgproto3.ErrorResponse:
			return streamError(pgconn.ErrorResponseToPgError(m))
		default:
			return fmt.Errorf("migrator: unexpected %T on the replication stream", msg)
		}
		if len(data) == 0 {
			continue
		}
		switch data[0] {
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
			if err != nil {
				return err
			}
			// Outside a transaction with nothing pending, everything the
			// source committed before its send position is applied.
			if !inTx && batch.end == 0 {
				sh.setApplied(ka.ServerWALEnd, 0)
			}
			if ka.ReplyRequested {
				nextStatus = time.Now()
			}
		case pglogrepl.XLogDataByteID:
			xld, err := pglogrepl.ParseXLogData(data[1:])
			if err != nil {
				return err
			}
			lm, err := pglogrepl.Parse(xld.WALData)
			if err != nil {
				return fmt.Errorf("migrator: decode pgoutput: %w", err)
			}
			switch m := lm.(type) {
			case *pglogrepl.RelationMessage:
				r, err := sh.relation(m)
				if err != nil {
					return err
				}
				relations[m.RelationID] = r
			case *pglogrepl.BeginMessage:
				// A transaction that ends at or before the applied position
				// was applied before a restart.
				inTx, skipping = true, m.FinalLSN < sh.applied()
			case *pglogrepl.CommitMessage:
				inTx = false
				if !skipping {
					if batch.end == 0 {
						batch.due = time.Now().Add(batchDelay)
					}
					batch.end = m.TransactionEndLSN
				}
			case *pglogrepl.InsertMessage:
				if !skipping {
					c, err := sh.insertChange(relations, m.RelationID, m.Tuple)
					if err != nil {
						return err
					}
					batch.add(c)
				}
			case *pglogrepl.UpdateMessage:
				if !skipping {
					if err := sh.updateChanges(&batch, relations, m); err != nil {
						return err
					}
				}
			case *pglogrepl.DeleteMessage:
				if !skipping {
					c, err := sh.deleteChange(relations, m.RelationID, m.OldTuple)
					if err != nil {
						return err
					}
					batch.add(c)
				}
			case *pglogrepl.TruncateMessage:
				return errors.New("migrator: the source table was truncated during the shadow copy")
			}
		}
	}
}

// flush applies a batch in one pipelined implicit transaction that also
// records the new applied position.
func (sh *Shadow) flush(ctx context.Context, b *applyBatch) error {
	pb := &pgconn.Batch{}
	for _, c := range b.changes {
		pb.ExecParams(c.sql, c.args, nil, nil, nil)
	}
	pb.ExecParams("UPDATE "+progressTable(sh.spec.Target)+" SET applied_lsn = $1::pg_lsn WHERE migration = $2",
		[][]byte{[]byte(b.end.String()), []byte(sh.spec.ID)}, nil, nil, nil)
	res, err := sh.target.PgConn().ExecBatch(ctx, pb).ReadAll()
	if err != nil {
		return fmt.Errorf("migrator: apply batch: %w", err)
	}
	if tag := res[len(res)-1].CommandTag; tag.RowsAffected() != 1 {
		return fmt.Errorf("migrator: progress row of %s is gone", sh.spec.ID)
	}
	sh.setApplied(b.end, len(b.changes))
	*b = applyBatch{changes: b.changes[:0]}
	return nil
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// startReceive records how to end the coming receive early (nil once it
// is over). It returns false when a waiter came after the loop read
// waiting: the loop goes round again to ask the source for a keepalive.
func (sh *Shadow) startReceive(end context.CancelFunc, waiting bool) bool {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if end != nil && sh.waiters > 0 && !waiting {
		return false
	}
	sh.endReceive = end
	return true
}

func (sh *Shadow) waiting() bool {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.waiters > 0
}

func (sh *Shadow) sendStatus(ctx context.Context, reply bool) error {
	lsn := sh.applied()
	err := pglogrepl.SendStandbyStatusUpdate(ctx, sh.repl, pglogrepl.StandbyStatusUpdate{WALWritePosition: lsn, ReplyRequested: reply})
	if err != nil {
		return fmt.Errorf("migrator: standby status: %w", err)
	}
	return nil
}

// relation maps a published source table to its target table: the table
// of the same name (the tree's) in the target's schema.
func (sh *Shadow) relation(m *pglogrepl.RelationMessage) (*relation, error) {
	st := sh.tables[m.RelationName]
	if st == nil || m.Namespace != shardmap.SchemaName(sh.spec.Source) {
		return nil, fmt.Errorf("migrator: the stream carries %s.%s, which the shadow copy %s does not move", m.Namespace, m.RelationName, sh.spec.ID)
	}
	r := &relation{table: pgshard.ShardTable(st.tree, sh.spec.Target)}
	isKey := map[string]bool{}
	for _, k := range st.pkey {
		isKey[k] = true
	}
	var sets []string
	for i, c := range m.Columns {
		r.cols = append(r.cols, c.Name)
		q := pgx.Identifier{c.Name}.Sanitize()
		if isKey[c.Name] {
			r.keyIdx = append(r.keyIdx, i)
		} else {
			sets = append(sets, q+" = EXCLUDED."+q)
		}
	}
	conflict := " DO NOTHING"
	if len(sets) > 0 {
		conflict = " DO UPDATE SET " + strings.Join(sets, ", ")
	}
	r.insert = "INSERT INTO " + r.table + " (" + quoteAll(r.cols) + ") VALUES (" +
		placeholders(1, len(r.cols)) + ") ON CONFLICT (" + quoteAll(st.pkey) + ")" + conflict
	return r, nil
}

func placeholders(from, n int) string {
	p := make([]string, n)
	for i := range p {
		p[i] = "$" + strconv.Itoa(from+i)
	}
	return strings.Join(p, ", ")
}

func lookup(relations map[uint32]*relation, id uint32) (*relation, error) {
	r, ok := relations[id]
	if !ok {
		return nil, fmt.Errorf("migrator: change for relation %d before its description", id)
	}
	return r, nil
}

func value(c *pglogrepl.TupleDataColumn) []byte {
	if c.DataType == pglogrepl.TupleDataTypeNull {
		return nil
	}
	return c.Data
}

// An insert is an upsert on the primary key, so applying a change the target
// already holds is harmless.
func (sh *Shadow) insertChange(relations map[uint32]*relation, id uint32, t *pglogrepl.TupleData) (change, error) {
	r, err := lookup(relations, id)
	if err != nil {
		return change{}, err
	}
	if t == nil || len(t.Columns) != len(r.cols) {
		return change{}, errors.New("migrator: insert without a full tuple")
	}
	args := make([][]byte, len(r.cols))
	for i, c := range t.Columns {
		if c.DataType == pglogrepl.TupleDataTypeToast {
			return change{}, errors.New("migrator: insert with an unchanged TOAST value")
		}
		args[i] = value(c)
	}
	return change{sql: r.insert, args: args}, nil
}

// keyCondition is "k1 = $n AND k2 = $n+1" with the key values of tuple.
func keyCondition(r *relation, t *pglogrepl.TupleData, next int) (string, [][]byte, error) {
	if t == nil || len(t.Columns) != len(r.cols) {
		return "", nil, errors.New("migrator: change without its key")
	}
	conds := make([]string, len(r.keyIdx))
	args := make([][]byte, len(r.keyIdx))
	for i, k := range r.keyIdx {
		c := t.Columns[k]
		if c.DataType != pglogrepl.TupleDataTypeText {
			return "", nil, fmt.Errorf("migrator: key column %s missing from a change", r.cols[k])
		}
		conds[i] = pgx.Identifier{r.cols[k]}.Sanitize() + " = $" + strconv.Itoa(next+i)
		args[i] = c.Data
	}
	return strings.Join(conds, " AND "), args, nil
}

// An update sets the columns it carries (an unchanged TOAST value is not
// sent) on the row found by its old key, or its new key when the key did
// not change.
func (sh *Shadow) updateChanges(b *applyBatch, relations map[uint32]*relation, m *pglogrepl.UpdateMessage) error {
	r, err := lookup(relations, m.RelationID)
	if err != nil {
		return err
	}
	if m.NewTuple == nil || len(m.NewTuple.Columns) != len(r.cols) {
		return errors.New("migrator: update without its new tuple")
	}
	var sets []string
	var args [][]byte
	for i, c := range m.NewTuple.Columns {
		if c.DataType == pglogrepl.TupleDataTypeToast {
			continue
		}
		args = append(args, value(c))
		sets = append(sets, pgx.Identifier{r.cols[i]}.Sanitize()+" = $"+strconv.Itoa(len(args)))
	}
	old := m.NewTuple
	if m.OldTuple != nil {
		old = m.OldTuple
	}
	cond, keyArgs, err := keyCondition(r, old, len(args)+1)
	if err != nil {
		return err
	}
	b.add(change{
		sql:  "UPDATE " + r.table + " SET " + strings.Join(sets, ", ") + " WHERE " + cond,
		args: append(args, keyArgs...),
	})
	return nil
}

func (sh *Shadow) deleteChange(relations map[uint32]*relation, id uint32, old *pglogrepl.TupleData) (change, error) {
	r, err := lookup(relations, id)
	if err != nil {
		return change{}, err
	}
	cond, args, err := keyCondition(r, old, 1)
	if err != nil {
		return change{}, err
	}
	return change{sql: "DELETE FROM " + r.table + " WHERE " + cond, args: args}, nil
}
