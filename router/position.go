package router

import (
	"strings"
	"unicode/utf8"

	pg "github.com/pganalyze/pg_query_go/v6"
)

// maxAlignCells bounds the table ClientPosition aligns tokens in: it runs
// only for an error, but a statement and its rewrite are the client's size.
const maxAlignCells = 1 << 21

// ClientPosition maps an error position PostgreSQL reported in sent, the
// statement the proxy sent for the client's text client, to the same place
// in client. Positions are PostgreSQL's: 1-based, in characters. It aligns
// the two texts' tokens (the rewrite renames relations, qualifies them and
// wraps branches, and keeps the client's tokens in order) and maps the
// token at pos to its match in client, keeping the offset inside it. It
// returns 0, for no position, where that token has no match or the texts
// do not align well enough to trust: a caret in the wrong place is worse
// than none.
func ClientPosition(client, sent string, pos int) int {
	if pos <= 0 || client == "" || sent == "" {
		return 0
	}
	if client == sent {
		return pos
	}
	at := byteOffset(sent, pos-1)
	if at < 0 {
		return 0
	}
	ct, _, ok1 := scan(client)
	st, _, ok2 := scan(sent)
	if !ok1 || !ok2 || len(ct) == 0 || len(ct)*len(st) > maxAlignCells {
		return 0
	}
	target := -1
	for i, t := range st {
		if int(t.start) <= at && at < int(t.end) {
			target = i
			break
		}
	}
	if target < 0 {
		return 0
	}
	match, matched := alignTokens(client, ct, sent, st)
	// Most client tokens survive the rewrite (not an ORDER BY's
	// expression, which becomes a position); fewer say that client is
	// not the text this statement was made from.
	if matched*10 < len(ct)*8 || match[target] < 0 {
		return 0
	}
	c := ct[match[target]]
	inside := at - int(st[target].start)
	return utf8.RuneCountInString(client[:int(c.start)+inside]) + 1
}

// byteOffset is the byte offset of the n-th character (0-based) of s, or -1.
func byteOffset(s string, n int) int {
	for i := range s {
		if n == 0 {
			return i
		}
		n--
	}
	return -1
}

// alignTokens matches tokens of sent to equal tokens of client, in order,
// as many as possible, each as early in sent as such a match allows: the
// first branch of a fan-out's UNION ALL, where PostgreSQL reports an
// error, takes the client's tokens. match[i] is the client token of sent
// token i, or -1.
func alignTokens(client string, ct []token, sent string, st []token) (match []int, matched int) {
	n, m := len(ct), len(st)
	// A constant the proxy sent as a parameter ($n) stands for itself.
	same := func(i, j int) bool {
		if st[j].kind == pg.Token_PARAM && isConstant(ct[i].kind) {
			return true
		}
		if isConstant(ct[i].kind) {
			return ct[i].text(client) == st[j].text(sent)
		}
		// The rewrite writes its own keywords in capitals.
		return strings.EqualFold(ct[i].text(client), st[j].text(sent))
	}
	// lcs[i*(m+1)+j]: the longest common subsequence of ct[i:] and st[j:].
	lcs := make([]int32, (n+1)*(m+1))
	for i := n - 1; i >= 0; i-- {
		for j := m - 1; j >= 0; j-- {
			k := i*(m+1) + j
			switch {
			case same(i, j):
				lcs[k] = lcs[k+m+2] + 1
			case lcs[k+m+1] >= lcs[k+1]:
				lcs[k] = lcs[k+m+1]
			default:
				lcs[k] = lcs[k+1]
			}
		}
	}
	match = make([]int, m)
	for j := range match {
		match[j] = -1
	}
	for i, j := 0, 0; i < n && j < m; {
		k := i*(m+1) + j
		switch {
		case same(i, j) && lcs[k] == lcs[k+m+2]+1:
			match[j] = i
			matched++
			i, j = i+1, j+1
		case lcs[k+1] == lcs[k]:
			j++ // a token of the rewrite's own
		default:
			i++
		}
	}
	return match, matched
}

func isConstant(k pg.Token) bool {
	switch k {
	case pg.Token_SCONST, pg.Token_ICONST, pg.Token_FCONST, pg.Token_BCONST, pg.Token_XCONST, pg.Token_USCONST:
		return true
	}
	return false
}
