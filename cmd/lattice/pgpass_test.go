package main

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
)

// TestCheckPgPass: a --pgpass file that cannot be read stops the proxy at
// start, where pgconn would ignore it and every node would refuse the login.
func TestCheckPgPass(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	dir := t.TempDir()
	good := filepath.Join(dir, "pgpass")
	if err := os.WriteFile(good, []byte("h:5432:*:lattice:pw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := checkPgPass(good, log); err != nil {
		t.Fatalf("a readable file: %v", err)
	}
	if err := checkPgPass(filepath.Join(dir, "missing"), log); err == nil {
		t.Fatal("a missing file was accepted")
	}
}
