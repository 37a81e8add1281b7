package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"maps"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"
)

// driverSuite is a driver's own test suite, run by `go test` in a copy of
// the driver's module as the repository's go.mod pins it.
type driverSuite struct {
	module string   // the module path, "github.com/jackc/pgx/v5"
	short  string   // what the module's root package is called in names
	pkgs   []string // packages to test, relative to the module
	// env gives the environment that points the suite at dsn.
	env func(dsn string) []string
	// known is the testdata file of the tests no transaction-pooling proxy
	// can pass: "pkg Test[/subtest]  # why", one a line.
	known string
	// run narrows the suite with a -run pattern; "" runs all of it.
	run     string
	timeout time.Duration
}

// compare runs the suite on plain PostgreSQL and through the proxy, and
// fails on a test that fails only through the proxy, unless known lists it.
func (d driverSuite) compare(t *testing.T, direct, lattice string) {
	t.Helper()
	src := moduleSource(t, d.module)
	known := knownPoolingFailures(t, d.known)
	// The known top-level tests are skipped on both sides: one that
	// panics (it expects a connection to die that a pool keeps, or a
	// connect within 100 ms that a loaded machine misses) would stop its
	// package, and the tests after it with it, and their result is not
	// compared anyway. lib/pq's direct run stopped so at its 505th test in
	// every run, and the tests after it ran once more on both sides
	// (again) to tell their failures from the proxy's.
	skipped := map[string]bool{}
	var skip []string
	for name := range known {
		if _, test, ok := strings.Cut(name, " "); ok && !strings.Contains(test, "/") {
			skipped[name] = true
			skip = append(skip, "^"+regexp.QuoteMeta(test)+"$")
		}
	}
	sort.Strings(skip)
	onPostgres, passedOnPostgres := d.results(t, src, direct, strings.Join(skip, "|"))
	onLattice, passedOnLattice := d.results(t, src, lattice, strings.Join(skip, "|"))
	// A test that passed on PostgreSQL and has no result through the proxy
	// did not run: its package stopped (a panic, a hang cut by the timeout).
	// Names are compared without their long numbers (withoutLongNumbers).
	ran := nameSet(passedOnLattice)
	maps.Copy(ran, nameSet(onLattice))
	for name := range passedOnPostgres {
		top, _, _ := strings.Cut(name, "/")
		if !ran[withoutLongNumbers(name)] && !skipped[top] {
			onLattice[name] = "no result through Lattice: its package stopped before it ran or ended"
		}
	}
	failedOnPostgres := nameSet(onPostgres)
	var unexpected []string
	for name, out := range onLattice {
		if failedOnPostgres[withoutLongNumbers(name)] {
			continue
		}
		if _, ok := known[name]; ok {
			continue
		}
		unexpected = append(unexpected, name)
		t.Logf("%s fails only through Lattice:\n%s", name, out)
	}
	unexpected = d.again(t, src, direct, lattice, unexpected)
	sort.Strings(unexpected)
	if len(unexpected) > 0 {
		t.Fatalf("%d %s tests fail only through Lattice: %s", len(unexpected), d.short, strings.Join(unexpected, ", "))
	}
}

