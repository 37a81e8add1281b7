package router

import (
	"strings"
	"sync"

	pg "github.com/pganalyze/pg_query_go/v6"
)

// token is one token of a statement as PostgreSQL's scanner cuts it: its
// kind, whether it is a keyword and of which category, and its byte range.
type token struct {
	kind       pg.Token
	kw         pg.KeywordKind
	start, end int32
}

// text is the token's text in sql.
func (t token) text(sql string) string { return sql[t.start:t.end] }

// scan cuts sql into tokens and derives its shape key (shape.go) in the
// same pass. The pure-Go lexer handles the forms statements usually take;
// whatever it is not sure of it leaves to pg_query's Scan, PostgreSQL's own
// scanner. It reports false when Scan fails too (a lexical error).
func scan(sql string) ([]token, string, bool) {
	if toks, key, ok := lex(sql); ok {
		return toks, key, true
	}
	return pgScan(sql)
}

// scanBuf is scan into buffers reused from statement to statement: every
// simple-protocol statement is scanned for its shape key (Planner.Plan),
// and a hit in the shape cache then allocates neither the token list nor
// the key. What scanBuf returns is valid until its next scan.
type scanBuf struct {
	toks []token
	key  []byte
}

var scanBufs = sync.Pool{New: func() any { return new(scanBuf) }}

func (b *scanBuf) scan(sql string) ([]token, []byte, bool) {
	toks, key, ok := lexTo(b.toks[:0], b.key[:0], sql)
	if !ok {
		var k string
		if toks, k, ok = pgScan(sql); !ok {
			return nil, nil, false
		}
		key = append(b.key[:0], k...)
	} else {
		b.toks = toks
	}
	b.key = key
	return toks, key, true
}

// pgScan is scan by pg_query alone.
func pgScan(sql string) ([]token, string, bool) {
	res, err := pg.Scan(sql)
	if err != nil {
		return nil, "", false
	}
	toks := make([]token, len(res.Tokens))
	for i, t := range res.Tokens {
		toks[i] = token{kind: t.Token, kw: t.KeywordKind, start: t.Start, end: t.End}
	}
	return toks, shapeKey(sql, toks), true
}

// keywords maps each keyword, lower-case, to its token and category. It
// is read from pg_query itself: every token name that is a keyword's
// (SELECT, NULL_P ...) is scanned once, so the table is the scanner's own.
var keywords = sync.OnceValue(func() map[string]token {
	out := make(map[string]token, 512)
	for _, name := range pg.Token_name {
		word := strings.ToLower(strings.TrimSuffix(name, "_P"))
		if word == "" || strings.Trim(word, "abcdefghijklmnopqrstuvwxyz_") != "" {
			continue
		}
		res, err := pg.Scan(word)
		if err != nil || len(res.Tokens) != 1 || res.Tokens[0].KeywordKind == pg.KeywordKind_NO_KEYWORD {
			continue
		}
		t := res.Tokens[0]
		out[word] = token{kind: t.Token, kw: t.KeywordKind}
	}
	return out
})

// maxKeywordLen bounds the words looked up in keywords.
const maxKeywordLen = 24

// keywordTable holds keywords in an open-addressing table whose hash the
// lexer computes while it folds a word's case: looking up every word of
// every simple-protocol statement costs no map hashing.
type keywordTable struct {
	slots [keywordSlots]keywordSlot
}

// keywordSlots is a power of two above four times the keyword count, so
// probes stay short.
const keywordSlots = 2048

type keywordSlot struct {
	word string
	tok  token
}

// keywordHash folds one more byte into h (FNV-1a).
func keywordHash(h uint32, c byte) uint32 { return (h ^ uint32(c)) * 16777619 }

const keywordHashSeed = 2166136261

var keywordIndex = sync.OnceValue(func() *keywordTable {
	t := new(keywordTable)
	kw := keywords()
	if len(kw)*4 > keywordSlots {
		panic("router: keywordSlots too small for the scanner's keywords")
	}
	for word, tok := range kw {
		h := uint32(keywordHashSeed)
		for i := 0; i < len(word); i++ {
			h = keywordHash(h, word[i])
		}
		i := h & (keywordSlots - 1)
		for t.slots[i].word != "" {
			i = (i + 1) & (keywordSlots - 1)
		}
		t.slots[i] = keywordSlot{word: word, tok: tok}
	}
	return t
})

// find looks up a lower-cased word whose keywordHash is h.
func (t *keywordTable) find(word []byte, h uint32) (token, bool) {
	for i := h & (keywordSlots - 1); ; i = (i + 1) & (keywordSlots - 1) {
		s := &t.slots[i]
		if s.word == "" {
			return token{}, false
		}
		if s.word == string(word) {
			return s.tok, true
		}
	}
}

