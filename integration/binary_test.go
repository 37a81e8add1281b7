package integration

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// raceProxyTests run the proxy built with the race detector: the tests in
// which it serves several clients at once while a migration, a second
// proxy, a cancel, a fault or a limit works beside them, where a data race
// in the proxy would show. The other tests run it without: a race build
// costs 6 to 8 times the CPU for statements planned in full (pg_query's
// tree walked through protobuf reflection, 5 ms a fan-out planned), which
// took `make test` past 25 minutes on 2 cores, while those tests drive one
// session at a time. LATTICE_TEST_RACE=all races the proxy in every test,
// LATTICE_TEST_RACE=0 in none (the benchmarks).
var raceProxyTests = map[string]bool{
	// clients through a reshard, a move or a snapshot
	"TestReshardUnderLoad":           true,
	"TestReshardUnderLoadTwoProxies": true,
	"TestScaleOut":                   true,
	"TestGroupReshardUnderLoad":      true,
	"TestSnapshotUnderLoad":          true,
	"TestPgbenchTPCBThroughReshard":  true,
	"TestAutonomicSkewedLoad":        true,
	// statements held, retried or let through at a freeze
	"TestHoldFrozen":                   true,
	"TestFreezeWaitsOnlyForItsSlots":   true,
	"TestStaleExtendedRetry":           true,
	"TestCreateTreeWaitsForWriters":    true,
	"TestCreateTreeRetriesStaleWrites": true,
	// faults while clients work
	"TestProxyKilledDuringFreeze": true,
	"TestRedisCrashMidReshard":    true,
	"TestProxyCutOffFromRedis":    true,
	"TestNodeDown":                true,
	// sessions against each other: cancels, limits, pins, DDL, shutdown
	"TestCancelStaysInItsSession":     true,
	"TestCancelBeforeTheBackendHasIt": true,
	"TestDoS":                         true,
	"TestPgbench":                     true,
	"TestPinTempTable":                true,
	"TestDDLConcurrent":               true,
	"TestEnsureTenantConcurrent":      true,
	"TestReferenceDDLUnawareProxy":    true,
	"TestShutdownCutsStuckBackend":    true,
}

// latticeBuild is one build of ./cmd/lattice, made once per package run on
// first use, so that tests which do not need it run even if it fails.
type latticeBuild struct {
	once sync.Once
	path string
	err  error
}

// latticeBinary is the proxy binary for t: race-built for the tests in
// raceProxyTests. LATTICE_TEST_BINARY and LATTICE_TEST_RACE_BINARY name
// builds made already (scripts/test.sh builds each once for its parts,
// which would otherwise each link their own).
func latticeBinary(t testing.TB) string {
	t.Helper()
	b, env, race := &harness.plain, "LATTICE_TEST_BINARY", raceProxy(t.Name())
	if race {
		b, env = &harness.race, "LATTICE_TEST_RACE_BINARY"
	}
	b.once.Do(func() {
		if bin := os.Getenv(env); bin != "" {
			b.path = bin
			return
		}
		b.path, b.err = buildLattice(race)
	})
	if b.err != nil {
		t.Fatalf("lattice binary unavailable: %v", b.err)
	}
	return b.path
}

func raceProxy(testName string) bool {
	switch os.Getenv("LATTICE_TEST_RACE") {
	case "0":
		return false
	case "all":
		return true
	}
	top, _, _ := strings.Cut(testName, "/")
	return raceProxyTests[top]
}

func buildLattice(race bool) (string, error) {
	start := time.Now()
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	out, args := filepath.Join(harness.dir, "lattice"), []string{"build"}
	if race {
		out, args = out+"-race", append(args, "-race")
	}
	args = append(args, "-o", out, "./cmd/lattice")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goTool(), args...)
	cmd.Dir = root
	var buf bytes.Buffer
	cmd.Stdout = &buf
	cmd.Stderr = &buf
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go %v: %w\n%s", args, err, buf.String())
	}
	slog.Info("integration: built lattice", "binary", out, "took", time.Since(start).Round(time.Millisecond))
	return out, nil
}

// TestRaceProxyTestsExist keeps raceProxyTests true to the tests: a
// renamed test would otherwise lose its race-built proxy unseen.
func TestRaceProxyTestsExist(t *testing.T) {
	files, err := filepath.Glob("*_test.go")
	if err != nil {
		t.Fatal(err)
	}
	var src strings.Builder
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		src.Write(b)
	}
	for name := range raceProxyTests {
		if !strings.Contains(src.String(), "\nfunc "+name+"(t *testing.T)") {
			t.Errorf("raceProxyTests names %s, which is no test of this package", name)
		}
	}
}

// TestRaceProxyChoice checks which tests get the race-built proxy: those
// listed, their subtests too, and every test or none as LATTICE_TEST_RACE
// says.
func TestRaceProxyChoice(t *testing.T) {
	for _, c := range []struct {
		env, test string
		want      bool
	}{
		{"", "TestDoS", true},
		{"", "TestDoS/oversize_bind", true},
		{"", "TestFanOut", false},
		{"", "TestFanOut/TestDoS", false},
		{"", "BenchmarkPipeline", false},
		{"0", "TestDoS", false},
		{"all", "TestFanOut", true},
	} {
		t.Setenv("LATTICE_TEST_RACE", c.env)
		if got := raceProxy(c.test); got != c.want {
			t.Errorf("LATTICE_TEST_RACE=%q: raceProxy(%q) = %v, want %v", c.env, c.test, got, c.want)
		}
	}
}
