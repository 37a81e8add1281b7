package router

import (
	"os"
	"strings"
	"testing"
)

// TestComposeGolden plans the statements of testdata/compose.txt (blocks
// separated by blank lines, # lines are comments) and compares the plans
// with testdata/compose.golden; -update rewrites it.
func TestComposeGolden(t *testing.T) {
	data, err := os.ReadFile("testdata/compose.txt")
	if err != nil {
		t.Fatal(err)
	}
	p := NewPlanner(100)
	var b strings.Builder
	for _, block := range strings.Split(string(data), "\n\n") {
		var lines []string
		for _, l := range strings.Split(block, "\n") {
			if l != "" && !strings.HasPrefix(l, "#") {
				lines = append(lines, l)
			}
		}
		if len(lines) > 0 {
			b.WriteString(describe(p, strings.Join(lines, "\n")) + "\n")
		}
	}
	got := b.String()
	const path = "testdata/compose.golden"
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./router -run TestComposeGolden -update)", err)
	}
	if got != string(want) {
		wl, gl := strings.Split(string(want), "\n"), strings.Split(got, "\n")
		for i := range max(len(wl), len(gl)) {
			var w, g string
			if i < len(wl) {
				w = wl[i]
			}
			if i < len(gl) {
				g = gl[i]
			}
			if w != g {
				t.Fatalf("golden mismatch at line %d:\nwant: %s\ngot:  %s\n(run with -update to accept)", i+1, w, g)
			}
		}
	}
}
