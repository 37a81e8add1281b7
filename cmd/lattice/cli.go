package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/lattice-db/lattice/admin"
	"github.com/lattice-db/lattice/sqlstate"
)

// The operator's commands (status, shards, reshard, nodes, node) talk to a proxy's admin
// JSON API, the same one the page uses.

const defaultAdminURL = "http://127.0.0.1:9090"

// cli holds what the commands write to and how they wait.
type cli struct {
	out, errOut io.Writer
	tty         bool          // out is a terminal: redraw one progress line
	interval    time.Duration // between polls of --wait
	now         func() time.Time
	// maxPollErrors is how many polls in a row may fail before --wait gives
	// up: a proxy restarting should not end the wait, one that is gone should.
	maxPollErrors int
}

func newCLI() *cli {
	return &cli{out: os.Stdout, errOut: os.Stderr, tty: isTerminal(os.Stdout), interval: 500 * time.Millisecond,
		now: time.Now, maxPollErrors: 20}
}

// isTerminal reports whether f is a character device (a terminal), which
// is all the progress bar needs to know.
func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// apiClient calls the admin API.
type apiClient struct {
	base   string
	tenant string
	token  string // sent as a bearer token when set
	http   *http.Client
}

// clientAuth is how the one command a process runs authenticates, set by
// the flags clientFlags adds.
var clientAuth struct{ tokenFile, caFile string }

// clientFlags adds --admin, --tenant, --admin-token-file and --admin-ca to fs.
func clientFlags(fs *flag.FlagSet) (adminURL, tenant *string) {
	adminURL = fs.String("admin", defaultAdminURL, "URL of a proxy's admin endpoint (also LATTICE_ADMIN; host:port means http://host:port)")
	tenant = fs.String("tenant", "", "tenant (database) of the tree; empty means the proxy's default tenant")
	fs.StringVar(&clientAuth.tokenFile, "admin-token-file", "", "file holding the proxy's admin token (also $"+adminTokenEnv+")")
	fs.StringVar(&clientAuth.caFile, "admin-ca", "", "PEM CA certificates to trust for an https:// --admin, besides the system's")
	return
}

func newAPIClient(adminURL, tenant string) (*apiClient, error) {
	if !strings.Contains(adminURL, "://") {
		adminURL = "http://" + adminURL
	}
	u, err := url.Parse(adminURL)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("--admin %q: want a URL such as %s", adminURL, defaultAdminURL)
	}
	token, err := fromFileOrEnv(clientAuth.tokenFile, adminTokenEnv)
	if err != nil {
		return nil, fmt.Errorf("admin token: %w", err)
	}
	hc := &http.Client{Timeout: 15 * time.Second}
	if clientAuth.caFile != "" {
		pem, err := os.ReadFile(clientAuth.caFile)
		if err != nil {
			return nil, err
		}
		roots, err := x509.SystemCertPool()
		if err != nil {
			roots = x509.NewCertPool()
		}
		if !roots.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--admin-ca %s: no PEM certificate in it", clientAuth.caFile)
		}
		hc.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}}
	}
	return &apiClient{base: strings.TrimRight(u.String(), "/"), tenant: tenant, token: token, http: hc}, nil
}

// apiError is an error answer of the API: its HTTP status and the error
// the SQL function would have raised (Err.Code is empty for an error that
// has no SQLSTATE).
type apiError struct {
	Status int
	Err    *sqlstate.Error
}

// Error leaves out the severity: an operator reads it after "lattice: ".
func (e *apiError) Error() string {
	msg := e.Err.Message
	if e.Err.Code != "" {
		msg = fmt.Sprintf("%s (SQLSTATE %s)", e.Err.Message, e.Err.Code)
	}
	if e.Err.Hint != "" {
		msg += "\nhint: " + e.Err.Hint
	}
	return msg
}

func (e *apiError) Unwrap() error { return e.Err }

// maxAnswer bounds an API answer: a map of 4096 slots is about 20 kB, a
// list of many trees or shards stays well under this.
const maxAnswer = 64 << 20

func (c *apiClient) do(ctx context.Context, method, path string, q url.Values, body, out any) error {
	if c.tenant != "" {
		if q == nil {
			q = url.Values{}
		}
		q.Set("tenant", c.tenant)
	}
	u := c.base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	if resp.StatusCode >= 300 {
		var ans admin.ErrorAnswer
		if json.Unmarshal(raw, &ans) != nil || ans.Error == "" {
			ans = admin.ErrorAnswer{Error: fmt.Sprintf("%s %s: %s", method, path, resp.Status)}
			if resp.StatusCode == http.StatusUnauthorized {
				ans.Error += "; give the proxy's admin token with --admin-token-file or $" + adminTokenEnv
			}
		}
		return &apiError{Status: resp.StatusCode, Err: &sqlstate.Error{Code: ans.SQLState, Message: ans.Error, Hint: ans.Hint}}
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("%s %s: decode answer: %w", method, path, err)
	}
	return nil
}

