// Package router turns SQL text into routing plans.
//
// Each statement is parsed once with pg_query_go (PostgreSQL's own parser),
// and the plan is cached by statement text. A plan says where a statement
// runs: on the catalog node unchanged, on the one shard that owns a key, on
// the shards of a multi-row INSERT's rows, or in the proxy itself (lattice_*
// functions, transaction control, session settings). Relation names are
// rewritten to the shard schema by splicing at the parser's token locations,
// never by searching the text.
//
// What cannot be routed correctly is refused with SQLSTATE 0A000 and a
// message that says what to do instead: the router never produces a plan
// that would run a statement on the wrong shard.
//
// Plans are cached by exact text and, for single statements, by shape: a
// statement that differs from a planned one only in literal constants is
// scanned (not parsed) and its plan derived from the shape's template
// (shape.go says why that plan is the one a parse would give).
package router

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/lattice-db/lattice/btreeindex"
	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// Trees looks up the distributed tables of one tenant. Names are passed
// unqualified and case-folded the way PostgreSQL folds identifiers
// (catalogue, MixedCase for "MixedCase").
type Trees interface {
	Tree(name string) (*shardmap.Tree, bool)
}

// Kind is where a statement goes.
type Kind int

const (
	// Catalog statements touch no tree; they run unchanged on the catalog node.
	Catalog Kind = iota
	// Single statements touch one tree and fix its shard key: they run on
	// the shard that owns Plan.Key, rendered with Plan.Render.
	Single
	// InsertSplit is a multi-row INSERT ... VALUES into a tree: Plan.Rows
	// holds each row's key; Plan.RenderRows builds one INSERT per shard.
	InsertSplit
	// Function is a call of a lattice_* function, answered by the proxy
	// (Plan.Func), or a SELECT composed around such calls (Plan.Compose).
	Function
	// Transaction is transaction control (BEGIN, COMMIT, SAVEPOINT ...).
	Transaction
	// SessionSet is SET / RESET / SET SESSION: session state the proxy
	// tracks and replays on the backends it uses.
	SessionSet
	// LocalSet is SET LOCAL, SET TRANSACTION and SET CONSTRAINTS: it applies
	// to the current transaction and goes to whatever backend(s) the
	// transaction uses.
	LocalSet
	// Discard is DISCARD ALL: the proxy drops the session state it tracks.
	Discard
	// Refused statements cannot be routed correctly; Plan.Err says why and
	// what to do instead.
	Refused
	// FanOut is a plain SELECT of one tree that does not fix the shard key:
	// the proxy sends one query per node (Plan.RenderFanOut, that node's
	// shards glued with UNION ALL), merges the streams by Plan.Sort, drops
	// the Plan.Hidden trailing columns, and applies Plan.Offset and
	// Plan.Limit after the merge.
	FanOut
	// WriteAll is an UPDATE or DELETE that does not fix the shard key
	// (of one tree, or joining or correlating colocated trees), or an
	// INSERT ... SELECT whose rows' keys are those of the trees it reads on
	// each shard (multiwrite.go): it runs on every shard (Plan.Render per
	// shard schema), all of them in one transaction, and the proxy adds up
	// the command tags.
	WriteAll
	// DDL changes a tree (Plan.Tree, Plan.DDL): the proxy runs it on the
	// template and on every shard (Plan.RenderDDL) and records it in the
	// tree's DDL log. DROP INDEX plans have no Tree: the proxy finds the
	// index's table first.
	DDL
	// Copy is COPY of a tree FROM STDIN or TO STDOUT; Plan.Copy says how.
	Copy
	// RefWrite writes or changes reference tables (Plan.References, the
	// written one first) and names no tree: the statement runs unchanged on
	// every node that holds their copies, in one transaction across nodes
	// (reference.go).
	RefWrite
	// Explain is EXPLAIN of a statement over several shards (a FanOut or
	// a WriteAll; Plan.Explain): the proxy sends Lattice's plan of it,
	// then the first node's EXPLAIN of its part (explain.go).
	Explain
	// Cursor is DECLARE of a cursor over trees (Plan.Cursor): the proxy
	// runs its query and holds the rows for FETCH and MOVE (cursor.go).
	Cursor
)

var kindNames = [...]string{"Catalog", "Single", "InsertSplit", "Function", "Transaction", "SessionSet", "LocalSet", "Discard", "Refused", "FanOut", "WriteAll", "DDL", "Copy", "RefWrite", "Explain", "Cursor"}

