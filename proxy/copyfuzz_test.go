package proxy

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/lattice-db/lattice/router"
	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// copyTrees holds one tree per key type, each with columns k (the key), a, b.
type copyTrees struct{}

func (copyTrees) Tree(name string) (*shardmap.Tree, bool) {
	kt, ok := map[string]shardmap.KeyType{"tt": shardmap.KeyText, "ti": shardmap.KeyInt, "tu": shardmap.KeyUUID}[name]
	if !ok {
		return nil, false
	}
	return &shardmap.Tree{Name: name, KeyColumn: "k", KeyType: kt, Columns: []string{"k", "a", "b"}}, true
}

// copySplit is what the proxy's COPY FROM does with the client's data, minus
// the backends: the data arrives in the given CopyData chunks, each row is
// placed with rowParser.nextSlot (as copyIn.route does), and the rows of each
// shard are concatenated. It returns the rows in order with their slots,
// the data per shard, and the SQLSTATE of the first error.
func copySplit(p *router.Plan, m *shardmap.Map, chunks [][]byte) (rows [][]byte, slots []int, perShard map[int][]byte, code string) {
	rp := newRowParser(p.Copy, p.Tree.KeyColumn)
	perShard = map[int][]byte{}
	drain := func(final bool) string {
		for {
			row, slot, ok, err := rp.nextSlot(final, p.Tree, len(m.Slots))
			if err != nil {
				e := sqlstate.As(err)
				if len(e.Code) != 5 {
					panic(fmt.Sprintf("error without SQLSTATE: %v", err))
				}
				return e.Code
			}
			if !ok {
				return ""
			}
			if slot < 0 || slot >= len(m.Slots) {
				panic(fmt.Sprintf("slot %d out of range", slot))
			}
			rows = append(rows, append([]byte(nil), row...))
			slots = append(slots, slot)
			sh := m.Owner(slot).Index
			perShard[sh] = append(perShard[sh], row...)
		}
	}
	for _, c := range chunks {
		if err := rp.feed(c); err != nil {
			return rows, slots, perShard, sqlstate.As(err).Code
		}
		if code := drain(false); code != "" {
			return rows, slots, perShard, code
		}
	}
	return rows, slots, perShard, drain(true)
}

// chunk cuts data into CopyData messages at points drawn from c.
func chunk(c *choices, data []byte) [][]byte {
	var out [][]byte
	mode := c.intn(4)
	for len(data) > 0 {
		var n int
		switch mode {
		case 0:
			n = len(data)
		case 1:
			n = 1
		default:
			n = 1 + c.intn(1<<mode*8)
		}
		n = min(n, len(data))
		out = append(out, data[:n])
		data = data[n:]
	}
	return out
}

// copyPieces are the bytes generated field values are made of: the
// characters every format treats specially, and multi-byte UTF-8.
var copyPieces = []string{"a", "Z", "0", " ", "\t", "\n", "\r", "\r\n", "\\", "\\.", ".", "\"", "'", ",", ";", "|",
	"é", "日本", "🙂", "N", "\\N", "nil", "x", "\x7f", "\x01"}

func genString(c *choices) string {
	var b strings.Builder
	for n := c.intn(6); n > 0; n-- {
		b.WriteString(pick(c, copyPieces...))
	}
	return b.String()
}

// copyKeyValue is a generated key: its value as the key type sees it (for
// the independent hash), its text form, and its binary form.
type copyKeyValue struct {
	slot        int
	text, bin   []byte
	description string
}