func treePath(tree string, rest ...string) string {
	return "/api/trees/" + url.PathEscape(tree) + strings.Join(rest, "")
}

// parseInterleaved parses flags that may come before, between or after
// the positional arguments, and returns the positional ones.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := parseFlags(fs, args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

func (c *cli) statusCmd(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	adminURL, tenant := clientFlags(fs)
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return errors.New("usage: lattice status [--admin URL] [--tenant T]")
	}
	api, err := newAPIClient(*adminURL, *tenant)
	if err != nil {
		return err
	}
	var st admin.Status
	if err := api.do(ctx, http.MethodGet, "/api/status", nil, nil, &st); err != nil {
		return err
	}
	c.printStatus(st)
	return nil
}

func (c *cli) printStatus(st admin.Status) {
	p := st.Proxy
	flags := []string{"version " + p.Version}
	if p.Coordinator {
		flags = append(flags, "coordinator")
	}
	switch {
	case p.Live:
		flags = append(flags, "live")
	case p.ServingCached:
		flags = append(flags, "NOT LIVE (registration lapsed; serving from the cached maps, reshards wait)")
	default:
		flags = append(flags, "NOT LIVE (registration lapsed)")
	}
	flags = append(flags, fmt.Sprintf("epoch lag %d", p.EpochLag))
	fmt.Fprintf(c.out, "proxy %s: %s\n", p.ID, strings.Join(flags, ", "))
	fmt.Fprintf(c.out, "live proxies: %d\n", len(st.Proxies))
	for _, l := range st.Proxies {
		fmt.Fprintf(c.out, "  %s  lease until %s\n", l.ID, l.LeaseExpires.UTC().Format(time.RFC3339))
	}
	fmt.Fprintln(c.out)
	if len(st.Trees) == 0 {
		fmt.Fprintln(c.out, "no trees")
		return
	}
	tw := tabwriter.NewWriter(c.out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tTREE\tKEY\tSHARDS\tSLOTS\tEPOCH\tRESHARD")
	for _, t := range st.Trees {
		fmt.Fprintf(tw, "%s\t%s\t%s (%s)\t%d\t%d\t%d\t%s\n", t.Tenant, t.Name, t.Key, t.KeyType, t.Shards, t.Slots, t.Epoch, reshardSummary(t.Reshard))
	}
	tw.Flush()
	for _, t := range st.Trees {
		for _, op := range t.Operations {
			fmt.Fprintf(c.out, "%s %s of %s/%s: phase %s, %d of %d rows, running since %s, ETA %s\n", op.Kind, op.ID, t.Tenant, op.Tree, op.Phase,
				op.RowsDone, op.RowsTotal, op.Started.UTC().Format(time.RFC3339), fmtETA(op.ETASeconds))
		}
	}
}

func reshardSummary(r *admin.ReshardStatus) string {
	if r == nil {
		return "-"
	}
	return fmt.Sprintf("%s %d -> %d shards, %d now, %d migrations in flight, ETA %s",
		r.Phase, r.From, r.Target, r.Shards, r.MigrationsInFlight, fmtETA(r.ETASeconds))
}

func fmtETA(s *float64) string {
	if s == nil {
		return "unknown"
	}
	return (time.Duration(*s) * time.Second).String()
}

func fmtBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for v := n / unit; v >= unit; v /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

func optInt(p *int64) string {
	if p == nil {
		return "-"
	}
	return strconv.FormatInt(*p, 10)
}

func (c *cli) shardsCmd(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("shards", flag.ContinueOnError)
	adminURL, tenant := clientFlags(fs)
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return errors.New("usage: lattice shards TREE [--admin URL] [--tenant T]")
	}
	api, err := newAPIClient(*adminURL, *tenant)
	if err != nil {
		return err
	}
	var shards []admin.ShardInfo
	if err := api.do(ctx, http.MethodGet, treePath(pos[0], "/shards"), nil, nil, &shards); err != nil {
		return err
	}
	c.printShards(shards)
	return nil
}

