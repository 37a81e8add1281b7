package router

import (
	"encoding/json"
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"

	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// A function, procedure or DO block runs where it is created: on the
// catalog node, where a tree is its empty template. A body that reads a
// tree there answers as if the tree had no rows, so CREATE FUNCTION,
// CREATE PROCEDURE and DO are refused when their SQL or PL/pgSQL body
// names a tree. What the proxy cannot see stays the caller's: dynamic SQL
// (EXECUTE of a string), other languages, and bodies created before the
// table became a tree (lattice_create_tree refuses only the SQL-standard
// bodies PostgreSQL records as depending on the table).

// bodyTree returns the first tree the body of a CREATE FUNCTION,
// CREATE PROCEDURE or DO statement names, or nil.
func (p *planner) bodyTree(root any) *shardmap.Tree {
	var lang, body string
	var stmt string // the statement PL/pgSQL's parser reads
	switch s := root.(type) {
	case *pg.CreateFunctionStmt:
		if s.SqlBody != nil {
			return nil // a SQL-standard body is walked with the statement
		}
		lang, body = languageAndBody(s.Options, "sql")
		if lang == "plpgsql" {
			text, err := pg.Deparse(&pg.ParseResult{Version: parseVersion, Stmts: []*pg.RawStmt{{Stmt: &pg.Node{Node: &pg.Node_CreateFunctionStmt{CreateFunctionStmt: s}}}}})
			if err != nil {
				return nil
			}
			stmt = text
		}
	case *pg.DoStmt:
		lang, body = languageAndBody(s.Args, "plpgsql")
		tag := "$lattice_do$"
		for strings.Contains(body, tag) {
			tag = "$lattice_do" + tag[1:]
		}
		stmt = "CREATE FUNCTION lattice_do() RETURNS void LANGUAGE plpgsql AS " + tag + body + tag
	default:
		return nil
	}
	var queries []string
	switch lang {
	case "sql":
		queries = []string{body}
	case "plpgsql":
		queries = plpgsqlQueries(stmt)
	}
	for _, q := range queries {
		res, err := pg.Parse(q)
		if err != nil {
			continue // PostgreSQL reports it when it checks the body
		}
		for _, raw := range res.Stmts {
			m, ok := nodeMessage(raw.Stmt)
			if !ok {
				continue
			}
			for _, r := range walkStmt(m).rels {
				if r.cte {
					continue
				}
				if t, _ := p.lookup(r.rv); t != nil {
					return t
				}
			}
		}
	}
	return nil
}

// languageAndBody reads the LANGUAGE (lang when none is given) and the
// body of a CREATE FUNCTION's options or a DO's arguments: a function's
// AS is a list whose first item is the body, a DO's the body itself.
func languageAndBody(opts []*pg.Node, lang string) (string, string) {
	var body string
	for _, o := range opts {
		d := o.GetDefElem()
		switch d.GetDefname() {
		case "language":
			lang = strings.ToLower(d.Arg.GetString_().GetSval())
		case "as":
			if items := d.Arg.GetList().GetItems(); len(items) > 0 {
				body = items[0].GetString_().GetSval()
			} else {
				body = d.Arg.GetString_().GetSval()
			}
		}
	}
	return lang, body
}

// plpgsqlQueries lists the SQL of a PL/pgSQL function's statements and
// expressions, each as a statement the SQL parser reads; none when the
// body does not parse.
func plpgsqlQueries(stmt string) []string {
	text, err := pg.ParsePlPgSqlToJSON(stmt)
	if err != nil {
		return nil
	}
	var tree any
	if json.Unmarshal([]byte(text), &tree) != nil {
		return nil
	}
	var out []string
	var visit func(v any)
	visit = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if e, ok := v["PLpgSQL_expr"].(map[string]any); ok {
				q, _ := e["query"].(string)
				mode, _ := e["parseMode"].(float64)
				switch mode {
				case 0: // a whole statement
					out = append(out, q)
				case 2: // an expression
					out = append(out, "SELECT "+q)
				case 3, 4, 5: // an assignment: target := expression
					if _, expr, ok := strings.Cut(q, ":="); ok {
						out = append(out, "SELECT "+expr)
					}
				}
			}
			for _, c := range v {
				visit(c)
			}
		case []any:
			for _, c := range v {
				visit(c)
			}
		}
	}
	visit(tree)
	return out
}

// bodyRefusal refuses a body that uses tree t.
func bodyRefusal(name string, t *shardmap.Tree) *sqlstate.Error {
	return refused("Read the tree from the application, through the proxy (a function may read ordinary and reference tables), or create the function on the nodes against the shard tables (lattice_sNNNN."+quoteIdent(t.Name)+").",
		"%s whose body uses tree %s is not supported: it would run on the catalog node, where the tree is an empty template", name, qn(t.Name))
}