func genKey(c *choices, kt shardmap.KeyType, slots int) copyKeyValue {
	switch kt {
	case shardmap.KeyInt:
		v := pick(c, int64(0), 1, -1, 42, 1<<31, -1<<31, 1<<63-1, -1<<63, int64(binary.BigEndian.Uint64(c.bytes(8))), int64(int16(c.intn(1<<16))))
		s := strconv.FormatInt(v, 10)
		if c.bool() { // int8in's leniency: sign, leading zeros, spaces
			digits, sign := strings.TrimPrefix(s, "-"), ""
			if v < 0 {
				sign = "-"
			} else if c.bool() {
				sign = "+"
			}
			s = strings.Repeat(" ", c.intn(3)) + sign + strings.Repeat("0", c.intn(3)) + digits + strings.Repeat(" ", c.intn(3))
		}
		var bin []byte
		switch {
		case v == int64(int16(v)) && c.bool():
			bin = binary.BigEndian.AppendUint16(nil, uint16(v))
		case v == int64(int32(v)) && c.bool():
			bin = binary.BigEndian.AppendUint32(nil, uint32(v))
		default:
			bin = binary.BigEndian.AppendUint64(nil, uint64(v))
		}
		return copyKeyValue{shardmap.SlotOf(shardmap.HashInt8(v), slots), []byte(s), bin, fmt.Sprint(v)}
	case shardmap.KeyUUID:
		u := [16]byte(c.bytes(16))
		h := hex.EncodeToString(u[:])
		var s string
		switch c.intn(4) {
		case 0:
			s = h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
		case 1:
			s = strings.ToUpper(h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:])
		case 2:
			s = h
		default:
			s = "{" + h + "}"
		}
		return copyKeyValue{shardmap.SlotOf(shardmap.HashUUID(u), slots), []byte(s), u[:], h}
	}
	s := genString(c)
	return copyKeyValue{shardmap.SlotOf(shardmap.HashText([]byte(s)), slots), []byte(s), []byte(s), strconv.Quote(s)}
}

// copyFormat is a generated COPY statement's data format.
type copyFormat struct {
	format             router.CopyFormat
	delim, quote, esc  byte
	null, eol          string
	header             bool
	options, keyColumn string
}

func genFormat(c *choices) copyFormat {
	f := copyFormat{format: pick(c, router.CopyText, router.CopyCSV, router.CopyBinary), eol: pick(c, "\n", "\r\n", "\r")}
	var opts []string
	switch f.format {
	case router.CopyText:
		f.delim, f.null = '\t', `\N`
		opts = append(opts, "FORMAT text")
	case router.CopyCSV:
		f.delim, f.quote, f.esc, f.null = ',', '"', '"', ""
		opts = append(opts, "FORMAT csv")
		if c.bool() {
			f.quote = pick(c, byte('\''), '|')
			opts = append(opts, "QUOTE '"+strings.ReplaceAll(string(f.quote), "'", "''")+"'")
		}
		if c.bool() {
			f.esc = pick(c, byte('\\'), '!')
			opts = append(opts, "ESCAPE '"+string(f.esc)+"'")
		} else {
			f.esc = f.quote
		}
	default:
		return copyFormat{format: router.CopyBinary, options: "FORMAT binary"}
	}
	if c.bool() {
		f.delim = pick(c, byte(','), ';', '\t', '#')
		if f.delim == f.quote {
			f.delim = ';'
		}
		opts = append(opts, "DELIMITER E'\\x"+hex.EncodeToString([]byte{f.delim})+"'")
	}
	if c.bool() {
		f.null = pick(c, "nil", "", `\N`, "NULL")
		opts = append(opts, "NULL '"+f.null+"'")
	}
	if c.bool() {
		f.header = true
		opts = append(opts, "HEADER")
	}
	f.options = strings.Join(opts, ", ")
	return f
}

// encodeText is a value in the text format as a client may write it:
// special characters escaped, other bytes now and then in octal or hex.
func (f copyFormat) encodeText(c *choices, v string) string {
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		ch := v[i]
		switch {
		case ch == '\\':
			b.WriteString(`\\`)
		case ch == '\n' || ch == '\r':
			if c.bool() {
				b.WriteString(map[byte]string{'\n': `\n`, '\r': `\r`}[ch])
			} else {
				b.WriteByte('\\')
				b.WriteByte(ch)
			}
		case ch == f.delim:
			if ch == '\t' && c.bool() {
				b.WriteString(`\t`)
			} else {
				b.WriteByte('\\')
				b.WriteByte(ch)
			}
		default:
			switch c.intn(8) {
			case 0:
				fmt.Fprintf(&b, `\%03o`, ch)
			case 1:
				fmt.Fprintf(&b, `\x%02X`, ch)
			default:
				b.WriteByte(ch)
			}
		}
	}
	s := b.String()
	if s == f.null && s != "" {
		// A value that reads as the NULL marker: escape its first byte.
		s = fmt.Sprintf(`\%03o`, s[0]) + s[1:]
	}
	return s
}