func (c *cli) printShards(shards []admin.ShardInfo) {
	tw := tabwriter.NewWriter(c.out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SHARD\tNODE\tSCHEMA\tSTATE\tSLOTS\tSLOT RANGES\tROWS (EST.)\tSIZE")
	for _, s := range shards {
		size := "-"
		if s.BytesEstimate != nil {
			size = fmtBytes(*s.BytesEstimate)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", s.Index, s.Node, s.Schema, s.State, s.Slots, s.SlotRanges, optInt(s.RowsEstimate), size)
	}
	tw.Flush()
}

func (c *cli) reshardCmd(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("reshard", flag.ContinueOnError)
	adminURL, tenant := clientFlags(fs)
	wait := fs.Bool("wait", false, "wait for the reshard to complete, showing its progress")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return errors.New("usage: lattice reshard TREE N [--wait] [--admin URL] [--tenant T]")
	}
	n, err := strconv.Atoi(pos[1])
	if err != nil {
		return fmt.Errorf("shard count %q is not an integer", pos[1])
	}
	api, err := newAPIClient(*adminURL, *tenant)
	if err != nil {
		return err
	}
	tree := pos[0]
	var st admin.ReshardStatus
	if err := api.do(ctx, http.MethodPost, treePath(tree, "/reshard"), nil, map[string]int{"shards": n}, &st); err != nil {
		return err
	}
	fmt.Fprintln(c.out, st.Message)
	if !*wait {
		return nil
	}
	return c.wait(ctx, api, tree, n)
}

// progress is what --wait shows of one poll.
type progress struct {
	tree *admin.TreeSummary
	migs []admin.MigrationInfo
}

// wait polls the tree until no reshard runs, then checks it has n shards.
func (c *cli) wait(ctx context.Context, api *apiClient, tree string, n int) error {
	start := c.now()
	var last string
	failures := 0
	for {
		var t admin.TreeSummary
		err := api.do(ctx, http.MethodGet, treePath(tree), nil, nil, &t)
		var migs []admin.MigrationInfo
		if err == nil && t.Reshard != nil {
			err = api.do(ctx, http.MethodGet, "/api/migrations", url.Values{"tenant": {t.Tenant}, "tree": {t.Name}}, nil, &migs)
		}
		if err != nil {
			var ae *apiError
			if errors.As(err, &ae) && ae.Status == http.StatusNotFound {
				return err // the tree is gone: nothing to wait for
			}
			if failures++; failures >= c.maxPollErrors || ctx.Err() != nil {
				c.endLine()
				return fmt.Errorf("waiting for the reshard of %s: %w", tree, err)
			}
			fmt.Fprintf(c.errOut, "\nlattice: poll failed (%d of %d): %v\n", failures, c.maxPollErrors, err)
		} else {
			failures = 0
			elapsed := c.now().Sub(start)
			if t.Reshard == nil {
				c.endLine()
				if t.Shards != n {
					return fmt.Errorf("the reshard of %s ended with %d shards, not %d", tree, t.Shards, n)
				}
				fmt.Fprintf(c.out, "done: %s has %d shards (epoch %d) after %s\n", tree, t.Shards, t.Epoch, elapsed.Round(100*time.Millisecond))
				return nil
			}
			line := progressLine(t.Reshard, migs)
			if c.tty {
				fmt.Fprintf(c.out, "\r%s %s\x1b[K", bar(t.Reshard, 30), line)
			} else if line != last {
				fmt.Fprintf(c.out, "[%6.1fs] %s\n", elapsed.Seconds(), line)
			}
			last = line
		}
		select {
		case <-ctx.Done():
			c.endLine()
			return ctx.Err()
		case <-time.After(c.interval):
		}
	}
}

// endLine ends the progress bar's line on a terminal.
func (c *cli) endLine() {
	if c.tty {
		fmt.Fprintln(c.out)
	}
}

// progressLine says where a reshard is; it leaves out what changes on every
// poll (the ETA) so that plain output prints a line per change only.
func progressLine(r *admin.ReshardStatus, migs []admin.MigrationInfo) string {
	phases := map[string]int{}
	var lastErr string
	for _, m := range migs {
		phases[m.Kind+" "+m.Phase]++
		if m.LastError != "" {
			lastErr = m.LastError
		}
	}
	keys := make([]string, 0, len(phases))
	for k := range phases {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%d %s", phases[k], k)
	}
	// The count comes from the list, read after the status, so that the
	// line agrees with itself.
	s := fmt.Sprintf("%d/%d shards, %d migrations in flight", r.Shards, r.Target, len(migs))
	if len(parts) > 0 {
		s += " (" + strings.Join(parts, ", ") + ")"
	}
	s += fmt.Sprintf(", %d rows copied", r.RowsCopied)
	if lastErr != "" {
		s += ", last error: " + lastErr
	}
	return s
}

// bar draws the reshard's progress in distinct shards, width cells wide.
func bar(r *admin.ReshardStatus, width int) string {
	total, done := abs(r.Target-r.From), abs(r.Shards-r.From)
	filled := width
	if total > 0 {
		filled = min(width, width*done/total)
	}
	return "[" + strings.Repeat("#", filled) + strings.Repeat(".", width-filled) + "] ETA " + fmtETA(r.ETASeconds)
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}
