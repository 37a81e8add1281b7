package router

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	pg "github.com/pganalyze/pg_query_go/v6"
)

// checkLexer holds the pure-Go lexer to pg_query's Scan: where the lexer
// answers, Scan must succeed with the same tokens (kind, keyword category,
// byte range) and so the same shape key.
func checkLexer(t *testing.T, sql string) {
	t.Helper()
	if strings.IndexByte(sql, 0) >= 0 {
		return // a C string ends at NUL; Plan never scans such text
	}
	toks, key, ok := lex(sql)
	if !ok {
		return
	}
	want, wantKey, wok := pgScan(sql)
	if !wok {
		t.Fatalf("%q: the lexer accepts what Scan rejects", sql)
	}
	if len(toks) != len(want) {
		t.Fatalf("%q: %d tokens, Scan has %d:\n got %v\nwant %v", sql, len(toks), len(want), toks, want)
	}
	for i := range toks {
		if toks[i] != want[i] {
			t.Fatalf("%q: token %d is %+v (%q), Scan has %+v (%q)", sql, i, toks[i], toks[i].text(sql), want[i], want[i].text(sql))
		}
	}
	if key != wantKey {
		t.Fatalf("%q: shape key differs from Scan's", sql)
	}
}

// lexerSeeds are the statements of the golden files and the fuzz corpora
// of the router, and forms the lexer must leave to Scan.
func lexerSeeds(t testing.TB) []string {
	seeds := readStatementsFile(t)
	blocks, _ := filepath.Glob("testdata/resolve/*.txt")
	for _, path := range blocks {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			if line != "" && !strings.HasPrefix(line, "#") && !strings.HasPrefix(line, "map:") && !strings.HasPrefix(line, "bind:") {
				seeds = append(seeds, line)
			}
		}
	}
	for _, dir := range []string{"testdata/fuzz/FuzzPlan", "testdata/fuzz/FuzzRoute"} {
		files, _ := filepath.Glob(dir + "/*")
		for _, path := range files {
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(string(data), "\n")
			if len(lines) < 2 {
				continue
			}
			v := lines[1]
			switch {
			case strings.HasPrefix(v, "string(") && strings.HasSuffix(v, ")"):
				if s, err := strconv.Unquote(v[len("string(") : len(v)-1]); err == nil {
					seeds = append(seeds, s)
				}
			case strings.HasPrefix(v, "[]byte(") && strings.HasSuffix(v, ")"):
				// FuzzRoute's inputs drive its statement generator.
				if s, err := strconv.Unquote(v[len("[]byte(") : len(v)-1]); err == nil {
					sql, _, _ := genKeyed(&draws{b: []byte(s)})
					seeds = append(seeds, sql)
				}
			}
		}
	}
	return append(seeds,
		`SELECT E'a\'b', e'\\x'`, `SELECT B'101', X'1F', N'x', U&'d\0061t\+000061'`, `SELECT U&"d\0061t" UESCAPE '!'`,
		`SELECT $$a'b$$, $tag$x$tag$`, `SELECT 'a'`+"\n"+`'b'`, `SELECT 'a' -- c`+"\n"+` 'b'`, `SELECT 'a' /* c */ 'b'`,
		`SELECT 'a\b', 'it''s', ''`, `SELECT "a""b", "", "unterminated`, `SELECT 'unterminated`,
		`SELECT /* a /* nested */ b */ 1`, `SELECT /* plain */ 1 /**/ /***/`, `SELECT 1 /* unterminated`,
		`SELECT 1e5, 1.5e-3, .5, 5., 1..2, 0x1F, 0o17, 0b101, 1_000, 123abc, 1.2.3`,
		`SELECT 2147483647, 2147483648, -2147483648, 00000000002147483648, 99999999999999999999`,
		`SELECT a+-1, a-+1, a*-1, a @- b, a !~~* b, a <=> b, a->>'k', a#>>'{k}', a<>b, a!=b, a=>b, a>=b, a<=b`,
		`SELECT a::int, a := 1, a[1:2], x.y.z, $1, $12, $1abc, $, ?`, `SELECT a--comment`+"\n"+`, b`,
		`SELECT a /*+ hint */ FROM t`, `SELECT "MixedCase".k FROM "MixedCase"`, `select NULLS_P, not_la, ABORT`,
		"SELECT\x0b1", "SELECT\f1\r\n", `SELECT 'é', ident_é, "ü"`, `SELECT a\b`, "SELECT 'a\xff'", `SELECT {a}`,
		`SELECT * FROM t WHERE a NOT IN (1) AND b NOT LIKE 'x' AND c IS NOT NULL ORDER BY d NULLS FIRST`,
		`WITH x AS (SELECT 1) SELECT * FROM x WITH ORDINALITY`, `SELECT 1 ;; SELECT 2;`,
		"UPDATE pgbench_accounts SET abalance = abalance + -4123 WHERE aid = 81234;",
		"SELECT abalance FROM pgbench_accounts WHERE aid = 55;",
		"INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES (3, 1, 4, -500, CURRENT_TIMESTAMP);",
	)
}

