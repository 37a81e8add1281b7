package router

import (
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Pin is session state a statement leaves on the backend that ran it and
// that the proxy cannot replay on another backend. A session holding any of
// it keeps its catalog-node backend to itself (it is pinned) until the
// state is gone. Plan.Pin says what a statement creates, Plan.Unpin what it
// ends; DISCARD ALL (Kind Discard) ends all of it.
type Pin uint8

const (
	PinTempTable    Pin = 1 << iota // CREATE TEMP TABLE / VIEW / SEQUENCE, SELECT INTO TEMP, CREATE TABLE pg_temp.x
	PinAdvisoryLock                 // pg_advisory_lock and friends, the session-level ones
	PinPrepare                      // SQL-level PREPARE
	PinCursor                       // DECLARE ... WITH HOLD
	PinSetConfig                    // set_config(name, value, is_local) with is_local not the constant true

	PinAll = PinTempTable | PinAdvisoryLock | PinPrepare | PinCursor | PinSetConfig
)

var pinNames = [...]string{"temp_table", "advisory_lock", "prepare", "cursor_with_hold", "set_config"}

// Names are the reasons in p, for metrics and messages.
func (p Pin) Names() []string {
	var out []string
	for i, n := range pinNames {
		if p&(1<<i) != 0 {
			out = append(out, n)
		}
	}
	return out
}

func (p Pin) String() string { return strings.Join(p.Names(), ",") }

// cursorOptHold is CURSOR_OPT_HOLD of PostgreSQL's parsenodes.h.
const cursorOptHold = 0x0020

// sessionAdvisory are the functions that take advisory locks held until the
// session ends or they are unlocked; the _xact ones end with the transaction.
var sessionAdvisory = map[string]bool{
	"pg_advisory_lock": true, "pg_advisory_lock_shared": true,
	"pg_try_advisory_lock": true, "pg_try_advisory_lock_shared": true,
}

// pins classifies what session state statement n creates and ends. A
// single unlock (pg_advisory_unlock, DEALLOCATE name, CLOSE name, DROP of
// one temp table) ends nothing: the proxy cannot tell whether it was the
// last, so the session stays pinned, which is safe.
func pins(n *pg.Node) (pin, unpin Pin, hides Hides) {
	hides = statementHides(n)
	switch s := n.Node.(type) {
	case *pg.Node_CreateStmt:
		if tempRel(s.CreateStmt.Relation) && s.CreateStmt.Oncommit != pg.OnCommitAction_ONCOMMIT_DROP {
			pin |= PinTempTable
		}
	case *pg.Node_CreateTableAsStmt:
		if into := s.CreateTableAsStmt.Into; into != nil && tempRel(into.Rel) && into.OnCommit != pg.OnCommitAction_ONCOMMIT_DROP {
			pin |= PinTempTable
		}
	case *pg.Node_SelectStmt:
		if into := s.SelectStmt.IntoClause; into != nil && tempRel(into.Rel) && into.OnCommit != pg.OnCommitAction_ONCOMMIT_DROP {
			pin |= PinTempTable
		}
	case *pg.Node_ViewStmt:
		if tempRel(s.ViewStmt.View) {
			pin |= PinTempTable
		}
	case *pg.Node_CreateSeqStmt:
		if tempRel(s.CreateSeqStmt.Sequence) {
			pin |= PinTempTable
		}
	case *pg.Node_PrepareStmt:
		pin |= PinPrepare
	case *pg.Node_DeallocateStmt:
		if s.DeallocateStmt.Isall {
			unpin |= PinPrepare
		}
	case *pg.Node_DeclareCursorStmt:
		if s.DeclareCursorStmt.Options&cursorOptHold != 0 {
			pin |= PinCursor
		}
	case *pg.Node_ClosePortalStmt:
		if s.ClosePortalStmt.Portalname == "" {
			unpin |= PinCursor
		}
	case *pg.Node_DiscardStmt:
		if s.DiscardStmt.Target == pg.DiscardMode_DISCARD_TEMP {
			unpin |= PinTempTable
		}
	}
	var visit func(m protoreflect.Message)
	visit = func(m protoreflect.Message) {
		if f, ok := m.Interface().(*pg.FuncCall); ok && len(f.Funcname) > 0 {
			// The same walk classifies every call (untracked.go), so a
			// statement with no function call pays nothing more.
			hides |= callHides(f)
			switch name := strings.ToLower(f.Funcname[len(f.Funcname)-1].GetString_().GetSval()); {
			case sessionAdvisory[name]:
				pin |= PinAdvisoryLock
			case name == "pg_advisory_unlock_all":
				unpin |= PinAdvisoryLock
			case name == "set_config" && !localSetConfig(f):
				pin |= PinSetConfig
			}
		}
		eachChild(m, visit)
	}
	visit(n.ProtoReflect())
	return pin, unpin &^ pin, hides
}

// tempRel reports a relation created as temporary: TEMP / TEMPORARY, or
// named in schema pg_temp or pg_temp_N (the session's temporary schema by
// its own name, which PostgreSQL lets it use).
func tempRel(rv *pg.RangeVar) bool {
	return rv != nil && (rv.Relpersistence == "t" || tempSchema(rv.Schemaname))
}

func tempSchema(name string) bool {
	rest, ok := strings.CutPrefix(strings.ToLower(name), "pg_temp")
	if n, numbered := strings.CutPrefix(rest, "_"); numbered {
		return ok && n != "" && strings.Trim(n, "0123456789") == ""
	}
	return ok && rest == ""
}

// localSetConfig reports set_config(name, value, true): a setting for the
// current transaction only, which ends with it on the same backend. Only
// the keyword true counts: a string such as 'on' is a constant a shape
// template may vary (shape.go), so it pins, which is safe.
func localSetConfig(f *pg.FuncCall) bool {
	if len(f.Args) != 3 {
		return false
	}
	c, ok := bareConstant(f.Args[2])
	return ok && c.kind == litBool && c.text == "true"
}

// applyPins records on pl what session state statement n creates and ends.
// Only statements on the catalog node may create it: its backend is the
// one a session keeps. The same state left on a shard's backend would stay
// behind in the pool, so such a statement is refused.
func applyPins(pl *Plan, n *pg.Node) {
	if pl.Kind == Catalog {
		// PREPARE and DEALLOCATE name statements the client may also have
		// prepared with the protocol, which the proxy keeps (one namespace
		// per session, as in PostgreSQL).
		switch s := n.Node.(type) {
		case *pg.Node_PrepareStmt:
			pl.Prepare = s.PrepareStmt.Name
		case *pg.Node_DeallocateStmt:
			pl.Dealloc, pl.Anywhere = s.DeallocateStmt.Name, false
		}
	}
	pin, unpin, hides := pins(n)
	if pl.Kind != Refused {
		pl.Hides = hides
	}
	if pin == 0 && unpin == 0 {
		return
	}
	switch pl.Kind {
	case Catalog:
		// It must reach the catalog node, where the session's state lives,
		// even inside a transaction held by another node.
		pl.Pin, pl.Unpin, pl.Anywhere = pin, unpin, false
	case Refused:
	default:
		if pin == 0 {
			// Ends nothing the session holds on the catalog node.
			return
		}
		on := "a tree"
		if pl.Tree != nil {
			on = "tree " + qn(pl.Tree.Name)
		}
		*pl = Plan{Kind: Refused, SQL: pl.SQL, Err: refused("Run it in a statement that names no tree (e.g. SELECT pg_advisory_lock(42)), or use the transaction-scoped form (pg_advisory_xact_lock, set_config(..., true), ON COMMIT DROP) inside a transaction.",
			"a statement on %s cannot create session state (%s): the backend it runs on is shared through the pool", on, pin)}
	}
}
