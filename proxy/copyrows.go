package proxy

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strconv"
	"strings"

	"github.com/lattice-db/lattice/router"
	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// maxCopyRow bounds one row of COPY FROM data held by the proxy while it
// waits for the row's end, so that input without line ends cannot grow
// memory without limit.
const maxCopyRow = 64 << 20

// binarySignature starts every binary COPY stream.
var binarySignature = []byte("PGCOPY\n\377\r\n\x00")

// binaryHeader is the header the proxy sends with each binary chunk: the
// signature, no flags, no header extension.
var binaryHeader = append(append([]byte(nil), binarySignature...), 0, 0, 0, 0, 0, 0, 0, 0)

// rowParser cuts COPY FROM data into rows the way PostgreSQL 15's
// CopyReadLine does, and reads the shard key field of each row the way
// CopyReadAttributesText/CSV or the binary tuple reader do. The rows
// themselves are passed on unchanged.
type rowParser struct {
	c   *router.CopySpec
	col string // the key column's name, for error messages

	buf        []byte
	start, pos int  // the current row starts at start; pos is where scanning resumes
	inQuote    bool // CSV scanning state at pos
	lastEsc    bool
	header     bool // text/CSV: a header line is still to be skipped; binary: the header is still to be read
	done       bool // the end-of-data marker or the binary trailer was seen
	line       int64
	eol        []byte    // the line end of the last row, for a last row without one
	field      []byte    // scratch for de-escaped key values
	special    [256]bool // bytes the line scanner must look at; others are skipped fast
}

func newRowParser(c *router.CopySpec, keyCol string) *rowParser {
	p := &rowParser{c: c, col: keyCol, header: c.Header || c.Format == router.CopyBinary, eol: []byte{'\n'}}
	for _, b := range []byte{'\n', '\r', '\\'} {
		p.special[b] = true
	}
	if c.Format == router.CopyCSV {
		p.special[c.Quote], p.special[c.Escape] = true, true
	}
	return p
}

// feed adds client data, first dropping the rows already returned.
func (p *rowParser) feed(data []byte) error {
	if p.done && p.c.Format == router.CopyBinary && len(data) > 0 {
		return p.copyError(sqlstate.BadCopyFileFormat, "received copy data after EOF marker")
	}
	if p.start > 0 {
		n := copy(p.buf, p.buf[p.start:])
		p.buf = p.buf[:n]
		p.pos -= p.start
		p.start = 0
	}
	if len(p.buf) > maxCopyRow {
		return sqlstate.New(sqlstate.ProgramLimitExceeded, "a row of COPY data is longer than the %d MB the Lattice proxy accepts", maxCopyRow>>20)
	}
	p.buf = append(p.buf, data...)
	return nil
}

// adopt takes data, which the caller no longer uses, as a fresh parser's
// buffer: rows held whole (an INSERT ... SELECT's) are not copied again.
func (p *rowParser) adopt(data []byte) { p.buf = data }

// copyKey is one row's shard key field as read from the data.
type copyKey struct {
	val  []byte // text form (text/CSV) or binary value; valid until the next call
	null bool
}

// next returns the next complete row (with its line end; for binary, the
// whole tuple) and its key. ok is false when more data is needed, or, with
// final, when the data ended. A row that ends without a line end at the
// end of the data gets one.
func (p *rowParser) next(final bool) (row []byte, key copyKey, ok bool, err error) {
	for !p.done {
		var content []byte
		switch p.c.Format {
		case router.CopyBinary:
			row, key, ok, err = p.nextBinary(final)
			if err != nil || !ok {
				return nil, copyKey{}, false, err
			}
			if row == nil {
				continue // the header
			}
			return row, key, true, nil
		default:
			row, content, ok, err = p.nextLine(final)
			if err != nil || !ok {
				return nil, copyKey{}, false, err
			}
		}
		p.line++
		if p.header {
			p.header = false
			continue
		}
		if p.c.Format == router.CopyCSV {
			key, err = p.csvKey(content)
		} else {
			key, err = p.textKey(content)
		}
		if err != nil {
			return nil, copyKey{}, false, err
		}
		return row, key, true, nil
	}
	return nil, copyKey{}, false, nil
}

