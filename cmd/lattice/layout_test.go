package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestLayout holds the code to the dependency arrows of docs/DESIGN.md
// section 9: every package of the module is named there, and imports only
// the packages its line allows (sqlstate, the bottom, is allowed to all).
// A new package or a new import between packages changes the design, and
// the design's arrows change with it.
func TestLayout(t *testing.T) {
	const module = "github.com/lattice-db/lattice/"
	design, err := os.ReadFile("../../docs/DESIGN.md")
	if err != nil {
		t.Fatal(err)
	}
	allowed := arrows(t, string(design))
	used := map[string]bool{} // "pkg dep"
	cmd := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, "./...")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg := strings.TrimPrefix(fields[0], module)
		may, named := allowed[pkg]
		if !named && pkg != "sqlstate" && len(fields) > 1 {
			t.Errorf("package %s is not in docs/DESIGN.md section 9's arrows", pkg)
			continue
		}
		for _, imp := range fields[1:] {
			dep, ours := strings.CutPrefix(imp, module)
			if !ours || dep == "sqlstate" || (pkg == "sqlstate" && dep == "secret") {
				continue
			}
			if !may[dep] {
				t.Errorf("%s imports %s, an arrow docs/DESIGN.md section 9 does not have", pkg, dep)
			}
			used[pkg+" "+dep] = true
		}
	}
	// An arrow no import follows says the design is wider than the code.
	for pkg, may := range allowed {
		for dep := range may {
			if !used[pkg+" "+dep] {
				t.Errorf("docs/DESIGN.md section 9 has %s ─> %s, but %s does not import %s", pkg, dep, pkg, dep)
			}
		}
	}
}

// arrows reads the fenced block of lines "a, b ─> c, d" (or "─> nothing
// else of ours") after section 9's "Dependencies point one way".
func arrows(t *testing.T, design string) map[string]map[string]bool {
	_, rest, ok := strings.Cut(design, "Dependencies point one way")
	if !ok {
		t.Fatal("docs/DESIGN.md has no dependency arrows")
	}
	_, rest, _ = strings.Cut(rest, "```\n")
	block, _, ok := strings.Cut(rest, "```")
	if !ok {
		t.Fatal("docs/DESIGN.md's dependency arrows are not a fenced block")
	}
	allowed := map[string]map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(block), "\n") {
		from, to, ok := strings.Cut(line, "─>")
		if !ok {
			t.Fatalf("arrow line without ─>: %q", line)
		}
		may := map[string]bool{}
		if to = strings.TrimSpace(to); to != "nothing else of ours" {
			for _, dep := range strings.Split(to, ",") {
				may[strings.TrimSpace(dep)] = true
			}
		}
		for _, pkg := range strings.Split(from, ",") {
			pkg = strings.TrimSpace(pkg)
			if _, twice := allowed[pkg]; twice {
				t.Errorf("docs/DESIGN.md section 9 names %s on two arrow lines", pkg)
			}
			allowed[pkg] = may
		}
	}
	return allowed
}
