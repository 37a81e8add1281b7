package integration

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/lib/pq"
)

// The driver matrix: each client connects through the proxy to 3 nodes and
// a tree of 16 shards, prepares statements (server-side where the driver
// can), runs a single-shard transaction, fan-outs without the key, a unique
// violation whose SQLSTATE must reach the driver, and COPY where the client
// has it. Clients other than Go are small programs under
// testdata/drivers/ that print key=value lines; each key is a subtest, so a
// failure names the step.

const driversDir = "testdata/drivers"

// nodePgVersion is the node-postgres version scripts/ensure-tools.sh installs.
const nodePgVersion = "8.16.3"

type driverStep struct{ key, want string }

// driverSteps is what every client must print. copy_in and copy_out are
// left out by clients without COPY.
var driverSteps = []driverStep{
	{"insert", "20"},
	{"select", "name-7"},
	{"tx", "tx-5"},
	{"fanout", "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20"},
	{"fanout_param", "1,5,9,13,17"},
	{"unique", "23505"},
	{"after_error", "name-1"},
	{"copy_in", "3"},
	{"copy_out", "23"},
}

// Steps some clients take besides driverSteps: a fan-out read in batches
// of 7 (an Execute with a row limit), a large object written and read back
// by fastpath calls, and fan-outs read through named cursors (DECLARE and
// FETCH), in a transaction and WITH HOLD.
var (
	fetchSizeStep   = driverStep{"fetch_size", "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20"}
	largeObjectStep = driverStep{"large_object", "hello"}
	namedCursorStep = driverStep{"named_cursor", "20,16,12,8,4,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20"}
)

func stepsWithout(keys ...string) []driverStep {
	return slices.DeleteFunc(slices.Clone(driverSteps), func(s driverStep) bool { return slices.Contains(keys, s.key) })
}

// driverTree starts a proxy over 3 nodes and creates the empty tree drv of
// 16 shards that every client fills.
func driverTree(t *testing.T) *proxyProc {
	t.Helper()
	resetNodes(t)
	p := startProxy(t, 3)
	c := connect(t, p.DSN("lattice"))
	mustExec(t, c, `CREATE TABLE drv (id bigint PRIMARY KEY, grp integer NOT NULL, name text NOT NULL)`)
	mustExec(t, c, `SELECT lattice_create_tree('drv', 'id', shard_count => 16)`)
	return p
}

// requireClient fails (never skips) when a client is missing: CI installs
// all of them, and a silent skip would hide a broken setup.
func requireClient(t *testing.T, present bool, what, install string) {
	t.Helper()
	if !present {
		t.Fatalf("%s is not installed; install it with: %s (scripts/ensure-tools.sh, run by `make test` as root, does this)", what, install)
	}
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func onPath(name string) bool {
	_, err := exec.LookPath(name)
	return err == nil
}

// runClient runs a client program and returns its key=value lines. A
// failing program is reported, and the steps it printed are still checked.
func runClient(t *testing.T, cmd *exec.Cmd) map[string]string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Errorf("%s: %v\n--- stdout ---\n%s--- stderr ---\n%s", strings.Join(cmd.Args, " "), err, stdout.String(), stderr.String())
	}
	got := map[string]string{}
	sc := bufio.NewScanner(&stdout)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			got[k] = v
		}
	}
	return got
}

func checkSteps(t *testing.T, got map[string]string, steps []driverStep) {
	t.Helper()
	for _, st := range steps {
		t.Run(st.key, func(t *testing.T) {
			v, ok := got[st.key]
			if !ok {
				t.Fatalf("the client printed no %s", st.key)
			}
			if v != st.want {
				t.Fatalf("%s = %q, want %q", st.key, v, st.want)
			}
		})
	}
}

func clientContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func TestDriverPsql(t *testing.T) {
	requireClient(t, onPath("psql"), "psql", "apt-get install -y postgresql-client-15")
	p := driverTree(t)
	ctx := clientContext(t)
	psql := func(t *testing.T, script string) string {
		cmd := exec.CommandContext(ctx, "psql", "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-d", p.DSN("lattice"), "-f", filepath.Join(driversDir, "psql", script))
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("psql -f %s: %v\n--- stdout ---\n%s--- stderr ---\n%s", script, err, out, stderr.String())
		}
		return string(out)
	}
	want := func(t *testing.T, name string) string {
		b, err := os.ReadFile(filepath.Join(driversDir, "psql", name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	t.Run("tree", func(t *testing.T) {
		if got, w := psql(t, "tree.sql"), want(t, "tree.out"); got != w {
			t.Fatalf("output differs from tree.out\n--- got ---\n%s--- want ---\n%s", got, w)
		}
	})
	t.Run("copy", func(t *testing.T) {
		// COPY TO on a tree returns rows in shard order: compare sorted.
		lines := strings.Split(strings.TrimRight(psql(t, "copy.sql"), "\n"), "\n")
		slices.Sort(lines)
		if got, w := strings.Join(lines, "\n")+"\n", want(t, "copy.out"); got != w {
			t.Fatalf("sorted output differs from copy.out\n--- got ---\n%s--- want ---\n%s", got, w)
		}
	})
}

func TestDriverPgbench(t *testing.T) {
	requireClient(t, onPath("pgbench"), "pgbench", "apt-get install -y postgresql-contrib-15 (or postgresql-15)")
	p := driverTree(t)
	c := connect(t, p.DSN("lattice"))
	for i := 1; i <= 20; i++ {
		mustExec(t, c, `INSERT INTO drv (id, grp, name) VALUES ($1, $2, $3)`, i, i%4, fmt.Sprintf("name-%d", i))
	}
	// Every transaction adds 1 to one row's grp, so the sum counts the
	// transactions that committed.
	grpSum := func(t *testing.T) int {
		rows, err := queryStrings(t, c, `SELECT grp FROM drv`)
		if err != nil {
			t.Fatal(err)
		}
		sum := 0
		for _, r := range rows {
			n, _ := strconv.Atoi(r)
			sum += n
		}
		return sum
	}
	const clients, perClient = 2, 25
	want := grpSum(t)
	ctx := clientContext(t)
	failed := regexp.MustCompile(`(?m)^number of failed transactions: (\d+)`)
	processed := regexp.MustCompile(`(?m)^number of transactions actually processed: (\d+)/(\d+)`)
	for _, mode := range []string{"simple", "extended", "prepared"} {
		t.Run(mode, func(t *testing.T) {
			cmd := exec.CommandContext(ctx, "pgbench", "-n", "-M", mode, "-c", strconv.Itoa(clients), "-j", "1",
				"-t", strconv.Itoa(perClient), "-f", filepath.Join(driversDir, "pgbench", "tree.sql"), p.DSN("lattice"))
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("pgbench -M %s: %v\n%s", mode, err, out)
			}
			if m := failed.FindSubmatch(out); m == nil || string(m[1]) != "0" {
				t.Fatalf("pgbench -M %s: want 0 failed transactions\n%s", mode, out)
			}
			if m := processed.FindSubmatch(out); m == nil || string(m[1]) != strconv.Itoa(clients*perClient) || string(m[1]) != string(m[2]) {
				t.Fatalf("pgbench -M %s: want %d transactions processed\n%s", mode, clients*perClient, out)
			}
			want += clients * perClient
			if got := grpSum(t); got != want {
				t.Fatalf("after pgbench -M %s the grp column sums to %d, want %d", mode, got, want)
			}
		})
	}
}

func TestDriverPgx(t *testing.T) {
	p := driverTree(t)
	ctx := clientContext(t)
	c := connect(t, p.DSN("lattice"))
	got := map[string]string{}
	ids := func(sql string, args ...any) string {
		rows, err := c.Query(ctx, sql, args...)
		if err != nil {
			return "ERROR " + err.Error()
		}
		out, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return "ERROR " + err.Error()
		}
		s := make([]string, len(out))
		for i, v := range out {
			s[i] = strconv.FormatInt(v, 10)
		}
		return strings.Join(s, ",")
	}
	// A named server-side statement, and pgx's statement cache for the rest.
	if _, err := c.Prepare(ctx, "ins", `INSERT INTO drv (id, grp, name) VALUES ($1, $2, $3)`); err != nil {
		t.Fatal(err)
	}
	n := int64(0)
	for i := 1; i <= 20; i++ {
		tag, err := c.Exec(ctx, "ins", i, i%4, fmt.Sprintf("name-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		n += tag.RowsAffected()
	}
	got["insert"] = strconv.FormatInt(n, 10)
	var name string
	if err := c.QueryRow(ctx, `SELECT name FROM drv WHERE id = $1`, 7).Scan(&name); err != nil {
		t.Fatal(err)
	}
	got["select"] = name
	err := pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE drv SET name = $2 WHERE id = $1`, 5, "tx-5"); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT name FROM drv WHERE id = $1`, 5).Scan(&name)
	})
	if err != nil {
		t.Fatal(err)
	}
	got["tx"] = name
	got["fanout"] = ids(`SELECT id FROM drv ORDER BY id`)
	got["fanout_param"] = ids(`SELECT id FROM drv WHERE grp = $1 ORDER BY id`, 1)
	_, err = c.Exec(ctx, "ins", 1, 1, "dup")
	got["unique"] = pgCode(err)
	if err := c.QueryRow(ctx, `SELECT name FROM drv WHERE id = $1`, 1).Scan(&name); err != nil {
		t.Fatal(err)
	}
	got["after_error"] = name

	copied, err := c.CopyFrom(ctx, pgx.Identifier{"drv"}, []string{"id", "grp", "name"},
		pgx.CopyFromRows([][]any{{101, 1, "copy-101"}, {102, 2, "copy-102"}, {103, 3, "copy-103"}}))
	if err != nil {
		got["copy_in"] = "ERROR " + err.Error()
	} else {
		got["copy_in"] = strconv.FormatInt(copied, 10)
	}
	var buf bytes.Buffer
	if _, err := c.PgConn().CopyTo(ctx, &buf, `COPY drv TO STDOUT`); err != nil {
		got["copy_out"] = "ERROR " + err.Error()
	} else {
		got["copy_out"] = strconv.Itoa(strings.Count(buf.String(), "\n"))
	}
	checkSteps(t, got, driverSteps)
}

