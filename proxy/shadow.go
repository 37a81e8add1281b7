package proxy

import (
	"context"
	"strings"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/router"
	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// The router takes a bare name, or public.<name>, of a tree or reference
// table to be that table, whatever the search_path. PostgreSQL resolves a
// bare name by the search_path: under SET search_path = other, public a
// table other.orders is what it reads for "orders". So once a session sets
// a search_path (or a transaction a SET LOCAL one), the proxy asks the
// catalog node, under the session's settings, which of the tenant's names
// resolve elsewhere than public (or nowhere), and refuses a statement that
// names one, rather than read the tree where PostgreSQL would read the
// other table. The answer is kept until the settings, the tenant's trees or
// the result epoch (DDL through this proxy) change. A schema named after
// the user under the default search_path ("$user", public) is not looked
// for: the session set no search_path.

// shadowState is what the session last learned, and under what.
type shadowState struct {
	fp, local    string          // the settings' fingerprint and the SET LOCALs
	trees, epoch uint64          // the view's TreesVersion and the result epoch
	names        map[string]bool // shadowed name -> whether it resolves to another relation (false: to none)
}

// shadowSQL lists the names of $1 that do not resolve to public.<name>,
// and whether they resolve at all. Every name is pg_catalog-qualified: it
// runs under the session's search_path.
const shadowSQL = `SELECT n, pg_catalog.to_regclass(pg_catalog.quote_ident(n)) IS NOT NULL FROM pg_catalog.unnest($1::pg_catalog.text[]) AS n
WHERE pg_catalog.to_regclass(pg_catalog.quote_ident(n)) IS DISTINCT FROM pg_catalog.to_regclass(pg_catalog.concat('public.', pg_catalog.quote_ident(n)))`

// shadowCheck refuses p when it names a tree or reference table whose bare
// name the session's search_path resolves elsewhere.
func (s *session) shadowCheck(ctx context.Context, v *shardmap.View, p *router.Plan) error {
	local := false
	for _, stmt := range s.tx.local {
		local = local || mentionsSearchPath(stmt)
	}
	if !s.settings.searchPath && !local || v == nil || !namesDistributed(p) {
		return nil
	}
	now := shadowState{fp: s.settings.fp, trees: v.TreesVersion, epoch: pgshard.ResultEpoch()}
	if local {
		now.local = strings.Join(s.tx.local, "\x00")
	}
	if s.shadow.names == nil || s.shadow.fp != now.fp || s.shadow.local != now.local || s.shadow.trees != now.trees || s.shadow.epoch != now.epoch {
		names, err := s.shadowedNames(ctx, v)
		if err != nil {
			return err
		}
		now.names = names
		s.shadow = now
	}
	for name, exists := range s.shadow.names {
		if !namesRelation(p.SQL, name) {
			continue
		}
		if !exists {
			e := sqlstate.New(sqlstate.UndefinedTable, "relation %q does not exist", name)
			e.Detail = "The session's search_path does not include public, where the table " + quoteIdent(name) + " is."
			e.Hint = "Name it public." + quoteIdent(name) + ", or put public in the search_path."
			return e
		}
		e := sqlstate.New(sqlstate.FeatureNotSupported, "%q names another relation under the session's search_path than the table public.%s that Lattice distributes", name, quoteIdent(name))
		e.Detail = "Through the proxy a bare name always means public." + quoteIdent(name) + ", which is not what PostgreSQL would read here."
		e.Hint = "Qualify the name: public." + quoteIdent(name) + " for the distributed table, or the other table's schema."
		return e
	}
	return nil
}

// shadowCheckAfter is shadowCheck for a statement that follows others
// not yet played: in a query string of several, or in an extended batch
// up to its Sync or Flush. pathSet reports that one of them sets the
// search_path. The check asks under the session's settings, which that SET
// has not changed yet (it is recorded once played), so such a statement
// naming a tree or reference table bare is refused: under the new
// search_path PostgreSQL might read another table for that name.
func (s *session) shadowCheckAfter(ctx context.Context, v *shardmap.View, p *router.Plan, pathSet bool) error {
	if pathSet && namesDistributed(p) && namesBare(v, p.SQL) {
		return s.pathSetEarlier(p)
	}
	return s.shadowCheck(ctx, v, p)
}

// namesBare reports whether sql may name one of the view's trees or
// reference tables bare (all of them without a view), which a search_path
// could resolve to another table; a qualified name it cannot.
func namesBare(v *shardmap.View, sql string) bool {
	if v == nil {
		return true
	}
	for name := range v.Trees {
		if namesRelation(sql, name) {
			return true
		}
	}
	for name := range v.References {
		if namesRelation(sql, name) {
			return true
		}
	}
	return false
}

// pathSetEarlier is shadowCheckAfter's refusal, in the words of the
// protocol the statement came by.
func (s *session) pathSetEarlier(p *router.Plan) error {
	where, hint := "query string", "Send the SET as a query of its own."
	if !s.simple {
		where, hint = "batch", "Send a Sync after the SET, before the statements that name the table bare."
	}
	e := sqlstate.New(sqlstate.FeatureNotSupported, "%s on a tree or reference table after SET search_path in the same %s is not supported through the Lattice proxy", strings.ToUpper(firstWord(p.SQL)), where)
	e.Detail = "The proxy checks which table a bare name means under the search_path before the " + where + " runs, so it cannot follow a SET of search_path inside it."
	e.Hint = hint
	return e
}

// namesDistributed reports whether p names a tree or reference table,
// whose bare names the router takes to be public's.
func namesDistributed(p *router.Plan) bool {
	return p.Tree != nil || len(p.References) > 0
}

// setsSearchPath reports whether p is a SET (or SET LOCAL, or RESET) of
// the search_path, or a set_config of it the router follows as a SET.
func setsSearchPath(p *router.Plan) bool {
	return (p.Kind == router.SessionSet || p.Kind == router.LocalSet) && mentionsSearchPath(p.SQL) || p.SetPath != ""
}

func mentionsSearchPath(stmt string) bool {
	return strings.Contains(strings.ToLower(stmt), "search_path")
}

// shadowedNames asks the catalog node which of the view's names the
// session's search_path resolves elsewhere.
func (s *session) shadowedNames(ctx context.Context, v *shardmap.View) (map[string]bool, error) {
	var arr strings.Builder
	arr.WriteByte('{')
	sep := ""
	add := func(name string) {
		arr.WriteString(sep + `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(name) + `"`)
		sep = ","
	}
	for name := range v.Trees {
		add(name)
	}
	for name := range v.References {
		add(name)
	}
	arr.WriteByte('}')
	names := map[string]bool{}
	err := s.helperQuery(ctx, &pgproto3.Parse{Query: shadowSQL}, []*pgproto3.Bind{{Parameters: [][]byte{[]byte(arr.String())}}},
		func(values [][]byte) error {
			if len(values) == 2 {
				names[string(values[0])] = string(values[1]) == "t"
			}
			return nil
		})
	return names, err
}

// namesRelation reports whether sql may name name as a bare identifier:
// the name, in any case, between characters that cannot continue an
// identifier, and not after a dot. It may see one in a string or a
// comment too; the cost is a refusal with a hint in a session whose
// search_path already shadows the name.
func namesRelation(sql, name string) bool {
	lower, want := strings.ToLower(sql), strings.ToLower(name)
	for i := 0; ; {
		j := strings.Index(lower[i:], want)
		if j < 0 {
			return false
		}
		at, past := i+j, i+j+len(want)
		before := byte(' ')
		if at > 0 {
			before = lower[at-1]
		}
		if before == '"' && at > 1 && lower[at-2] == '.' {
			before = '.' // "schema"."name"
		}
		after := byte(' ')
		if past < len(lower) {
			after = lower[past]
		}
		if !identChar(before) && before != '.' && !identChar(after) {
			return true
		}
		i = at + 1
	}
}

func identChar(c byte) bool {
	return c == '_' || c == '$' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 0x80
}