// nextSlot returns the next complete row, as next does, with the slot (of
// slots) its key hashes to for tree t. A NULL or malformed key is an error
// with PostgreSQL's SQLSTATE: the row cannot be placed.
func (p *rowParser) nextSlot(final bool, t *shardmap.Tree, slots int) (row []byte, slot int, ok bool, err error) {
	row, key, ok, err := p.next(final)
	if err != nil || !ok {
		return nil, 0, false, err
	}
	if key.null {
		return nil, 0, false, p.copyError(sqlstate.NotNullViolation, "null value in column \"%s\" of relation \"%s\" violates not-null constraint", t.KeyColumn, t.Name)
	}
	if p.c.Format == router.CopyBinary {
		slot, err = shardmap.SlotForBinary(t.KeyType, key.val, slots)
	} else {
		slot, err = shardmap.SlotForText(t.KeyType, key.val, slots)
	}
	if err != nil {
		code := sqlstate.InvalidTextRepresentation
		if errors.Is(err, shardmap.ErrKeyOutOfRange) {
			code = sqlstate.NumericValueOutOfRange
		}
		return nil, 0, false, p.copyError(code, "%s", keyMessage(err))
	}
	return row, slot, true, nil
}

// nextLine finds the next line of text or CSV data. content is the line
// without its end.
func (p *rowParser) nextLine(final bool) (row, content []byte, ok bool, err error) {
	buf, csv := p.buf, p.c.Format == router.CopyCSV
	quote, esc := p.c.Quote, p.c.Escape
	if esc == quote {
		esc = 0 // as CopyReadLineText: the quote alone toggles
	}
	for p.pos < len(buf) {
		if !p.special[buf[p.pos]] {
			// Plain data: nothing changes but CSV's "last was escape".
			for p.pos++; p.pos < len(buf) && !p.special[buf[p.pos]]; p.pos++ {
			}
			p.lastEsc = false
			continue
		}
		c := buf[p.pos]
		// A backslash: in text, it escapes the next byte (even a line
		// end); \. is the end-of-data marker, which CSV knows only alone
		// on its line. Nothing is changed before more data is awaited.
		if c == '\\' && (!csv || p.pos == p.start) {
			if p.pos+1 >= len(buf) && !final {
				return nil, nil, false, nil
			}
			if p.pos+1 < len(buf) && buf[p.pos+1] == '.' {
				after := p.pos + 2
				if after == len(buf) && !final || after+1 == len(buf) && buf[after] == '\r' && !final {
					return nil, nil, false, nil
				}
				if after == len(buf) || buf[after] == '\n' || buf[after] == '\r' {
					p.done = true
					if p.pos == p.start {
						return nil, nil, false, nil
					}
					// Text format: the data before \. on its line is a last row.
					content = buf[p.start:p.pos]
					return p.lastRow(content), content, true, nil
				}
				if !csv {
					return nil, nil, false, p.copyError(sqlstate.BadCopyFileFormat, "end-of-copy marker corrupt")
				}
			}
			if !csv {
				p.pos += 2
				continue
			}
		}
		if csv {
			if p.inQuote && c == esc {
				p.lastEsc = !p.lastEsc
			}
			if c == quote && !p.lastEsc {
				p.inQuote = !p.inQuote
			}
			if c != esc {
				p.lastEsc = false
			}
		}
		if (c == '\n' || c == '\r') && !(csv && p.inQuote) {
			end := p.pos + 1
			if c == '\r' {
				if end == len(buf) && !final {
					return nil, nil, false, nil // \r\n may be split across messages
				}
				if end < len(buf) && buf[end] == '\n' {
					end++
				}
			}
			row, content = buf[p.start:end], buf[p.start:p.pos]
			p.eol = append(p.eol[:0], buf[p.pos:end]...)
			p.start, p.pos = end, end
			p.lastEsc = false
			return row, content, true, nil
		}
		p.pos++
	}
	if p.pos > len(buf) {
		p.pos = len(buf)
	}
	if !final || p.start == len(buf) {
		return nil, nil, false, nil
	}
	if csv && p.inQuote {
		return nil, nil, false, p.copyError(sqlstate.BadCopyFileFormat, "unterminated CSV quoted field")
	}
	content = buf[p.start:]
	p.start, p.pos = len(buf), len(buf)
	return p.lastRow(content), content, true, nil
}

// lastRow is content with a line end, for a shard's chunk where more rows
// may follow.
func (p *rowParser) lastRow(content []byte) []byte {
	return append(append([]byte(nil), content...), p.eol...)
}

// textKey reads the key field of a text-format line: split at unescaped
// delimiters, NULL when the raw field is the NULL marker, else de-escaped.
func (p *rowParser) textKey(line []byte) (copyKey, error) {
	raw, ok := nthField(line, p.c.Delimiter, '\\', p.c.KeyIndex)
	if !ok {
		return copyKey{}, p.copyError(sqlstate.BadCopyFileFormat, "missing data for column \"%s\"", p.col)
	}
	if string(raw) == p.c.Null {
		return copyKey{null: true}, nil
	}
	p.field = unescapeText(p.field[:0], raw)
	return copyKey{val: p.field}, nil
}