// encodeCSV quotes a value when it must be, and sometimes when it need not.
func (f copyFormat) encodeCSV(c *choices, v string) string {
	must := v == f.null || strings.HasPrefix(v, `\.`) ||
		strings.ContainsAny(v, string([]byte{f.delim, f.quote, '\n', '\r'}))
	if !must && !c.bool() {
		return v
	}
	var b strings.Builder
	b.WriteByte(f.quote)
	for i := 0; i < len(v); i++ {
		if v[i] == f.quote || v[i] == f.esc {
			b.WriteByte(f.esc)
		}
		b.WriteByte(v[i])
	}
	b.WriteByte(f.quote)
	return b.String()
}

// genRow is one generated row: its bytes in the data and its key's slot.
type genRow struct {
	data string
	slot int
	key  string
}

// genCopy generates COPY FROM data for a tree of key type kt: the data, the
// rows the proxy must find in it, and the statement.
func genCopy(c *choices, kt shardmap.KeyType, slots int) (sql string, data []byte, rows []genRow) {
	f := genFormat(c)
	tree := map[shardmap.KeyType]string{shardmap.KeyText: "tt", shardmap.KeyInt: "ti", shardmap.KeyUUID: "tu"}[kt]
	cols := pick(c, []string{"k", "a", "b"}, []string{"a", "k", "b"}, []string{"b", "a", "k"}, []string{"k"}, []string{"a", "k"})
	sql = fmt.Sprintf("COPY %s (%s) FROM STDIN (%s)", pick(c, tree, strings.ToUpper(tree), "public."+tree), strings.Join(cols, ", "), f.options)

	nrows := c.intn(10)
	var out []byte
	if f.format == router.CopyBinary {
		out = append(out, binarySignature...)
		out = append(out, 0, 0, 0, 0)
		ext := c.bytes(c.intn(3) * 2)
		out = binary.BigEndian.AppendUint32(out, uint32(len(ext)))
		out = append(out, ext...)
		for range nrows {
			k := genKey(c, kt, slots)
			row := binary.BigEndian.AppendUint16(nil, uint16(len(cols)))
			for _, col := range cols {
				var v []byte
				switch {
				case col == "k":
					v = k.bin
				case c.intn(4) == 0:
					row = binary.BigEndian.AppendUint32(row, 0xffffffff)
					continue
				default:
					v = []byte(genString(c))
				}
				row = binary.BigEndian.AppendUint32(row, uint32(len(v)))
				row = append(row, v...)
			}
			out = append(out, row...)
			rows = append(rows, genRow{string(row), k.slot, k.description})
		}
		if c.bool() {
			out = append(out, 0xff, 0xff)
		}
		return sql, out, rows
	}

	encode := func(v string) string {
		if f.format == router.CopyCSV {
			return f.encodeCSV(c, v)
		}
		return f.encodeText(c, v)
	}
	eol := "\n" // what the proxy ends a last row without a line end with: the previous line's end
	if f.header {
		var names []string
		for range cols {
			names = append(names, encode(genString(c)))
		}
		out = append(out, strings.Join(names, string(f.delim))+f.eol...)
		eol = f.eol
	}
	for i := range nrows {
		k := genKey(c, kt, slots)
		if len(k.text) == 0 && f.null == "" && f.format == router.CopyText {
			// The text format cannot tell an empty string from NULL ''.
			k = copyKeyValue{shardmap.SlotOf(shardmap.HashText([]byte("e")), slots), []byte("e"), []byte("e"), `"e"`}
		}
		var fields []string
		for _, col := range cols {
			switch {
			case col == "k":
				fields = append(fields, encode(string(k.text)))
			case c.intn(4) == 0:
				fields = append(fields, f.null)
			default:
				fields = append(fields, encode(genString(c)))
			}
		}
		line := strings.Join(fields, string(f.delim))
		lastWithoutEnd := i == nrows-1 && line != "" && c.intn(3) == 0
		if lastWithoutEnd {
			out = append(out, line...)
			rows = append(rows, genRow{line + eol, k.slot, k.description})
			break
		}
		out = append(out, line+f.eol...)
		rows = append(rows, genRow{line + f.eol, k.slot, k.description})
		eol = f.eol
		if i == nrows-1 && c.intn(3) == 0 {
			// The end-of-data marker; what follows it is ignored.
			out = append(out, `\.`...)
			if c.bool() {
				out = append(out, f.eol...)
				if c.bool() {
					out = append(out, "ignored"+f.eol...)
				}
			}
		}
	}
	return sql, out, rows
}