// selfChars are the characters the scanner returns as tokens of their own
// (their ASCII code is the token).
const selfChars = ",()[].;:+-*/%^<>="

// opChars are the characters operators are made of.
const opChars = "~!@#^&|`?+-*/%<>="

func isIdentStart(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' || c >= 0x80
}

func isIdentCont(c byte) bool {
	return isIdentStart(c) || c >= '0' && c <= '9' || c == '$'
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// lex is the pure-Go scanner: the token list and shape key of sql, or
// false where it is not certain to cut sql as PostgreSQL's scanner
// (pg_query's Scan) does. It knows identifiers, keywords, "quoted"
// identifiers, 'strings' (standard_conforming_strings on), decimal integers
// and numerics without exponent, $n, -- and /* */ comments, the
// one-character tokens and operators. It gives up on: E'x', B'1', X'f',
// N'x', U&'x' and U&"x" forms, $$ quotes, strings continued over a newline,
// exponents, 0x / 0o / 0b and 1_000 numbers, nested comments, operators
// that the scanner would cut again (those holding -- or /*, or ending in +
// or -), "..", vertical tabs, backslashes outside strings, and anything
// unterminated or malformed. The fuzzer FuzzLexer holds it to Scan.
func lex(sql string) ([]token, string, bool) {
	toks, key, ok := lexTo(make([]token, 0, 8+len(sql)/4), make([]byte, 0, len(sql)+len(sql)/2), sql)
	return toks, string(key), ok
}

// lexTo is lex appending the tokens to toks and the shape key to key.
func lexTo(toks []token, key []byte, sql string) ([]token, []byte, bool) {
	kw := keywordIndex()
	emit := func(kind pg.Token, kwk pg.KeywordKind, start, end int) {
		toks = append(toks, token{kind: kind, kw: kwk, start: int32(start), end: int32(end)})
		key = append(key, byte(kind>>8), byte(kind))
		if !isConstToken(kind) && kwk == pg.KeywordKind_NO_KEYWORD {
			key = append(key, sql[start:end]...)
			key = append(key, 0)
		}
	}
	n := len(sql)
	if n > 1<<30 {
		return nil, nil, false
	}
	for i := 0; i < n; {
		c := sql[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f':
			i++
		case c == '-' && i+1 < n && sql[i+1] == '-':
			j := i + 2
			for j < n && sql[j] != '\n' && sql[j] != '\r' {
				j++
			}
			emit(pg.Token_SQL_COMMENT, 0, i, j)
			i = j
		case c == '/' && i+1 < n && sql[i+1] == '*':
			j, ok := comment(sql, i)
			if !ok {
				return nil, nil, false // unterminated, or nested
			}
			emit(pg.Token_C_COMMENT, 0, i, j)
			i = j
		case c == '\'':
			j, ok := quoted(sql, i, '\'')
			if !ok || continued(sql, j) {
				return nil, nil, false
			}
			emit(pg.Token_SCONST, 0, i, j)
			i = j
		case c == '"':
			j, ok := quoted(sql, i, '"')
			if !ok || j == i+2 {
				return nil, nil, false // unterminated, or a zero-length name
			}
			emit(pg.Token_IDENT, 0, i, j)
			i = j
		case isIdentStart(c):
			j := i + 1
			for j < n && isIdentCont(sql[j]) {
				j++
			}
			if j < n && (sql[j] == '\'' || sql[j] == '"' || sql[j] == '&') && j == i+1 && strings.IndexByte("bBxXeEnNuU", c) >= 0 {
				return nil, nil, false // B'', X'', E'', N'', U&'' or U&""
			}
			if j-i <= maxKeywordLen {
				var buf [maxKeywordLen]byte
				h := uint32(keywordHashSeed)
				for k := i; k < j; k++ {
					buf[k-i] = lowerByte(sql[k])
					h = keywordHash(h, buf[k-i])
				}
				if t, ok := kw.find(buf[:j-i], h); ok {
					emit(t.kind, t.kw, i, j)
					i = j
					continue
				}
			}
			emit(pg.Token_IDENT, 0, i, j)
			i = j
		case isDigit(c) || c == '.' && i+1 < n && isDigit(sql[i+1]):
			j, kind, ok := number(sql, i)
			if !ok {
				return nil, nil, false
			}
			emit(kind, 0, i, j)
			i = j
		case c == '$':
			j := i + 1
			for j < n && isDigit(sql[j]) {
				j++
			}
			if j == i+1 || j < n && isIdentCont(sql[j]) {
				return nil, nil, false // a $$ quote, or $1abc
			}
			emit(pg.Token_PARAM, 0, i, j)
			i = j
		case c == ':':
			switch {
			case i+1 < n && sql[i+1] == ':':
				emit(pg.Token_TYPECAST, 0, i, i+2)
				i += 2
			case i+1 < n && sql[i+1] == '=':
				emit(pg.Token_COLON_EQUALS, 0, i, i+2)
				i += 2
			default:
				emit(pg.Token(':'), 0, i, i+1)
				i++
			}
		case c == '.':
			if i+1 < n && sql[i+1] == '.' {
				return nil, nil, false
			}
			emit(pg.Token('.'), 0, i, i+1)
			i++
		case strings.IndexByte(opChars, c) >= 0:
			j := i + 1
			for j < n && strings.IndexByte(opChars, sql[j]) >= 0 {
				j++
			}
			op := sql[i:j]
			if len(op) > 1 && (strings.Contains(op, "--") || strings.Contains(op, "/*") ||
				op[len(op)-1] == '+' || op[len(op)-1] == '-') || len(op) >= 63 {
				return nil, nil, false // the scanner would cut it shorter
			}
			emit(opToken(op), 0, i, j)
			i = j
		case strings.IndexByte(selfChars, c) >= 0:
			emit(pg.Token(c), 0, i, i+1)
			i++
		default:
			return nil, nil, false
		}
	}
	return toks, key, true
}

// quoted returns the end of the quoted string or name starting at sql[i],
// where a doubled quote stands for one.
func quoted(sql string, i int, q byte) (int, bool) {
	for j := i + 1; j < len(sql); j++ {
		if sql[j] != q {
			continue
		}
		if j+1 < len(sql) && sql[j+1] == q {
			j++
			continue
		}
		return j + 1, true
	}
	return 0, false
}

// comment returns the end of the /* comment starting at sql[i], read from
// left to right as the scanner reads it: a "/*" before the first "*/",
// even one sharing its star ("/*/*/"), opens a nested comment.
func comment(sql string, i int) (int, bool) {
	for k := i + 2; k+1 < len(sql); k++ {
		switch {
		case sql[k] == '/' && sql[k+1] == '*':
			return 0, false
		case sql[k] == '*' && sql[k+1] == '/':
			return k + 2, true
		}
	}
	return 0, false
}

// continued reports whether a string ending at sql[j] may go on: another
// string after white space holding a newline is the same string.
func continued(sql string, j int) bool {
	newline := false
	for ; j < len(sql); j++ {
		switch c := sql[j]; {
		case c == '\n' || c == '\r':
			newline = true
		case c == ' ' || c == '\t' || c == '\f' || c == '\v':
		case c == '-' && j+1 < len(sql) && sql[j+1] == '-':
			for j < len(sql) && sql[j] != '\n' && sql[j] != '\r' {
				j++
			}
			j--
		default:
			return newline && c == '\''
		}
	}
	return false
}

// number reads a decimal integer (ICONST, or FCONST when it does not fit
// in an int4, as the scanner decides) or a numeric with a point (FCONST).
func number(sql string, i int) (int, pg.Token, bool) {
	j := i
	for j < len(sql) && isDigit(sql[j]) {
		j++
	}
	kind := pg.Token_ICONST
	if j < len(sql) && sql[j] == '.' {
		if j+1 < len(sql) && sql[j+1] == '.' {
			return 0, 0, false // 1..2
		}
		kind = pg.Token_FCONST
		j++
		for j < len(sql) && isDigit(sql[j]) {
			j++
		}
	}
	if j < len(sql) && (isIdentStart(sql[j]) || sql[j] == '.') {
		return 0, 0, false // an exponent, 0x1f, 1_000, trailing junk
	}
	if kind == pg.Token_ICONST && !fitsInt4(sql[i:j]) {
		kind = pg.Token_FCONST
	}
	return j, kind, true
}

// fitsInt4 reports whether decimal digits are at most 2147483647.
func fitsInt4(d string) bool {
	d = strings.TrimLeft(d, "0")
	const max = "2147483647"
	return len(d) < len(max) || len(d) == len(max) && d <= max
}

// opToken is the token of an operator the scanner does not cut further.
func opToken(op string) pg.Token {
	if len(op) == 1 && strings.IndexByte(selfChars, op[0]) >= 0 {
		return pg.Token(op[0])
	}
	switch op {
	case "=>":
		return pg.Token_EQUALS_GREATER
	case ">=":
		return pg.Token_GREATER_EQUALS
	case "<=":
		return pg.Token_LESS_EQUALS
	case "<>", "!=":
		return pg.Token_NOT_EQUALS
	}
	return pg.Token_Op
}

// lowerByte folds an ASCII letter, as the scanner does for keyword lookup.
func lowerByte(c byte) byte {
	if c >= 'A' && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}
