package integration

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// genRun is how a generated statement is sent: in the simple protocol,
// in the extended protocol as written, or with its constants as Bind
// parameters, through one prepared statement bound twice with different
// values, so that routing, limits and filters are resolved at Bind.
type genRun int

const (
	genSimple genRun = iota
	genExtended
	genBound
)

var genRuns = []genRun{genSimple, genExtended, genBound}

func (r genRun) String() string { return [...]string{"simple", "extended", "bound"}[r] }

// runGen runs q as run says and returns its rows; a bound statement's rows
// are those of its first Bind, each marked 1:, then its second's, marked 2:.
func runGen(t *testing.T, c *pgx.Conn, q string, run genRun) ([]string, error) {
	t.Helper()
	switch run {
	case genSimple:
		return queryStrings(t, c, q, pgx.QueryExecModeSimpleProtocol)
	case genExtended:
		return queryStrings(t, c, q, pgx.QueryExecModeCacheStatement)
	}
	sql, args := parameterized(q)
	var out []string
	for pass := 1; pass <= 2; pass++ {
		rows, err := queryStrings(t, c, sql, append([]any{pgx.QueryExecModeCacheStatement}, args...)...)
		if err != nil {
			return nil, err
		}
		for _, r := range rows {
			out = append(out, fmt.Sprintf("%d:%s", pass, r))
		}
		// The second Bind moves every number by one: another key,
		// another limit, another bound.
		for i, a := range args {
			if n, ok := a.(int64); ok {
				args[i] = n + 1
			}
		}
	}
	return out, nil
}

// genInList is an IN list of numbers; genConstant a number or a string
// after an operator, LIMIT, BETWEEN or AND, where PostgreSQL infers a
// parameter's type from the other side (not ORDER BY or GROUP BY
// positions, which a parameter would turn into constants).
var (
	genInList   = regexp.MustCompile(`\bIN \((\d+(?:, \d+)*)\)`)
	genConstant = regexp.MustCompile(`((?:=|<>|<=|>=|<|>|\+|%|\bLIMIT|\bBETWEEN|\bAND) )(\d+|'[^']*')`)
)

// parameterized is q with its constants replaced by $1, $2, … and their
// values, numbers as int64 and strings as string.
func parameterized(q string) (string, []any) {
	var args []any
	param := func(lit string) string {
		if strings.HasPrefix(lit, "'") {
			args = append(args, strings.Trim(lit, "'"))
		} else {
			n, _ := strconv.ParseInt(lit, 10, 64)
			args = append(args, n)
		}
		return "$" + strconv.Itoa(len(args))
	}
	q = genInList.ReplaceAllStringFunc(q, func(list string) string {
		var ps []string
		for _, lit := range strings.Split(genInList.FindStringSubmatch(list)[1], ", ") {
			ps = append(ps, param(lit))
		}
		return "IN (" + strings.Join(ps, ", ") + ")"
	})
	q = genConstant.ReplaceAllStringFunc(q, func(m string) string {
		sub := genConstant.FindStringSubmatch(m)
		return sub[1] + param(sub[2])
	})
	return q, args
}
