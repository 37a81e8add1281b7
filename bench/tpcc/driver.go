package main

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5/stdlib"
)

// go-tpc v1.0.7 ships only a MySQL driver, so its SQL carries MySQL's
// dialect: "?" placeholders, DATETIME and INDEX clauses in its CREATE TABLE,
// and STRAIGHT_JOIN in two consistency checks. This driver wraps pgx's
// database/sql driver and translates exactly those; every other byte of the
// kit's statements reaches the server as the kit wrote it.

const driverName = "tpcc-pgx"

func init() { sql.Register(driverName, pgDriver{}) }

type pgDriver struct{}

func (pgDriver) Open(dsn string) (driver.Conn, error) {
	c, err := stdlib.GetDefaultDriver().Open(dsn)
	if err != nil {
		return nil, err
	}
	return &pgConn{Conn: c.(*stdlib.Conn)}, nil
}

// afterDDL, when set, runs once on the connection that created the kit's
// last table (item), before the load starts: the Lattice run turns the
// tables into trees there, so the kit loads through the proxy into them.
var afterDDL func(ctx context.Context, c *stdlib.Conn) error

type pgConn struct{ *stdlib.Conn }

func (c *pgConn) Prepare(query string) (driver.Stmt, error) {
	return c.Conn.Prepare(translate(query))
}

func (c *pgConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	return c.Conn.PrepareContext(ctx, translate(query))
}

func (c *pgConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	return c.Conn.QueryContext(ctx, translate(query), args)
}

func (c *pgConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	table, stmts, ok := createTable(query)
	if !ok {
		return c.Conn.ExecContext(ctx, translate(query), args)
	}
	var res driver.Result
	for _, s := range stmts {
		r, err := c.Conn.ExecContext(ctx, s, nil)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s, err)
		}
		res = r
	}
	if table == "item" && afterDDL != nil {
		if err := afterDDL(ctx, c.Conn); err != nil {
			return nil, err
		}
	}
	return res, nil
}

var (
	createRe   = regexp.MustCompile(`(?is)^\s*CREATE TABLE IF NOT EXISTS (\w+)\s*\(`)
	indexRe    = regexp.MustCompile(`(?i),\s*INDEX (\w+) \(([^)]*)\)`)
	datetimeRe = regexp.MustCompile(`(?i)\bDATETIME\b`)
)

// createTable turns the kit's MySQL CREATE TABLE into PostgreSQL's: the
// table without its INDEX clauses, then one CREATE INDEX for each.
func createTable(query string) (string, []string, bool) {
	m := createRe.FindStringSubmatch(query)
	if m == nil {
		return "", nil, false
	}
	table := m[1]
	var idx []string
	for _, im := range indexRe.FindAllStringSubmatch(query, -1) {
		idx = append(idx, fmt.Sprintf("CREATE INDEX IF NOT EXISTS %s ON %s (%s)", im[1], table, im[2]))
	}
	body := datetimeRe.ReplaceAllString(indexRe.ReplaceAllString(query, ""), "TIMESTAMP")
	return table, append([]string{body}, idx...), true
}

// translate numbers the "?" placeholders as $1, $2, ... outside string
// literals, quoted identifiers and comments, and writes STRAIGHT_JOIN (a
// MySQL join-order hint with the join condition in WHERE) as CROSS JOIN.
func translate(query string) string {
	var b strings.Builder
	n := 0
	for i := 0; i < len(query); i++ {
		ch := query[i]
		switch {
		case ch == '\'' || ch == '"':
			j := i + 1
			for j < len(query) && query[j] != ch {
				j++
			}
			b.WriteString(query[i:min(j+1, len(query))])
			i = j
		case ch == '/' && i+1 < len(query) && query[i+1] == '*':
			j := strings.Index(query[i+2:], "*/")
			end := len(query)
			if j >= 0 {
				end = i + 2 + j + 2
			}
			b.WriteString(query[i:end])
			i = end - 1
		case ch == '?':
			n++
			fmt.Fprintf(&b, "$%d", n)
		default:
			b.WriteByte(ch)
		}
	}
	return straightJoinRe.ReplaceAllString(b.String(), "CROSS JOIN")
}

var straightJoinRe = regexp.MustCompile(`(?i)\bSTRAIGHT_JOIN\b`)