// genMap is a map of slots slots over a few shards, with slots dealt out as
// after resharding rather than in ranges.
func genMap(c *choices, tree string, slots int) *shardmap.Map {
	shards := 1 + c.intn(8)
	m := shardmap.NewIdentityMap("fuzz", tree, slots, shards, []string{"n1", "n2", "n3"})
	if c.bool() {
		for s := range m.Slots {
			m.Slots[s] = (s * 7919) % shards
		}
	}
	return m
}

// FuzzCopySplit generates valid COPY FROM data (text, CSV, binary) from
// random rows with tabs, line ends, backslashes, quotes, NULLs and
// multi-byte UTF-8, cuts it into CopyData messages at arbitrary points, and
// checks that splitting by shard keeps every row exactly once, unchanged,
// on the shard its key hashes to (computed from the generated key value, not
// from the data), and that the cut points change nothing.
func FuzzCopySplit(f *testing.F) {
	for _, seed := range []string{
		"", "\x00\x01\x02\x03", "\x01\x05\x00\x01\x01\x09\x02\x03abcdefghijklmnop",
		"\x02\x01\x01\x01\x01\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c",
		"\x03\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01",
		"\x04\x02\x00\x01\x00\x01\x01\x01\x01\x01\x09\x08\x07\x06\x05\x04\x03\x02\x01\x00\x10\x11\x12\x13\x14",
		"\x05\x00\x01\x01\x01\x01\x00\x01\x01\x00\x09\x0d\x0e\x0f\x10\x11\x12\x13\x14\x15\x16\x17\x18",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		c := &choices{b: in}
		kt := pick(c, shardmap.KeyText, shardmap.KeyInt, shardmap.KeyUUID)
		const slots = 4096
		sql, data, want := genCopy(c, kt, slots)
		plans, err := router.NewPlanner(0).Plan(sql, copyTrees{}, 1)
		if err != nil || len(plans) != 1 || plans[0].Kind != router.Copy {
			t.Fatalf("%s: plans %v, %v", sql, plans, err)
		}
		p := plans[0]
		m := genMap(c, p.Tree.Name, slots)
		rows, gotSlots, perShard, code := copySplit(p, m, chunk(c, data))
		if code != "" {
			t.Fatalf("%s\ndata %q: SQLSTATE %s after rows %q", sql, data, code, rows)
		}
		if len(rows) != len(want) {
			t.Fatalf("%s\ndata %q: %d rows %q, want %d", sql, data, len(rows), rows, len(want))
		}
		wantShard := map[int][]byte{}
		for i, w := range want {
			if string(rows[i]) != w.data || gotSlots[i] != w.slot {
				t.Fatalf("%s\ndata %q: row %d is %q at slot %d, want %q at slot %d (key %s)", sql, data, i, rows[i], gotSlots[i], w.data, w.slot, w.key)
			}
			sh := m.Owner(w.slot).Index
			wantShard[sh] = append(wantShard[sh], w.data...)
		}
		for sh, d := range wantShard {
			if !bytes.Equal(perShard[sh], d) {
				t.Fatalf("%s\ndata %q: shard %d got %q, want %q", sql, data, sh, perShard[sh], d)
			}
		}
		if len(perShard) != len(wantShard) {
			t.Fatalf("%s: rows on %d shards, want %d", sql, len(perShard), len(wantShard))
		}
	})
}