func TestDriverLibPq(t *testing.T) {
	p := driverTree(t)
	ctx := clientContext(t)
	db, err := sql.Open("postgres", p.DSN("lattice"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	got := map[string]string{}
	// db.Prepare makes a named server-side statement in lib/pq.
	ins, err := db.PrepareContext(ctx, `INSERT INTO drv (id, grp, name) VALUES ($1, $2, $3)`)
	if err != nil {
		t.Fatal(err)
	}
	defer ins.Close()
	sel, err := db.PrepareContext(ctx, `SELECT name FROM drv WHERE id = $1`)
	if err != nil {
		t.Fatal(err)
	}
	defer sel.Close()
	n := int64(0)
	for i := 1; i <= 20; i++ {
		res, err := ins.ExecContext(ctx, i, i%4, fmt.Sprintf("name-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		k, _ := res.RowsAffected()
		n += k
	}
	got["insert"] = strconv.FormatInt(n, 10)
	var name string
	for i := 0; i < 3; i++ {
		if err := sel.QueryRowContext(ctx, 7).Scan(&name); err != nil {
			t.Fatal(err)
		}
	}
	got["select"] = name
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE drv SET name = $2 WHERE id = $1`, 5, "tx-5"); err != nil {
		t.Fatal(err)
	}
	if err := tx.StmtContext(ctx, sel).QueryRowContext(ctx, 5).Scan(&name); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	got["tx"] = name
	ids := func(q string, args ...any) string {
		rows, err := db.QueryContext(ctx, q, args...)
		if err != nil {
			return "ERROR " + err.Error()
		}
		defer rows.Close()
		var out []string
		for rows.Next() {
			var id int64
			if err := rows.Scan(&id); err != nil {
				return "ERROR " + err.Error()
			}
			out = append(out, strconv.FormatInt(id, 10))
		}
		if err := rows.Err(); err != nil {
			return "ERROR " + err.Error()
		}
		return strings.Join(out, ",")
	}
	got["fanout"] = ids(`SELECT id FROM drv ORDER BY id`)
	got["fanout_param"] = ids(`SELECT id FROM drv WHERE grp = $1 ORDER BY id`, 1)
	_, err = ins.ExecContext(ctx, 1, 1, "dup")
	var pqErr *pq.Error
	if errors.As(err, &pqErr) {
		got["unique"] = string(pqErr.Code)
	} else {
		got["unique"] = fmt.Sprintf("not a *pq.Error: %v", err)
	}
	if err := sel.QueryRowContext(ctx, 1).Scan(&name); err != nil {
		t.Fatal(err)
	}
	got["after_error"] = name

	// lib/pq has COPY FROM (pq.CopyIn) but no COPY TO.
	got["copy_in"] = func() string {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return "ERROR " + err.Error()
		}
		defer tx.Rollback()
		st, err := tx.PrepareContext(ctx, pq.CopyIn("drv", "id", "grp", "name"))
		if err != nil {
			return "ERROR " + err.Error()
		}
		for _, i := range []int{101, 102, 103} {
			if _, err := st.ExecContext(ctx, i, i%4, fmt.Sprintf("copy-%d", i)); err != nil {
				return "ERROR " + err.Error()
			}
		}
		res, err := st.ExecContext(ctx)
		if err != nil {
			return "ERROR " + err.Error()
		}
		if err := st.Close(); err != nil {
			return "ERROR " + err.Error()
		}
		if err := tx.Commit(); err != nil {
			return "ERROR " + err.Error()
		}
		k, _ := res.RowsAffected()
		return strconv.FormatInt(k, 10)
	}()
	checkSteps(t, got, stepsWithout("copy_out"))
}

func TestDriverNodePostgres(t *testing.T) {
	dir := filepath.Join(driversDir, "node")
	requireClient(t, onPath("node"), "node", "apt-get install -y nodejs npm")
	var pkg struct{ Version string }
	b, err := os.ReadFile(filepath.Join(dir, "node_modules", "pg", "package.json"))
	if err == nil {
		err = json.Unmarshal(b, &pkg)
	}
	requireClient(t, err == nil && pkg.Version == nodePgVersion, "node-postgres (npm pg "+nodePgVersion+") in "+dir,
		"npm install --prefix "+dir+" (or `make tools`)")
	p := driverTree(t)
	got := runClient(t, exec.CommandContext(clientContext(t), "node", filepath.Join(dir, "driver.js"), p.DSN("lattice")))
	// node-postgres has no COPY (that is the separate pg-copy-streams package).
	checkSteps(t, got, stepsWithout("copy_in", "copy_out"))
}

// systemPython is Debian's python3, which the python3-psycopg packages
// install into (not a pyenv one earlier on PATH).
const systemPython = "/usr/bin/python3"

func requirePythonModule(t *testing.T, module, pkg string) {
	t.Helper()
	present := fileExists(systemPython) && exec.Command(systemPython, "-c", "import "+module).Run() == nil
	requireClient(t, present, module+" for "+systemPython, "apt-get install -y "+pkg)
}

func TestDriverPsycopg3(t *testing.T) {
	requirePythonModule(t, "psycopg", "python3-psycopg")
	p := driverTree(t)
	got := runClient(t, exec.CommandContext(clientContext(t), systemPython, filepath.Join(driversDir, "python", "psycopg3_driver.py"), p.DSN("lattice")))
	checkSteps(t, got, append([]driverStep{namedCursorStep}, driverSteps...))
}

func TestDriverPsycopg2(t *testing.T) {
	requirePythonModule(t, "psycopg2", "python3-psycopg2")
	p := driverTree(t)
	got := runClient(t, exec.CommandContext(clientContext(t), systemPython, filepath.Join(driversDir, "python", "psycopg2_driver.py"), p.DSN("lattice")))
	checkSteps(t, got, append([]driverStep{namedCursorStep, largeObjectStep}, driverSteps...))
}

const jdbcJar = "/usr/share/java/postgresql.jar"

func TestDriverJDBC(t *testing.T) {
	requireClient(t, onPath("java"), "java", "apt-get install -y openjdk-17-jre-headless")
	requireClient(t, fileExists(jdbcJar), "pgjdbc ("+jdbcJar+")", "apt-get install -y libpostgresql-jdbc-java")
	p := driverTree(t)
	host, port, _ := strings.Cut(p.Addr, ":")
	url := fmt.Sprintf("jdbc:postgresql://%s:%s/lattice?user=lattice&sslmode=disable&prepareThreshold=2", host, port)
	// java runs a single source file directly (JEP 330).
	got := runClient(t, exec.CommandContext(clientContext(t), "java", "-cp", jdbcJar, filepath.Join(driversDir, "java", "Driver.java"), url))
	checkSteps(t, got, append([]driverStep{{"server_prepared", "true"}, fetchSizeStep, largeObjectStep}, driverSteps...))
}