// again runs the top-level tests of names once more on both sides and
// returns the names that fail every time again through the proxy and pass
// on PostgreSQL. Some of a driver's tests are bound to timing (lib/pq cancels
// a query 10 ms after it starts, and connects with short timeouts), which
// a loaded machine breaks on either side, and a run on either side can
// stop partway (lib/pq's direct run once ended after 504 of its tests,
// and the failures after them, common to both sides, compared as the
// proxy's). A failure the proxy causes happens twice, beside a pass.
func (d driverSuite) again(t *testing.T, src, direct, lattice string, names []string) []string {
	t.Helper()
	if len(names) == 0 {
		return nil
	}
	tops := map[string]bool{}
	for _, name := range names {
		_, test, _ := strings.Cut(name, " ")
		top, _, _ := strings.Cut(test, "/")
		tops["^"+regexp.QuoteMeta(top)+"$"] = true
	}
	var run []string
	for p := range tops {
		run = append(run, p)
	}
	sort.Strings(run)
	once := d
	once.run = strings.Join(run, "|")
	_, passedDirect := once.results(t, src, direct, "")
	onPostgres := nameSet(passedDirect)
	still := names
	// Up to three more runs through the proxy: a loaded machine (a
	// listener given 100 ms to connect) can fail a timed test twice in a
	// row, while a failure the proxy causes fails every time.
	for try := 0; try < 3 && len(still) > 0; try++ {
		_, passedLattice := once.results(t, src, lattice, "")
		throughLattice := nameSet(passedLattice)
		names, still = still, nil
		for _, name := range names {
			switch n := withoutLongNumbers(name); {
			case throughLattice[n]:
				t.Logf("%s passed when run again through Lattice: a timing failure", name)
			case !onPostgres[n]:
				t.Logf("%s did not pass on PostgreSQL either when run again: not the proxy's", name)
			default:
				still = append(still, name)
			}
		}
	}
	return still
}

// nameSet is the test names of sets, without their long numbers.
func nameSet[V any](sets ...map[string]V) map[string]bool {
	out := map[string]bool{}
	for _, set := range sets {
		for name := range set {
			out[withoutLongNumbers(name)] = true
		}
	}
	return out
}

// longNumber is a run of digits a temporary directory's name has.
var longNumber = regexp.MustCompile(`[0-9]{6,}`)

// withoutLongNumbers is name with its runs of 6 digits or more left out:
// some subtests name a temporary directory, unlike from run to run.
func withoutLongNumbers(name string) string { return longNumber.ReplaceAllString(name, "") }

// moduleSource copies a module the repository uses into a writable dir.
func moduleSource(t *testing.T, module string) string {
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(goTool(), "list", "-m", "-f", "{{.Dir}}", module)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), filepath.Base(module))
	if out, err := exec.Command("cp", "-r", strings.TrimSpace(string(out)), dst).CombinedOutput(); err != nil {
		t.Fatalf("copy %s: %v %s", module, err, out)
	}
	if out, err := exec.Command("chmod", "-R", "u+w", dst).CombinedOutput(); err != nil {
		t.Fatalf("chmod: %v %s", err, out)
	}
	return dst
}

// results runs the suite against dsn, but the top-level tests skip
// matches, and returns its failing tests ("pkg Test/sub") with their
// output, and its passing ones.
func (d driverSuite) results(t *testing.T, dir, dsn, skip string) (failed map[string]string, passed map[string]bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d.timeout)
	defer cancel()
	args := append([]string{"test", "-count=1", "-p", "1", "-json"}, d.pkgs...)
	if d.run != "" {
		args = append(args, "-run", d.run)
	}
	if skip != "" {
		args = append(args, "-skip", skip)
	}
	cmd := exec.CommandContext(ctx, goTool(), args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), d.env(dsn)...)
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stdout
	runErr := cmd.Run() // a failing test fails go test; the events say which
	outputs := map[string]*strings.Builder{}
	failed, passed = map[string]string{}, map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(stdout.Bytes()))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var e struct{ Action, Package, Test, Output string }
		if json.Unmarshal(sc.Bytes(), &e) != nil || e.Test == "" {
			continue
		}
		pkg := strings.TrimPrefix(strings.TrimPrefix(e.Package, d.module), "/")
		if pkg == "" {
			pkg = d.short
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
			passed[name] = true
		}
	}
	if len(passed) == 0 {
		// A suite that did not build or could not connect would otherwise
		// compare as equal on both sides.
		t.Fatalf("%s suite against %s: no test passed (%v):\n%s", d.short, dsn, runErr, tail(stdout.Bytes(), 4000))
	}
	t.Logf("%s suite against %s: %d passed, %d failed", d.short, dsn, len(passed), len(failed))
	return failed, passed
}

// knownPoolingFailures reads a testdata file of "pkg Test  # reason" lines.
func knownPoolingFailures(t *testing.T, file string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", file))
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
