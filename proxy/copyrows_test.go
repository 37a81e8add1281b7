package proxy

import (
	"encoding/binary"
	"fmt"
	"strings"
	"testing"

	"github.com/lattice-db/lattice/router"
	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// copySpec plans a COPY statement on a tree t(a text key, b, c) and returns its spec.
func copySpec(t *testing.T, sql string) *router.CopySpec {
	t.Helper()
	plans, err := router.NewPlanner(16).Plan(sql, testTrees{}, 1)
	if err != nil || len(plans) != 1 || plans[0].Kind != router.Copy {
		t.Fatalf("%s: plans %v, %v", sql, plans, err)
	}
	return plans[0].Copy
}

// parsed is one row as the parser returns it.
type parsed struct {
	row, key string
	null     bool
}

func (p parsed) String() string {
	if p.null {
		return fmt.Sprintf("%q key NULL", p.row)
	}
	return fmt.Sprintf("%q key %q", p.row, p.key)
}

// parseAll feeds data in chunks of size step (whole data when step <= 0)
// and returns the rows and the first error's SQLSTATE.
func parseAll(c *router.CopySpec, data string, step int) ([]parsed, string) {
	rp := newRowParser(c, "a")
	var out []parsed
	drain := func(final bool) string {
		for {
			row, key, ok, err := rp.next(final)
			if err != nil {
				return sqlstate.As(err).Code
			}
			if !ok {
				return ""
			}
			out = append(out, parsed{row: string(row), key: string(key.val), null: key.null})
		}
	}
	if step <= 0 {
		step = len(data) + 1
	}
	for i := 0; i < len(data); i += step {
		if err := rp.feed([]byte(data[i:min(i+step, len(data))])); err != nil {
			return out, sqlstate.As(err).Code
		}
		if code := drain(false); code != "" {
			return out, code
		}
	}
	return out, drain(true)
}

func TestRowParsers(t *testing.T) {
	cases := []struct {
		name, sql, data string
		want            []parsed
		code            string
	}{
		{"text", `COPY t FROM STDIN`, "k1\tv\t1\nk2\tv\t2\n",
			[]parsed{{"k1\tv\t1\n", "k1", false}, {"k2\tv\t2\n", "k2", false}}, ""},
		{"text escapes in key", `COPY t FROM STDIN`, "a\\tb\\\\c\\n\\101\\x41\\q\tv\n",
			[]parsed{{"a\\tb\\\\c\\n\\101\\x41\\q\tv\n", "a\tb\\c\nAAq", false}}, ""},
		{"text escaped delimiter and newline", `COPY t FROM STDIN`, "a\\\tb\\\nc\tv\n",
			[]parsed{{"a\\\tb\\\nc\tv\n", "a\tb\nc", false}}, ""},
		{"text null", `COPY t FROM STDIN`, "\\N\tv\n", []parsed{{"\\N\tv\n", "", true}}, ""},
		{"text escaped N is not null", `COPY t FROM STDIN`, "\\\\N\tv\n", []parsed{{"\\\\N\tv\n", "\\N", false}}, ""},
		{"text custom null", `COPY t FROM STDIN (NULL 'nil')`, "nil\tv\n\\N\tv\n",
			[]parsed{{"nil\tv\n", "", true}, {"\\N\tv\n", "N", false}}, ""},
		{"text key in third column", `COPY t (b, c, a) FROM STDIN (DELIMITER '|')`, "x|y|key\n",
			[]parsed{{"x|y|key\n", "key", false}}, ""},
		{"text missing key column", `COPY t (b, c, a) FROM STDIN`, "x\ty\n", nil, "22P04"},
		{"text crlf", `COPY t FROM STDIN`, "k1\tv\r\nk2\tv\r\n",
			[]parsed{{"k1\tv\r\n", "k1", false}, {"k2\tv\r\n", "k2", false}}, ""},
		{"text cr", `COPY t FROM STDIN`, "k1\tv\rk2\tv\r",
			[]parsed{{"k1\tv\r", "k1", false}, {"k2\tv\r", "k2", false}}, ""},
		{"text last line without end", `COPY t FROM STDIN`, "k1\tv\nk2\tv",
			[]parsed{{"k1\tv\n", "k1", false}, {"k2\tv\n", "k2", false}}, ""},
		{"text end marker", `COPY t FROM STDIN`, "k1\tv\n\\.\nk2\tv\n", []parsed{{"k1\tv\n", "k1", false}}, ""},
		{"text end marker at end", `COPY t FROM STDIN`, "k1\tv\n\\.", []parsed{{"k1\tv\n", "k1", false}}, ""},
		{"text corrupt end marker", `COPY t FROM STDIN`, "k1\tv\n\\.x\n", []parsed{{"k1\tv\n", "k1", false}}, "22P04"},
		{"text header", `COPY t FROM STDIN (HEADER)`, "a\tb\nk1\tv\n", []parsed{{"k1\tv\n", "k1", false}}, ""},
		{"text empty line", `COPY t FROM STDIN`, "\n", []parsed{{"\n", "", false}}, ""},

		{"csv", `COPY t FROM STDIN (FORMAT csv)`, "k1,v,1\n\"k,2\",\"v\"\"x\",2\n",
			[]parsed{{"k1,v,1\n", "k1", false}, {"\"k,2\",\"v\"\"x\",2\n", "k,2", false}}, ""},
		{"csv quoted newlines", `COPY t FROM STDIN (FORMAT csv)`, "\"k\n1\",\"a\r\nb\"\nk2,x\n",
			[]parsed{{"\"k\n1\",\"a\r\nb\"\n", "k\n1", false}, {"k2,x\n", "k2", false}}, ""},
		{"csv doubled quote in key", `COPY t FROM STDIN (FORMAT csv)`, "\"a\"\"b\"\"\",v\n",
			[]parsed{{"\"a\"\"b\"\"\",v\n", "a\"b\"", false}}, ""},
		{"csv partly quoted key", `COPY t FROM STDIN (FORMAT csv)`, "ab\"c,d\"ef,v\n",
			[]parsed{{"ab\"c,d\"ef,v\n", "abc,def", false}}, ""},
		{"csv null and quoted empty", `COPY t FROM STDIN (FORMAT csv)`, ",v\n\"\",v\n",
			[]parsed{{",v\n", "", true}, {"\"\",v\n", "", false}}, ""},
		{"csv force not null", `COPY t FROM STDIN (FORMAT csv, FORCE_NOT_NULL (a))`, ",v\n",
			[]parsed{{",v\n", "", false}}, ""},
		{"csv force null", `COPY t FROM STDIN (FORMAT csv, FORCE_NULL (a), NULL 'x')`, "\"x\",v\nx,v\n\"y\",v\n",
			[]parsed{{"\"x\",v\n", "", true}, {"x,v\n", "", true}, {"\"y\",v\n", "y", false}}, ""},
		{"csv escape char", `COPY t FROM STDIN (FORMAT csv, ESCAPE '\')`, "\"a\\\"b\\\\c\\d\",v\n",
			[]parsed{{"\"a\\\"b\\\\c\\d\",v\n", "a\"b\\c\\d", false}}, ""},
		{"csv escape before quote at line end", `COPY t FROM STDIN (FORMAT csv, ESCAPE '\')`, "\"a\\\"\n\",v\n",
			[]parsed{{"\"a\\\"\n\",v\n", "a\"\n", false}}, ""},
		{"csv single quote char", `COPY t FROM STDIN (FORMAT csv, QUOTE '''', DELIMITER ';')`, "'a;b''c';\"x\"\n",
			[]parsed{{"'a;b''c';\"x\"\n", "a;b'c", false}}, ""},
		{"csv backslash is data", `COPY t FROM STDIN (FORMAT csv)`, "a\\.b,v\n\\.x,v\n",
			[]parsed{{"a\\.b,v\n", "a\\.b", false}, {"\\.x,v\n", "\\.x", false}}, ""},
		{"csv end marker", `COPY t FROM STDIN (FORMAT csv)`, "k,v\n\\.\r\nafter,v\n", []parsed{{"k,v\n", "k", false}}, ""},
		{"csv header with quotes", `COPY t FROM STDIN (FORMAT csv, HEADER)`, "\"a\nb\",c\nk,v\n", []parsed{{"k,v\n", "k", false}}, ""},
		{"csv unterminated", `COPY t FROM STDIN (FORMAT csv)`, "k1,v\n\"k2,v\n", []parsed{{"k1,v\n", "k1", false}}, "22P04"},
		{"csv key in last column", `COPY t (b, a) FROM STDIN (FORMAT csv)`, "x,\"k\"\r\n",
			[]parsed{{"x,\"k\"\r\n", "k", false}}, ""},
		{"csv missing key column", `COPY t (b, a) FROM STDIN (FORMAT csv)`, "x\n", nil, "22P04"},
	}
	for _, tc := range cases {
		c := copySpec(t, tc.sql)
		// Every split of the input into two messages, then byte by byte.
		for step := 0; step <= len(tc.data); step++ {
			t.Run(fmt.Sprintf("%s/step%d", tc.name, step), func(t *testing.T) {
				got, code := parseAll(c, tc.data, step)
				if code != tc.code {
					t.Fatalf("SQLSTATE %q, want %q (rows %v)", code, tc.code, got)
				}
				if fmt.Sprint(got) != fmt.Sprint(tc.want) {
					t.Fatalf("got  %v\nwant %v", got, tc.want)
				}
			})
			if step == 0 {
				step = max(1, len(tc.data)/7) - 1
			}
		}
	}
}

func binTuple(fields ...[]byte) string {
	var b []byte
	b = binary.BigEndian.AppendUint16(b, uint16(len(fields)))
	for _, f := range fields {
		if f == nil {
			b = binary.BigEndian.AppendUint32(b, 0xffffffff)
			continue
		}
		b = binary.BigEndian.AppendUint32(b, uint32(len(f)))
		b = append(b, f...)
	}
	return string(b)
}

func TestBinaryRowParser(t *testing.T) {
	c := copySpec(t, `COPY t (b, a) FROM STDIN (FORMAT binary)`)
	hdr := string(binaryHeader)
	t1 := binTuple([]byte("x"), []byte("key1"))
	t2 := binTuple(nil, []byte(""))
	t3 := binTuple([]byte("y"), nil)
	trailer := "\xff\xff"
	cases := []struct {
		name, data string
		want       []parsed
		code       string
	}{
		{"rows and trailer", hdr + t1 + t2 + trailer, []parsed{{t1, "key1", false}, {t2, "", false}}, ""},
		{"no trailer", hdr + t1, []parsed{{t1, "key1", false}}, ""},
		{"null key", hdr + t3 + trailer, []parsed{{t3, "", true}}, ""},
		{"header extension", hdr[:15] + "\x00\x00\x00\x03abc" + t1, []parsed{{t1, "key1", false}}, ""},
		{"bad signature", "PGCOPY\nXXXXXXXXXXXXXXX", nil, "22P04"},
		{"empty", "", nil, "22P04"},
		{"oids", hdr[:11] + "\x00\x01\x00\x00\x00\x00\x00\x00" + t1, nil, "22P04"},
		{"wrong field count", hdr + binTuple([]byte("x")), nil, "22P04"},
		{"truncated", hdr + t1[:len(t1)-1], nil, "22P04"},
		{"data after trailer", hdr + trailer + t1, nil, "22P04"},
	}
	for _, tc := range cases {
		for _, step := range []int{0, 1, 3, 7} {
			t.Run(fmt.Sprintf("%s/step%d", tc.name, step), func(t *testing.T) {
				got, code := parseAll(c, tc.data, step)
				if code != tc.code {
					t.Fatalf("SQLSTATE %q, want %q (rows %v)", code, tc.code, got)
				}
				if tc.code == "" && fmt.Sprint(got) != fmt.Sprint(tc.want) {
					t.Fatalf("got  %v\nwant %v", got, tc.want)
				}
			})
		}
	}
}

func TestRowParserBound(t *testing.T) {
	c := copySpec(t, `COPY t FROM STDIN`)
	rp := newRowParser(c, "a")
	chunk := []byte(strings.Repeat("x", 1<<20))
	for i := 0; i <= maxCopyRow>>20+1; i++ {
		if err := rp.feed(chunk); err != nil {
			if sqlstate.As(err).Code != "54000" {
				t.Fatalf("error %v, want 54000", err)
			}
			return
		}
		if _, _, ok, err := rp.next(false); ok || err != nil {
			t.Fatalf("a row without end: ok %v, %v", ok, err)
		}
	}
	t.Fatalf("a row past %d MB was accepted", maxCopyRow>>20)
}

// testTrees holds one tree t(a text key, b, c).
type testTrees struct{}

func (testTrees) Tree(name string) (*shardmap.Tree, bool) {
	if name != "t" {
		return nil, false
	}
	return &shardmap.Tree{Name: "t", KeyColumn: "a", KeyType: shardmap.KeyText, Columns: []string{"a", "b", "c"}}, true
}

func TestAppendCopyText(t *testing.T) {
	for _, tc := range []struct {
		values [][]byte
		want   string
	}{
		{[][]byte{[]byte("1"), []byte("plain")}, "1\tplain\n"},
		{[][]byte{[]byte("1"), nil}, "1\t\\N\n"},
		{[][]byte{[]byte("1"), {}}, "1\t\n"},
		{[][]byte{[]byte(`\N`)}, `\\N` + "\n"},
		{[][]byte{[]byte("a\tb\nc\rd\\e")}, `a\tb\nc\rd\\e` + "\n"},
		{[][]byte{[]byte("ünï")}, "ünï\n"},
	} {
		if got := string(appendCopyText(nil, tc.values)); got != tc.want {
			t.Errorf("%q: got %q, want %q", tc.values, got, tc.want)
		}
	}
}

func TestCopyTextValues(t *testing.T) {
	for _, tc := range []struct {
		rows [][][]byte
		want string
	}{
		{[][][]byte{{[]byte("1"), []byte("plain")}}, "(E'1', E'plain')"},
		{[][][]byte{{[]byte("1"), nil}, {[]byte("2"), {}}}, "(E'1', NULL), (E'2', E'')"},
		{[][][]byte{{[]byte("it's"), []byte(`\N`)}}, `(E'it''s', E'\\N')`},
		{[][][]byte{{[]byte("a\tb\nc\rd\\e")}}, `(E'a\tb\nc\rd\\e')`},
		{[][][]byte{{[]byte("ünï")}}, "(E'ünï')"},
	} {
		var text []byte
		for _, r := range tc.rows {
			text = appendCopyText(text, r)
		}
		if got := copyTextValues(text); got != tc.want {
			t.Errorf("%q: got %s, want %s", tc.rows, got, tc.want)
		}
	}
}
