package router

import (
	"math"
	"strconv"

	pg "github.com/pganalyze/pg_query_go/v6"
)

// SQL-level cursors. A cursor over trees (DECLARE ... CURSOR FOR a SELECT
// of trees) cannot live on one backend: its rows are on several nodes. The
// proxy runs its query at DECLARE, as a statement of its own, and holds the
// rows; FETCH, MOVE and CLOSE of it are then the proxy's (proxy/cursor.go).
// A cursor over ordinary tables stays PostgreSQL's, on the catalog node:
// its statements are Catalog plans that carry a CursorPlan only so that the
// proxy can tell the two apart by name.

// CursorOp is what a cursor statement does.
type CursorOp int

const (
	CursorDeclare CursorOp = iota
	CursorFetch
	CursorMove
	CursorClose
)

var cursorOpNames = [...]string{"declare", "fetch", "move", "close"}

// FetchDirection is a FETCH or MOVE's direction, as PostgreSQL's grammar
// reduces them: NEXT is FORWARD 1, PRIOR BACKWARD 1, FIRST ABSOLUTE 1, LAST
// ABSOLUTE -1, ALL FORWARD FetchAll.
type FetchDirection int

const (
	FetchForward FetchDirection = iota
	FetchBackward
	FetchAbsolute
	FetchRelative
)

var fetchDirectionNames = [...]string{"forward", "backward", "absolute", "relative"}

// FetchAll is the count of FETCH ALL (PostgreSQL's FETCH_ALL, LONG_MAX).
const FetchAll = math.MaxInt64

// CursorPlan is a cursor statement.
type CursorPlan struct {
	Op   CursorOp
	Name string // "" for CLOSE ALL
	// Query is a DECLARE's SELECT over trees, deparsed (Kind Cursor only).
	Query string
	// Hold, Scroll and NoScroll are DECLARE's WITH HOLD, SCROLL and NO
	// SCROLL; Binary its BINARY.
	Hold, Scroll, NoScroll, Binary bool
	// Direction and Count are a FETCH or MOVE's.
	Direction FetchDirection
	Count     int64
}

// CURSOR_OPT_* of PostgreSQL's parsenodes.h (cursorOptHold is in pin.go).
const (
	cursorOptBinary   = 0x0001
	cursorOptScroll   = 0x0002
	cursorOptNoScroll = 0x0004
)

func (c *CursorPlan) String() string {
	name := c.Name
	if c.Op == CursorClose && name == "" {
		name = "(all)"
	}
	s := cursorOpNames[c.Op] + " " + name
	switch c.Op {
	case CursorDeclare:
		for _, o := range []struct {
			on   bool
			name string
		}{{c.Hold, "hold"}, {c.Scroll, "scroll"}, {c.NoScroll, "no-scroll"}, {c.Binary, "binary"}} {
			if o.on {
				s += " " + o.name
			}
		}
		if c.Query != "" {
			s += " query=" + c.Query
		}
	case CursorFetch, CursorMove:
		s += " " + fetchDirectionNames[c.Direction] + " "
		if c.Count == FetchAll {
			s += "all"
		} else {
			s += strconv.FormatInt(c.Count, 10)
		}
	}
	return s
}

// declareCursor plans DECLARE: over trees a Cursor plan whose query the
// proxy runs; otherwise the statement goes to the catalog node unchanged.
func (p *planner) declareCursor(pl *Plan, d *pg.DeclareCursorStmt, n *pg.Node, start, end int) {
	c := &CursorPlan{Op: CursorDeclare, Name: d.Portalname,
		Hold: d.Options&cursorOptHold != 0, Scroll: d.Options&cursorOptScroll != 0,
		NoScroll: d.Options&cursorOptNoScroll != 0, Binary: d.Options&cursorOptBinary != 0}
	r := p.route(d.Query)
	switch r.kind {
	case Catalog:
		p.apply(pl, p.route(n), start, end)
		pl.Cursor = c
		return
	case Refused:
		pl.Kind, pl.Err = Refused, r.err
		return
	case Single, FanOut:
	default:
		pl.Kind, pl.Err = Refused, refused("Declare the cursor over a SELECT of the trees, or run the query without a cursor.",
			"DECLARE CURSOR over this query is not supported: only a SELECT of trees can be held by the proxy")
		return
	}
	sel := d.Query.GetSelectStmt()
	if sel == nil {
		pl.Kind, pl.Err = Refused, refused("Declare the cursor over a SELECT.", "DECLARE CURSOR over this query is not supported")
		return
	}
	q, err := deparseStmt(sel)
	if err != nil {
		pl.Kind, pl.Err = Refused, refused("Run the query without a cursor.", "DECLARE CURSOR over this query is not supported: %v", err)
		return
	}
	c.Query = q
	pl.Kind, pl.Cursor, pl.Tag = Cursor, c, "DECLARE CURSOR"
}

// cursorStatement is the CursorPlan of a FETCH, MOVE or CLOSE, nil for any
// other statement.
func cursorStatement(n *pg.Node) *CursorPlan {
	switch s := n.Node.(type) {
	case *pg.Node_FetchStmt:
		f := s.FetchStmt
		c := &CursorPlan{Op: CursorFetch, Name: f.Portalname, Count: f.HowMany}
		if f.Ismove {
			c.Op = CursorMove
		}
		switch f.Direction {
		case pg.FetchDirection_FETCH_BACKWARD:
			c.Direction = FetchBackward
		case pg.FetchDirection_FETCH_ABSOLUTE:
			c.Direction = FetchAbsolute
		case pg.FetchDirection_FETCH_RELATIVE:
			c.Direction = FetchRelative
		}
		return c
	case *pg.Node_ClosePortalStmt:
		return &CursorPlan{Op: CursorClose, Name: s.ClosePortalStmt.Portalname}
	}
	return nil
}