// nthField returns field n of a text line, where esc (backslash) escapes
// the next byte.
func nthField(line []byte, delim, esc byte, n int) ([]byte, bool) {
	f, fs := 0, 0
	for i := 0; i < len(line); i++ {
		switch line[i] {
		case esc:
			i++
		case delim:
			if f == n {
				return line[fs:i], true
			}
			f++
			fs = i + 1
		}
	}
	if f == n {
		return line[fs:], true
	}
	return nil, false
}

// unescapeText undoes the backslash escapes of the text format.
func unescapeText(dst, raw []byte) []byte {
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		if c != '\\' || i+1 >= len(raw) {
			dst = append(dst, c)
			continue
		}
		i++
		c = raw[i]
		switch c {
		case '0', '1', '2', '3', '4', '5', '6', '7':
			v := int(c - '0')
			for k := 0; k < 2 && i+1 < len(raw) && raw[i+1] >= '0' && raw[i+1] <= '7'; k++ {
				i++
				v = v*8 + int(raw[i]-'0')
			}
			dst = append(dst, byte(v&0377))
		case 'x':
			if i+1 < len(raw) && isHex(raw[i+1]) {
				i++
				v := hexVal(raw[i])
				if i+1 < len(raw) && isHex(raw[i+1]) {
					i++
					v = v*16 + hexVal(raw[i])
				}
				dst = append(dst, byte(v))
			} else {
				dst = append(dst, 'x')
			}
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'v':
			dst = append(dst, '\v')
		default:
			dst = append(dst, c)
		}
	}
	return dst
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

func hexVal(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c-'a') + 10
	}
	return int(c-'A') + 10
}

// csvKey reads the key field of a CSV line as CopyReadAttributesCSV does,
// then applies FORCE_NOT_NULL and FORCE_NULL as NextCopyFrom does.
func (p *rowParser) csvKey(line []byte) (copyKey, error) {
	delim, quote, esc := p.c.Delimiter, p.c.Quote, p.c.Escape
	i := 0
	for f := 0; ; f++ {
		if i > len(line) {
			return copyKey{}, p.copyError(sqlstate.BadCopyFileFormat, "missing data for column \"%s\"", p.col)
		}
		start := i
		out := p.field[:0]
		sawQuote, foundDelim := false, false
	field:
		for {
			// Unquoted part.
			for {
				if i >= len(line) {
					break field
				}
				c := line[i]
				i++
				if c == delim {
					foundDelim = true
					break field
				}
				if c == quote {
					sawQuote = true
					break
				}
				out = append(out, c)
			}
			// Quoted part.
			for {
				if i >= len(line) {
					return copyKey{}, p.copyError(sqlstate.BadCopyFileFormat, "unterminated CSV quoted field")
				}
				c := line[i]
				i++
				if c == esc && i < len(line) && (line[i] == esc || line[i] == quote) {
					out = append(out, line[i])
					i++
					continue
				}
				if c == quote {
					break
				}
				out = append(out, c)
			}
		}
		p.field = out
		if f == p.c.KeyIndex {
			rawLen := i - start
			if foundDelim {
				rawLen--
			}
			null := !sawQuote && rawLen == len(p.c.Null) && string(line[start:start+rawLen]) == p.c.Null
			switch {
			case null && p.c.KeyForceNotNull:
				return copyKey{val: append(out[:0], p.c.Null...)}, nil
			case null:
				return copyKey{null: true}, nil
			case p.c.KeyForceNull && string(out) == p.c.Null:
				return copyKey{null: true}, nil
			}
			return copyKey{val: out}, nil
		}
		if !foundDelim {
			return copyKey{}, p.copyError(sqlstate.BadCopyFileFormat, "missing data for column \"%s\"", p.col)
		}
	}
}

