package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDemoDataDirOutsideClosedFolder: run as root from a folder that
// PostgreSQL's user cannot enter (a clone in /root), the demo's default data
// folder moves under the temp dir; a --data value is always kept.
func TestDemoDataDirOutsideClosedFolder(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: only then does PostgreSQL run as another user")
	}
	closed := filepath.Join(t.TempDir(), "home")
	if err := os.MkdirAll(filepath.Join(closed, "clone"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(closed, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Chdir(filepath.Join(closed, "clone"))

	dir, err := demoDataDir("")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(dir, os.TempDir()+string(filepath.Separator)+"lattice-demo-") {
		t.Fatalf("default data dir from a closed folder = %s, want one under %s", dir, os.TempDir())
	}
	again, _ := demoDataDir("")
	if again != dir {
		t.Fatalf("a second run picks %s, the first %s", again, dir)
	}
	given, err := demoDataDir("mine")
	if err != nil || given != filepath.Join(closed, "clone", "mine") {
		t.Fatalf("--data mine = %s, %v", given, err)
	}
}
