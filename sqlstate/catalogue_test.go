package sqlstate

import (
	"go/ast"
	"go/parser"
	"go/token"
	"strconv"
	"strings"
	"testing"
)

// classes are the SQLSTATE classes of PostgreSQL's errcodes.txt, and LT,
// Lattice's own. A five-character literal of one of these classes is taken
// for a SQLSTATE; "BEGIN", "10000" or "POSIX" are not.
var classes = map[string]bool{
	"00": true, "01": true, "02": true, "03": true, "08": true, "09": true, "0A": true, "0B": true,
	"0F": true, "0L": true, "0P": true, "0Z": true, "20": true, "21": true, "22": true, "23": true,
	"24": true, "25": true, "26": true, "27": true, "28": true, "2B": true, "2D": true, "2F": true,
	"34": true, "38": true, "39": true, "3B": true, "3D": true, "3F": true, "40": true, "42": true,
	"44": true, "53": true, "54": true, "55": true, "57": true, "58": true, "72": true, "F0": true,
	"HV": true, "P0": true, "XX": true, "LT": true,
}

func looksLikeCode(s string) bool {
	if len(s) != 5 || !classes[s[:2]] {
		return false
	}
	for i := range len(s) {
		if c := s[i]; !('0' <= c && c <= '9' || 'A' <= c && c <= 'Z') {
			return false
		}
	}
	return true
}

// TestCatalogue checks every constant of codes.go is a well-formed SQLSTATE
// and that no two names share a code.
func TestCatalogue(t *testing.T) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "codes.go", nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	byCode := map[string]string{}
	for _, decl := range f.Decls {
		gd, ok := decl.(*ast.GenDecl)
		if !ok || gd.Tok != token.CONST {
			continue
		}
		for _, spec := range gd.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, name := range vs.Names {
				lit, ok := vs.Values[i].(*ast.BasicLit)
				if !ok {
					t.Errorf("%s: not a string literal", name.Name)
					continue
				}
				code, _ := strconv.Unquote(lit.Value)
				if !looksLikeCode(code) {
					t.Errorf("%s = %q: not a SQLSTATE of a known class", name.Name, code)
				}
				if other, dup := byCode[code]; dup {
					t.Errorf("%s and %s are both %s", other, name.Name, code)
				}
				byCode[code] = name.Name
				if vs.Doc == nil || !strings.HasPrefix(vs.Doc.Text(), name.Name+":") {
					t.Errorf("%s: want a comment \"%s: when Lattice sends it\"", name.Name, name.Name)
				}
			}
		}
	}
	if len(byCode) < 40 {
		t.Errorf("found %d codes in codes.go, expected the whole catalogue", len(byCode))
	}
}

func TestLooksLikeCode(t *testing.T) {
	for s, want := range map[string]bool{
		"0A000": true, "22P04": true, "LT001": true, "XX000": true, "P0001": true, "57P03": true,
		"BEGIN": false, "RESET": false, "POSIX": false, "10000": false, "65536": false,
		"0a000": false, "0A00": false, "0A0000": false, "ERROR": false,
	} {
		if got := looksLikeCode(s); got != want {
			t.Errorf("looksLikeCode(%q) = %v, want %v", s, got, want)
		}
	}
}