// nextBinary reads the binary header or the next tuple. It returns a nil
// row with ok for the header.
func (p *rowParser) nextBinary(final bool) (row []byte, key copyKey, ok bool, err error) {
	buf := p.buf[p.start:]
	need := func() (bool, error) {
		if final {
			return false, p.copyError(sqlstate.BadCopyFileFormat, "unexpected EOF in COPY data")
		}
		return false, nil
	}
	if p.header {
		if len(buf) < 19 {
			if final || len(buf) >= 11 && !bytes.Equal(buf[:11], binarySignature) {
				return nil, copyKey{}, false, p.copyError(sqlstate.BadCopyFileFormat, "COPY file signature not recognized")
			}
			return nil, copyKey{}, false, nil
		}
		if !bytes.Equal(buf[:11], binarySignature) {
			return nil, copyKey{}, false, p.copyError(sqlstate.BadCopyFileFormat, "COPY file signature not recognized")
		}
		flags := binary.BigEndian.Uint32(buf[11:])
		if flags&(1<<16) != 0 {
			return nil, copyKey{}, false, p.copyError(sqlstate.BadCopyFileFormat, "invalid COPY file header (WITH OIDS)")
		}
		if flags>>16 != 0 {
			return nil, copyKey{}, false, p.copyError(sqlstate.BadCopyFileFormat, "unrecognized critical flags in COPY file header")
		}
		ext := int(int32(binary.BigEndian.Uint32(buf[15:])))
		if ext < 0 {
			return nil, copyKey{}, false, p.copyError(sqlstate.BadCopyFileFormat, "invalid COPY file header (wrong length)")
		}
		if len(buf) < 19+ext {
			if final {
				return nil, copyKey{}, false, p.copyError(sqlstate.BadCopyFileFormat, "invalid COPY file header (wrong length)")
			}
			return nil, copyKey{}, false, nil
		}
		p.header = false
		p.start += 19 + ext
		return nil, copyKey{}, true, nil
	}
	if len(buf) == 0 {
		return nil, copyKey{}, false, nil // the end without a trailer is accepted
	}
	if len(buf) < 2 {
		ok, err := need()
		return nil, copyKey{}, ok, err
	}
	n := int(int16(binary.BigEndian.Uint16(buf)))
	if n == -1 {
		p.done = true
		if len(buf) > 2 {
			return nil, copyKey{}, false, p.copyError(sqlstate.BadCopyFileFormat, "received copy data after EOF marker")
		}
		p.start += 2
		return nil, copyKey{}, false, nil
	}
	p.line++
	if want := len(p.c.Columns); n != want {
		return nil, copyKey{}, false, p.copyError(sqlstate.BadCopyFileFormat, "row field count is %d, expected %d", n, want)
	}
	at := 2
	for f := 0; f < n; f++ {
		if len(buf) < at+4 {
			p.line--
			ok, err := need()
			return nil, copyKey{}, ok, err
		}
		l := int(int32(binary.BigEndian.Uint32(buf[at:])))
		at += 4
		if l < -1 {
			return nil, copyKey{}, false, p.copyError(sqlstate.BadCopyFileFormat, "invalid field size")
		}
		if l == -1 {
			if f == p.c.KeyIndex {
				key = copyKey{null: true}
			}
			continue
		}
		if len(buf) < at+l {
			p.line--
			ok, err := need()
			return nil, copyKey{}, ok, err
		}
		if f == p.c.KeyIndex {
			key = copyKey{val: buf[at : at+l]}
		}
		at += l
	}
	p.start += at
	return buf[:at], key, true, nil
}

// copyError is an error about the data, with PostgreSQL's COPY context.
func (p *rowParser) copyError(code, format string, args ...any) *sqlstate.Error {
	e := sqlstate.New(code, format, args...)
	e.Where = "COPY, line " + strconv.FormatInt(p.line+1, 10)
	return e
}

// appendCopyText appends a row in COPY's text format: tab-separated, \N
// for NULL, backslash escapes for what would end a field or a line.
func appendCopyText(dst []byte, values [][]byte) []byte {
	for i, v := range values {
		if i > 0 {
			dst = append(dst, '\t')
		}
		if v == nil {
			dst = append(dst, '\\', 'N')
			continue
		}
		for _, b := range v {
			switch b {
			case '\\':
				dst = append(dst, '\\', '\\')
			case '\t':
				dst = append(dst, '\\', 't')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			default:
				dst = append(dst, b)
			}
		}
	}
	return append(dst, '\n')
}

// copyTextValues turns rows in COPY's text format, as appendCopyText
// writes them, into a VALUES list of string literals, which INSERT
// coerces to the columns' types as it would the SELECT's text.
func copyTextValues(rows []byte) string {
	var b strings.Builder
	b.Grow(len(rows) + len(rows)/4)
	for len(rows) > 0 {
		end := bytes.IndexByte(rows, '\n')
		line := rows[:end]
		rows = rows[end+1:]
		if b.Len() > 0 {
			b.WriteString(", ")
		}
		b.WriteByte('(')
		for i, f := range bytes.Split(line, []byte{'\t'}) {
			if i > 0 {
				b.WriteString(", ")
			}
			if string(f) == `\N` {
				b.WriteString("NULL")
				continue
			}
			b.WriteString("E'")
			for j := 0; j < len(f); j++ {
				switch c := f[j]; {
				case c == '\\' && j+1 < len(f):
					j++
					switch f[j] {
					case 't':
						b.WriteString(`\t`)
					case 'n':
						b.WriteString(`\n`)
					case 'r':
						b.WriteString(`\r`)
					default:
						b.WriteString(`\\`)
					}
				case c == '\'':
					b.WriteString("''")
				default:
					b.WriteByte(c)
				}
			}
			b.WriteByte('\'')
		}
		b.WriteByte(')')
	}
	return b.String()
}
