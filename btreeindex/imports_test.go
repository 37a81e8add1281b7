package btreeindex

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestImports holds the dependency rule of docs/DESIGN.md section 9: of
// Lattice's packages btreeindex imports only shardmap and the bottom
// package sqlstate, so router, pgshard, the proxy and the migrator can all
// import it and it never imports them.
func TestImports(t *testing.T) {
	const module = "github.com/lattice-db/lattice/"
	allowed := map[string]bool{module + "shardmap": true, module + "sqlstate": true}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if strings.HasPrefix(path, module) && !allowed[path] {
				t.Errorf("%s imports %s: btreeindex may import only shardmap and sqlstate of Lattice's packages", name, path)
			}
		}
	}
}