func (k Kind) String() string {
	if k >= 0 && int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// TxKind is the kind of a transaction-control statement.
type TxKind int

const (
	Begin      TxKind = iota // BEGIN, START TRANSACTION
	Commit                   // COMMIT, END
	Rollback                 // ROLLBACK, ABORT
	Savepoint                // SAVEPOINT x
	Release                  // RELEASE [SAVEPOINT] x
	RollbackTo               // ROLLBACK TO [SAVEPOINT] x
	PrepareTx                // PREPARE TRANSACTION, COMMIT PREPARED, ROLLBACK PREPARED (always Refused)
)

var txNames = [...]string{"Begin", "Commit", "Rollback", "Savepoint", "Release", "RollbackTo", "PrepareTx"}

func (t TxKind) String() string {
	if t >= 0 && int(t) < len(txNames) {
		return txNames[t]
	}
	return "TxKind(" + strconv.Itoa(int(t)) + ")"
}

// Value is a shard key value or a function argument: either a parameter
// of the extended protocol ($n) or a literal.
type Value struct {
	Param int    // 1-based $n; 0 for a literal
	Text  string // literal in PostgreSQL text form (key literals are normalized: canonical integer, canonical uuid)
	Null  bool   // literal NULL
}

// String is $n, NULL or the literal quoted as a SQL string.
func (v Value) String() string {
	switch {
	case v.Param > 0:
		return "$" + strconv.Itoa(v.Param)
	case v.Null:
		return "NULL"
	}
	return quoteLiteral(v.Text)
}

// FuncCall is a call of a lattice_* function.
type FuncCall struct {
	Name  string           // e.g. "lattice_reshard"
	Args  []Value          // positional arguments in order
	Named map[string]Value // named arguments (shard_count => 64); nil when there are none
	Star  bool             // SELECT * FROM f(...) rather than SELECT f(...)
}

// String renders the call as SQL-like text with quoted literals.
func (f *FuncCall) String() string {
	var b strings.Builder
	if f.Star {
		b.WriteString("* FROM ")
	}
	b.WriteString(f.Name)
	b.WriteByte('(')
	for i, a := range f.Args {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(a.String())
	}
	names := make([]string, 0, len(f.Named))
	for n := range f.Named {
		names = append(names, n)
	}
	sort.Strings(names)
	for i, n := range names {
		if i > 0 || len(f.Args) > 0 {
			b.WriteString(", ")
		}
		b.WriteString(n)
		b.WriteString(" => ")
		b.WriteString(f.Named[n].String())
	}
	b.WriteByte(')')
	return b.String()
}

// Plan is the routing of one statement. Plans are shared between sessions
// through the cache: treat every field as read-only.
type Plan struct {
	Kind    Kind
	SQL     string         // this statement's text (trimmed, without the trailing semicolon)
	Tree    *shardmap.Tree // Single, InsertSplit, FanOut, WriteAll
	Key     Value          // Single: the shard key value
	KeyAlso []Value        // Single over several levels pinned to different values ($1 and $2): each must fall in Key's slot
	Rows    []Value        // InsertSplit: key value of each VALUES row in order
	// InOrder marks an InsertSplit whose RETURNING gives one row for each
	// VALUES row (no ON CONFLICT, or DO UPDATE without WHERE): the proxy
	// returns them in VALUES order, as PostgreSQL does, rather than shard
	// by shard. Clients pair them with the rows they sent (Django's
	// bulk_create sets its objects' database defaults from them).
	InOrder   bool
	Func      *FuncCall            // Function: SELECT f(...) or SELECT * FROM f(...), answered by the proxy alone
	Compose   *ComposePlan         // Function: instead of Func, a SELECT composed around lattice calls, run on the catalog node over their rows
	Tx        TxKind               // Transaction (and PrepareTx for a refused PREPARE TRANSACTION family statement)
	TxOptions string               // BEGIN / START TRANSACTION options, e.g. "ISOLATION LEVEL SERIALIZABLE READ ONLY"
	Savepoint string               // Savepoint, Release, RollbackTo: the savepoint name (case-folded)
	Chain     bool                 // Commit, Rollback: AND CHAIN, a new transaction like the one ended starts at once
	Err       *sqlstate.Error      // Refused
	Anywhere  bool                 // Catalog: a read naming no relation, which any node can answer
	Notify    bool                 // Catalog: sends a notification (NOTIFY, pg_notify)
	Pin       Pin                  // Catalog: session state the statement leaves on its backend (pin.go)
	Unpin     Pin                  // Catalog: session state the statement ends
	SetPath   string               // Catalog: SELECT set_config('search_path', ...) the session records as a SET (setpath.go); the statement that replays it
	Hides     Hides                // may leave session state the router cannot see, inside a function, DO or CALL (untracked.go)
	Reparse   bool                 // Catalog: FETCH or EXECUTE, whose result columns are a cursor's or a SQL-level statement's when parsed: a backend statement of it is parsed for each use, never kept (reparse.go)
	Prepare   string               // Catalog: the statement SQL PREPARE creates, in the namespace it shares with protocol statements
	Dealloc   string               // Catalog: the statement DEALLOCATE name drops ("" for DEALLOCATE ALL, whose Unpin has PinPrepare)
	Tag       string               // command tag for statements the proxy answers itself ("BEGIN", "SET", "SELECT" for Function: append the row count)
	Sort      []btreeindex.SortKey // FanOut: ORDER BY keys, in order
	Hidden    int                  // FanOut: trailing result columns the proxy added for sort keys; the proxy drops them before rows reach the client
	Limit     *Value               // FanOut: LIMIT / FETCH FIRST count; nil when absent (or LIMIT ALL / NULL)
	Offset    *Value               // FanOut: OFFSET; nil when absent
	Calls     []string             // FanOut (and Copy of a fan-out query): the functions the statement calls, for the proxy's user-defined aggregate check
	DDL       *DDLPlan             // DDL
	Keys      []Value              // FanOut: when non-nil, only the shards owning these key values (key IN (...), = ANY(ARRAY[...])) hold matching rows
	KeyArray  *Value               // FanOut: when non-nil, only the shards owning the elements of this array value (= ANY($1), = ANY('{...}')) hold matching rows
	Agg       *AggPlan             // FanOut that aggregates, groups or removes duplicates: partial query per node, final query over the partial rows (Sort, Hidden, Limit and Offset are then unused: the final query applies them)
	Copy      *CopySpec            // Copy; RefWrite: a COPY FROM STDIN into a reference table
	Explain   *ExplainPlan         // Explain
	Cursor    *CursorPlan          // Cursor; Catalog: a cursor statement (DECLARE, FETCH, MOVE, CLOSE), for the proxy to tell its own cursors by name
	// References are the reference tables the statement names (a
	// RefWrite's written one first): every node it runs on must hold their
	// copies.
	References []string

	// CollationProbe is, for a FanOut with sort keys not all under
	// COLLATE "C", the statement whose one row gives each key's collation
	// on the catalog node and whether it orders as bytes (collation.go):
	// column 2i is key i's collation name or NULL, 2i+1 a bool. "" when
	// no key needs it.
	CollationProbe string

	// Prepared is, for a Single plan of a simple-protocol statement, or a
	// Catalog INSERT, UPDATE or DELETE without RETURNING, the statement
	// with its constants as parameters (prepared.go); nil when it must run
	// as its text.
	Prepared *Prepared

	render *renderer      // Single, InsertSplit, WriteAll: the statement in pieces around each reference to the tree
	fan    *fanRender     // FanOut: the per-shard branch and the outer ORDER BY
	every  *allShards     // FanOut: its targets over every shard of the last map resolved
	split  *splitter      // InsertSplit: head, rows and tail for RenderRows
	write  *writeRenderer // WriteAll: the statement cut for RenderFiltered
	src    *planSource    // while planning only: what a shape template is made from
}

// String is a stable one-line description for golden files and logs.
func (p *Plan) String() string {
	var b strings.Builder
	b.WriteString(p.Kind.String())
	switch p.Kind {
	case Single:
		fmt.Fprintf(&b, " tree=%s key=%s", p.Tree.Name, p.Key)
	case InsertSplit:
		fmt.Fprintf(&b, " tree=%s rows=[", p.Tree.Name)
		for i, v := range p.Rows {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(v.String())
		}
		b.WriteByte(']')
		if p.InOrder {
			b.WriteString(" returning_in_order")
		}
	case Function:
		if p.Compose != nil {
			b.WriteString(" compose " + p.Compose.String())
			break
		}
		b.WriteString(" " + p.Func.String())
	case WriteAll:
		fmt.Fprintf(&b, " tree=%s", p.Tree.Name)
	case Explain:
		b.WriteString(" prefix=" + strconv.Quote(p.Explain.Prefix))
		if p.Explain.Analyze {
			b.WriteString(" analyze")
		}
		b.WriteString(" of " + p.Explain.Query.String())
	case Transaction:
		b.WriteString(" " + p.Tx.String())
		if p.TxOptions != "" {
			fmt.Fprintf(&b, " options=%q", p.TxOptions)
		}
		if p.Savepoint != "" {
			fmt.Fprintf(&b, " savepoint=%q", p.Savepoint)
		}
		if p.Chain {
			b.WriteString(" chain")
		}
	case Refused:
		fmt.Fprintf(&b, " %s %q", p.Err.Code, p.Err.Message)
	case DDL:
		if p.Tree != nil {
			b.WriteString(" tree=" + p.Tree.Name)
		}
		b.WriteString(" op=" + p.DDL.Op.String())
		if len(p.DDL.Indexes) > 0 {
			fmt.Fprintf(&b, " indexes=%q", p.DDL.Indexes)
		}
		if p.DDL.Concurrently {
			b.WriteString(" concurrently")
		}
		if l := p.DDL.Log(); l != "" {
			fmt.Fprintf(&b, " log=%q", l)
		}
	case FanOut:
		if p.Keys != nil {
			b.WriteString(" keys=[")
			for i, v := range p.Keys {
				if i > 0 {
					b.WriteString(", ")
				}
				b.WriteString(v.String())
			}
			b.WriteByte(']')
		}
		if p.KeyArray != nil {
			b.WriteString(" keys=ANY(" + p.KeyArray.String() + ")")
		}
		if p.Agg != nil {
			form := "agg"
			switch {
			case p.Agg.Window:
				form = "window"
			case p.Agg.Gathered:
				form = "rows"
			case p.Agg.SetOp:
				form = "setop"
			}
			fmt.Fprintf(&b, " tree=%s %s columns=%d params=%v/%v", p.Tree.Name, form, p.Agg.Columns, p.Agg.PartialParams, p.Agg.FinalParams)
			if p.Agg.Limited {
				b.WriteString(" limited")
			}
			if p.Agg.CopyTo != "" {
				b.WriteString(" copy_to=" + strings.TrimSpace(p.Agg.CopyTo))
			}
			break
		}
		fmt.Fprintf(&b, " tree=%s sort=[", p.Tree.Name)
		for i, k := range p.Sort {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(k.String())
		}
		fmt.Fprintf(&b, "] hidden=%d", p.Hidden)
		if p.Limit != nil {
			b.WriteString(" limit=" + p.Limit.String())
		}
		if p.Offset != nil {
			b.WriteString(" offset=" + p.Offset.String())
		}
	case Copy:
		fmt.Fprintf(&b, " tree=%s %s", p.Tree.Name, p.Copy)
		if p.Copy.Query && p.Copy.QueryKind == Single {
			b.WriteString(" key=" + p.Key.String())
		}
	}
	if len(p.References) > 0 && (p.Kind == Catalog || p.Kind == RefWrite) {
		fmt.Fprintf(&b, " refs=%v", p.References)
		if p.Kind == RefWrite && p.Copy != nil {
			b.WriteString(" copy=stdin")
		}
		if p.Anywhere {
			b.WriteString(" anywhere")
		}
	}
	if p.Pin != 0 {
		b.WriteString(" pin=" + p.Pin.String())
	}
	if p.Unpin != 0 {
		b.WriteString(" unpin=" + p.Unpin.String())
	}
	if p.SetPath != "" {
		b.WriteString(" setpath")
	}
	if p.Reparse {
		b.WriteString(" reparse")
	}
	if p.Cursor != nil {
		b.WriteString(" cursor=" + p.Cursor.String())
	}
	if p.Tag != "" {
		b.WriteString(" tag=" + p.Tag)
	}
	return b.String()
}

// Render returns the statement to run on a shard of schema: every reference
// to the tree is replaced by schema.tree (quoted by quote_ident rules);
// aliases, comments and parameters are kept. For Catalog and the other
// kinds it returns SQL unchanged. For InsertSplit it renders all rows with
// the original parameter numbers (use it when every row maps to one shard).
func (p *Plan) Render(schema string) string {
	if p.render == nil {
		return p.SQL
	}
	return p.render.render(schema)
}

// RenderRows returns, for an InsertSplit plan, the INSERT with only the
// given VALUES rows (0-based indices into Rows, in the order given), the
// tree qualified by schema, and the parameters renumbered $1.. in order of
// first appearance; params[i] is the original 1-based parameter number of
// the new $i+1. Parameters used outside the VALUES list (ON CONFLICT ... DO
// UPDATE, RETURNING) are kept and renumbered too. It panics if rows is empty
// or holds an index out of range, or if the plan is not InsertSplit.
func (p *Plan) RenderRows(schema string, rows []int) (sql string, params []int) {
	if p.split == nil {
		panic("router: RenderRows on a " + p.Kind.String() + " plan")
	}
	return p.split.renderRows(p.render.qualified(schema), rows)
}
