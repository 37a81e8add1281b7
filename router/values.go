package router

import (
	"strconv"
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"

	"github.com/lattice-db/lattice/shardmap"
)

// litKind is the lexical kind of a constant.
type litKind int

const (
	litParam litKind = iota
	litInt
	litNumeric // a FCONST: 1.5, 1e3, or an integer too large for int4
	litString
	litBool
	litBits
	litNull
)

func (k litKind) describe() string {
	switch k {
	case litInt:
		return "an integer"
	case litNumeric:
		return "a numeric constant"
	case litString:
		return "a string"
	case litBool:
		return "a boolean"
	case litBits:
		return "a bit string"
	case litNull:
		return "NULL"
	}
	return "a parameter"
}

// constant is a constant operand: A_Const, ParamRef, or one of those under
// one TypeCast.
type constant struct {
	kind  litKind
	text  string // literal text (sval, ival in decimal, fval as written)
	param int
	cast  *pg.TypeName // nil when there is no cast
	loc   int32        // location of the constant (or parameter) token
}

// asConstant recognises the operand forms a shard key may be given as.
func asConstant(n *pg.Node) (constant, bool) {
	if n == nil {
		return constant{}, false
	}
	if tc := n.GetTypeCast(); tc != nil {
		c, ok := bareConstant(tc.Arg)
		c.cast = tc.TypeName
		return c, ok
	}
	return bareConstant(n)
}

func bareConstant(n *pg.Node) (constant, bool) {
	if n == nil {
		return constant{}, false
	}
	if p := n.GetParamRef(); p != nil {
		return constant{kind: litParam, param: int(p.Number), loc: p.Location}, p.Number > 0
	}
	a := n.GetAConst()
	if a == nil {
		return constant{}, false
	}
	c := constant{loc: a.Location}
	switch {
	case a.Isnull:
		c.kind = litNull
	case a.GetIval() != nil:
		c.kind, c.text = litInt, strconv.FormatInt(int64(a.GetIval().Ival), 10)
	case a.GetFval() != nil:
		c.kind, c.text = litNumeric, a.GetFval().Fval
	case a.GetSval() != nil:
		c.kind, c.text = litString, a.GetSval().Sval
	case a.GetBoolval() != nil:
		c.kind = litBool
		c.text = "false"
		if a.GetBoolval().Boolval {
			c.text = "true"
		}
	case a.GetBsval() != nil:
		c.kind, c.text = litBits, a.GetBsval().Bsval
	default:
		return constant{}, false
	}
	return c, true
}

// value is the constant as a function argument: no normalisation.
func (c constant) value() Value {
	switch c.kind {
	case litParam:
		return Value{Param: c.param}
	case litNull:
		return Value{Null: true}
	}
	return Value{Text: c.text}
}

// typeName returns the unqualified name of a cast's type when it is a
// plain built-in type name (no schema other than pg_catalog, no type
// modifier, no array bounds); "" otherwise.
func typeName(t *pg.TypeName) string {
	if t == nil || t.Setof || t.PctType || len(t.Typmods) > 0 || len(t.ArrayBounds) > 0 || t.Typemod != -1 && t.Typemod != 0 {
		return ""
	}
	switch len(t.Names) {
	case 1:
		return t.Names[0].GetString_().GetSval()
	case 2:
		if t.Names[0].GetString_().GetSval() == "pg_catalog" {
			return t.Names[1].GetString_().GetSval()
		}
	}
	return ""
}

func typeNameText(t *pg.TypeName) string {
	parts := make([]string, 0, len(t.Names))
	for i, n := range t.Names {
		if s := n.GetString_().GetSval(); i > 0 || s != "pg_catalog" || len(t.Names) == 1 {
			parts = append(parts, s)
		}
	}
	s := strings.Join(parts, ".")
	if len(t.Typmods) > 0 {
		s += "(...)"
	}
	if len(t.ArrayBounds) > 0 {
		s += "[]"
	}
	return s
}

// keyTypes are the casts that keep a key comparing exactly as the column
// does: a cast to anything else (numeric, citext, char(n), varchar(n) ...)
// can make a row equal to a value that hashes to another slot.
var keyTypes = map[shardmap.KeyType]map[string]bool{
	shardmap.KeyText: {"text": true, "varchar": true},
	shardmap.KeyInt:  {"int2": true, "int4": true, "int8": true},
	shardmap.KeyUUID: {"uuid": true},
}

var keyLiteralWord = map[shardmap.KeyType]string{
	shardmap.KeyText: "a string literal",
	shardmap.KeyInt:  "an integer literal",
	shardmap.KeyUUID: "a uuid string literal",
}

var keyTypeWord = map[shardmap.KeyType]string{
	shardmap.KeyText: "text",
	shardmap.KeyInt:  "integer",
	shardmap.KeyUUID: "uuid",
}