// copyParseStatements are the COPY statements FuzzCopyParse reads
// arbitrary data with.
var copyParseStatements = []string{
	`COPY tt FROM STDIN`,
	`COPY tt (a, k) FROM STDIN (DELIMITER '|', NULL 'nil', HEADER)`,
	`COPY ti FROM STDIN (FORMAT csv)`,
	`COPY tu (b, a, k) FROM STDIN (FORMAT csv, QUOTE '''', ESCAPE '\', HEADER)`,
	`COPY tt FROM STDIN (FORMAT csv, FORCE_NULL (k), NULL 'x')`,
	`COPY tt FROM STDIN (FORMAT csv, FORCE_NOT_NULL (k))`,
	`COPY ti (a, k) FROM STDIN (FORMAT binary)`,
	`COPY tu FROM STDIN (FORMAT binary)`,
}

// FuzzCopyParse reads arbitrary bytes as COPY FROM data: no panic, errors
// carry a SQLSTATE, the rows are the input's own bytes, and how the data is
// cut into CopyData messages changes nothing.
func FuzzCopyParse(f *testing.F) {
	f.Add(uint8(0), []byte("k1\tv\t1\nk2\\\tx\tv\r\n\\.\n"), []byte{3})
	f.Add(uint8(1), []byte("h|h\nx|key\nnil|nil\n"), []byte{1})
	f.Add(uint8(2), []byte("1,\"a\nb\",c\r\n\"2\",,\n"), []byte{2, 5})
	f.Add(uint8(3), []byte("h\n'b''',a,'k\\'\n"), []byte{0})
	f.Add(uint8(6), append(append([]byte(nil), binaryHeader...), binTuple([]byte("x"), []byte{0, 0, 0, 7})+"\xff\xff"...), []byte{1})
	f.Add(uint8(7), []byte("PGCOPY\n\xff\r\n\x00\x00\x00\x00\x00\x7f\xff\xff\xff"), []byte{0})
	f.Fuzz(func(t *testing.T, stmt uint8, data, cuts []byte) {
		sql := copyParseStatements[int(stmt)%len(copyParseStatements)]
		plans, err := router.NewPlanner(0).Plan(sql, copyTrees{}, 1)
		if err != nil || len(plans) != 1 || plans[0].Kind != router.Copy {
			t.Fatalf("%s: plans %v, %v", sql, plans, err)
		}
		p := plans[0]
		m := shardmap.NewIdentityMap("fuzz", p.Tree.Name, 64, 4, []string{"n1"})
		whole, wholeSlots, _, wholeCode := copySplit(p, m, [][]byte{data})
		cut, cutSlots, _, cutCode := copySplit(p, m, chunk(&choices{b: cuts}, data))
		if cutCode != wholeCode || fmt.Sprint(cut, cutSlots) != fmt.Sprint(whole, wholeSlots) {
			t.Fatalf("%s %q: in one message %q %v %s; cut %q %v %s", sql, data, whole, wholeSlots, wholeCode, cut, cutSlots, cutCode)
		}
		// Rows are the data's bytes, in order, except that a last row
		// without a line end gets one.
		rest := data
		for i, r := range whole {
			at := bytes.Index(rest, r)
			if at < 0 && i == len(whole)-1 && p.Copy.Format != router.CopyBinary {
				trimmed := bytes.TrimRight(r, "\r\n")
				at = bytes.Index(rest, trimmed)
				r = trimmed
			}
			if at < 0 {
				t.Fatalf("%s %q: row %d %q is not in the data after the previous row", sql, data, i, whole[i])
			}
			rest = rest[at+len(r):]
		}
	})
}