func TestLexerMatchesScan(t *testing.T) {
	for _, s := range lexerSeeds(t) {
		checkLexer(t, s)
	}
}

// The lexer answers for the statements a driver sends most and leaves
// the uncertain forms to Scan.
func TestLexerCoverage(t *testing.T) {
	answers := []string{
		"SELECT abalance FROM pgbench_accounts WHERE aid = 55;",
		"UPDATE pgbench_accounts SET abalance = abalance + -4123 WHERE aid = 81234;",
		`SELECT * FROM catalogue WHERE sku = 'a''b' AND price >= 1.5 -- note`,
		`/* app=web */ SELECT v FROM "MixedCase" WHERE k = $1::uuid`,
		`INSERT INTO orders (id, total) VALUES (1, 2), (3, 4) ON CONFLICT (id) DO NOTHING`,
	}
	for _, s := range answers {
		if _, _, ok := lex(s); !ok {
			t.Errorf("lexer gives up on %q", s)
		}
	}
	leaves := []string{
		`SELECT E'a'`, `SELECT e'a'`, `SELECT B'1'`, `SELECT x'1f'`, `SELECT N'a'`, `SELECT U&'a'`, `SELECT u&"a"`,
		`SELECT $$a$$`, `SELECT $q$a$q$`, "SELECT 'a'\n'b'", `SELECT /* /* */ */ 1`, `SELECT 1e5`, `SELECT 0x1f`,
		`SELECT 1_000`, `SELECT a+-1`, `SELECT a*--1`, `SELECT 1..2`, "SELECT\x0b1", `SELECT 'open`, `SELECT "open`,
		`SELECT ""`, `SELECT /* open`, `SELECT $1a`, `SELECT \x`,
	}
	for _, s := range leaves {
		if _, _, ok := lex(s); ok {
			t.Errorf("lexer answers for %q, which it must leave to Scan", s)
		}
	}
}

// FuzzLexer checks the lexer against pg_query's Scan on arbitrary text.
func FuzzLexer(f *testing.F) {
	for _, s := range lexerSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, sql string) {
		if len(sql) > 4000 {
			return
		}
		checkLexer(t, sql)
	})
}

func TestKeywordTable(t *testing.T) {
	kw := keywords()
	// kwlist.h of pg_query's PostgreSQL 17 has 491 keywords: a shorter
	// table lost some, and quoteIdent and the lexer would miss them.
	if len(kw) != 491 {
		t.Fatalf("%d keywords, want 491", len(kw))
	}
	for word, want := range map[string]pg.Token{"select": pg.Token_SELECT, "null": pg.Token_NULL_P, "abort": pg.Token_ABORT_P} {
		if kw[word].kind != want {
			t.Errorf("%s: %v, want %v", word, kw[word].kind, want)
		}
	}
	for w := range kw {
		if len(w) > maxKeywordLen {
			t.Errorf("keyword %q is longer than maxKeywordLen", w)
		}
	}
}

// TestKeywordIndex: the lexer's hashed table answers as the keyword map
// does, for every keyword and for words that are none.
func TestKeywordIndex(t *testing.T) {
	kw, idx := keywords(), keywordIndex()
	lookup := func(w string) (token, bool) {
		h := uint32(keywordHashSeed)
		for i := 0; i < len(w); i++ {
			h = keywordHash(h, w[i])
		}
		return idx.find([]byte(w), h)
	}
	for w, want := range kw {
		if got, ok := lookup(w); !ok || got != want {
			t.Errorf("%q: %v %v, want %v", w, got, ok, want)
		}
	}
	for _, w := range []string{"", "kv", "catalogue", "selects", "selec", "nul", "lattice_s0005", "k"} {
		if got, ok := lookup(w); ok {
			t.Errorf("%q is no keyword, found %v", w, got)
		}
	}
}