// keyValue checks a constant given for the shard key of tree and returns it
// in normalized text form. The message of a returned error completes
// "<statement> on tree X: ...".
func keyValue(tree *shardmap.Tree, c constant) (Value, string) {
	if c.cast != nil {
		if t := typeName(c.cast); !keyTypes[tree.KeyType][t] {
			return Value{}, "the shard key " + qn(tree.KeyColumn) + " is compared with a value cast to " + typeNameText(c.cast) +
				", which may not compare the way the " + keyTypeWord[tree.KeyType] + " key hashes: remove the cast"
		}
	}
	switch c.kind {
	case litParam:
		return Value{Param: c.param}, ""
	case litNull:
		return Value{Null: true}, ""
	}
	bad := func() (Value, string) {
		lit := shorten(c.text)
		if c.kind == litString {
			lit = quoteLiteral(lit)
		}
		return Value{}, "the shard key " + qn(tree.KeyColumn) + " (" + keyTypeWord[tree.KeyType] + ") is given " + c.kind.describe() +
			" (" + lit + "): give it as " + keyLiteralWord[tree.KeyType] + " or a $n parameter"
	}
	switch tree.KeyType {
	case shardmap.KeyText:
		if c.kind == litString {
			return Value{Text: c.text}, ""
		}
	case shardmap.KeyInt:
		switch c.kind {
		case litInt:
			return Value{Text: c.text}, ""
		case litNumeric, litString:
			// A FCONST that is an integer is typed int8 by PostgreSQL; a
			// string is read by int8in. Anything else (1.5, 1e3) is numeric.
			s := c.text
			if c.kind == litString {
				s = strings.Trim(s, " \t\n\r\v\f")
			}
			if v, ok := parsePgInt(s); ok {
				return Value{Text: strconv.FormatInt(v, 10)}, ""
			}
		}
	case shardmap.KeyUUID:
		if c.kind == litString {
			if u, ok := parseUUID(c.text); ok {
				return Value{Text: u}, ""
			}
		}
	}
	return bad()
}

func shorten(s string) string {
	if len(s) > 40 {
		s = s[:40] + "..."
	}
	return s
}

// parsePgInt reads an integer the way PostgreSQL 16+ reads integer
// literals and int8 input: an optional sign, then decimal digits, or
// 0x/0o/0b and digits of that base, with single underscores between
// digits. It reports false for anything else or a value out of int64.
func parsePgInt(s string) (int64, bool) {
	neg := false
	if s != "" && (s[0] == '+' || s[0] == '-') {
		neg = s[0] == '-'
		s = s[1:]
	}
	base := 10
	if len(s) > 2 && s[0] == '0' {
		switch s[1] {
		case 'x', 'X':
			base = 16
		case 'o', 'O':
			base = 8
		case 'b', 'B':
			base = 2
		}
		if base != 10 {
			s = s[2:]
		}
	}
	if s == "" || s[0] == '_' || s[len(s)-1] == '_' || strings.Contains(s, "__") {
		return 0, false
	}
	digits := strings.ReplaceAll(s, "_", "")
	for i := 0; i < len(digits); i++ {
		if !isDigitOf(digits[i], base) {
			return 0, false
		}
	}
	if neg {
		digits = "-" + digits
	}
	v, err := strconv.ParseInt(digits, base, 64)
	return v, err == nil
}

func isDigitOf(c byte, base int) bool {
	switch base {
	case 2:
		return c == '0' || c == '1'
	case 8:
		return c >= '0' && c <= '7'
	case 16:
		return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
	}
	return c >= '0' && c <= '9'
}

// parseUUID reads a uuid the way PostgreSQL's uuid_in does (32 hex digits,
// optionally in braces, with a hyphen allowed after any group of four) and
// returns its canonical form.
func parseUUID(s string) (string, bool) {
	braces := false
	if strings.HasPrefix(s, "{") {
		braces = true
		s = s[1:]
	}
	var out [36]byte
	o := 0
	for i := 0; i < 16; i++ {
		if len(s) < 2 || !isDigitOf(s[0], 16) || !isDigitOf(s[1], 16) {
			return "", false
		}
		if i == 4 || i == 6 || i == 8 || i == 10 {
			out[o] = '-'
			o++
		}
		out[o], out[o+1] = lower(s[0]), lower(s[1])
		o += 2
		s = s[2:]
		if i%2 == 1 && i < 15 && s != "" && s[0] == '-' {
			s = s[1:]
		}
	}
	if braces {
		if !strings.HasPrefix(s, "}") {
			return "", false
		}
		s = s[1:]
	}
	if s != "" {
		return "", false
	}
	return string(out[:]), true
}

func lower(c byte) byte {
	if c >= 'A' && c <= 'F' {
		return c + 'a' - 'A'
	}
	return c
}
