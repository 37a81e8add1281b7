package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/lattice-db/lattice/pgshard"
)

// TestPgxSuite runs pgx's own tests (its root package, pgconn, pgtype and
// pgxpool) on plain PostgreSQL and through the proxy over ordinary tables,
// and fails on a test that fails only through the proxy, unless
// testdata/pgx-pooling.txt lists it as one no transaction-pooling proxy can
// pass, with the reason. Both runs use the tenant's role, as the proxy runs
// every client session as that role: a test that needs more (a superuser,
// pg_terminate_backend) fails on both, and objects one run leaves behind
// belong to the role the other run drops them as. Opt-in, as it takes many
// minutes:
//
//	LATTICE_PGX_SUITE=1 go test -count=1 -timeout 60m -run TestPgxSuite ./integration
//
// LATTICE_PGX_SUITE_RUN narrows it with a -run pattern.
func TestPgxSuite(t *testing.T) {
	if os.Getenv("LATTICE_PGX_SUITE") != "1" {
		t.Skip("set LATTICE_PGX_SUITE=1 to run pgx's test suite through the proxy")
	}
	resetNodes(t)
	ctx := context.Background()
	direct := connect(t, testNodeDSN(t, 0))
	for _, q := range []string{
		`CREATE EXTENSION IF NOT EXISTS hstore`,
		`CREATE EXTENSION IF NOT EXISTS ltree`,
		`DO $$ BEGIN CREATE DOMAIN uint64 AS numeric(20,0); EXCEPTION WHEN duplicate_object THEN NULL; END $$`,
		`DO $$ BEGIN CREATE USER " tricky, ' } "" \\ test user " SUPERUSER; EXCEPTION WHEN duplicate_object THEN NULL; END $$`,
	} {
		if _, err := direct.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	p := startProxy(t, 1, "--pool-size", "40")
	// The first session of the tenant makes its role.
	connect(t, p.DSN("lattice"))
	role := pgshard.TenantRole("lattice")
	src := pgxSource(t)
	pkgs := []string{".", "./pgconn", "./pgtype", "./pgxpool"}
	onPostgres := runPgxSuite(t, src, asUser(t, testNodeDSN(t, 0), role), pkgs)
	onLattice := runPgxSuite(t, src, asUser(t, p.DSN("lattice"), role), pkgs)
	known := knownPoolingFailures(t)
	var unexpected []string
	for name, out := range onLattice {
		if _, ok := onPostgres[name]; ok {
			continue
		}
		if _, ok := known[name]; ok {
			continue
		}
		unexpected = append(unexpected, name)
		t.Logf("%s fails only through Lattice:\n%s", name, out)
	}
	sort.Strings(unexpected)
	if len(unexpected) > 0 {
		t.Fatalf("%d pgx tests fail only through Lattice: %s", len(unexpected), strings.Join(unexpected, ", "))
	}
}

// asUser is dsn with user as its user.
func asUser(t *testing.T, dsn, user string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(user)
	return u.String()
}

// pgxSource copies the pgx module the repository uses into a writable dir.
func pgxSource(t *testing.T) string {
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(goTool(), "list", "-m", "-f", "{{.Dir}}", "github.com/jackc/pgx/v5")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "pgx")
	if out, err := exec.Command("cp", "-r", strings.TrimSpace(string(out)), dst).CombinedOutput(); err != nil {
		t.Fatalf("copy pgx: %v %s", err, out)
	}
	if out, err := exec.Command("chmod", "-R", "u+w", dst).CombinedOutput(); err != nil {
		t.Fatalf("chmod: %v %s", err, out)
	}
	return dst
}

// runPgxSuite returns the failing tests ("pkg Test/sub") with their output.
func runPgxSuite(t *testing.T, dir, dsn string, pkgs []string) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	args := append([]string{"test", "-count=1", "-p", "1", "-json"}, pkgs...)
	if run := os.Getenv("LATTICE_PGX_SUITE_RUN"); run != "" {
		args = append(args, "-run", run)
	}
	cmd := exec.CommandContext(ctx, goTool(), args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PGX_TEST_DATABASE="+dsn)
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stdout
	_ = cmd.Run() // a failing test fails go test; the events say which
	outputs := map[string]*strings.Builder{}
	failed := map[string]string{}
	passed := 0
	sc := bufio.NewScanner(&stdout)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var e struct{ Action, Package, Test, Output string }
		if json.Unmarshal(sc.Bytes(), &e) != nil || e.Test == "" {
			continue
		}
		pkg := strings.TrimPrefix(strings.TrimPrefix(e.Package, "github.com/jackc/pgx/v5"), "/")
		if pkg == "" {
			pkg = "pgx"
		}
		name := pkg + " " + e.Test
		switch e.Action {
		case "output":
			if outputs[name] == nil {
				outputs[name] = &strings.Builder{}
			}
			outputs[name].WriteString(e.Output)
		case "fail":
			failed[name] = ""
			if b := outputs[name]; b != nil {
				failed[name] = b.String()
			}
		case "pass":
			passed++
		}
	}
	t.Logf("pgx suite against %s: %d passed, %d failed", dsn, passed, len(failed))
	return failed
}

// knownPoolingFailures reads testdata/pgx-pooling.txt: "pkg Test  # reason".
func knownPoolingFailures(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "pgx-pooling.txt"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		name, reason, _ := strings.Cut(line, "#")
		if name = strings.TrimSpace(name); name != "" {
			out[name] = strings.TrimSpace(reason)
		}
	}
	return out
}
