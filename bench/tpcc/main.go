// Command tpcc runs go-tpc v1.0.7's TPC-C kit (github.com/pingcap/go-tpc,
// its tpcc package unchanged) against PostgreSQL or Lattice through pgx:
//
//	tpcc -dsn URL [-warehouses 1] [-threads 4] [-time 60s] [-setup FILE] prepare|run|check
//
// prepare creates the kit's tables and loads them (with -setup, the SQL in
// FILE runs between the two: Lattice's lattice_create_tree calls); run runs
// the five transactions for -time and prints the kit's summary and tpmC;
// check runs the kit's consistency conditions (TPC-C 3.3.2). Each exits 1
// when the kit reported an error.
package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pingcap/go-tpc/tpcc"
)

func main() {
	dsn := flag.String("dsn", "", "PostgreSQL URL")
	warehouses := flag.Int("warehouses", 1, "TPC-C warehouses")
	threads := flag.Int("threads", 4, "clients")
	dur := flag.Duration("time", 60*time.Second, "length of the run")
	setup := flag.String("setup", "", "SQL file run after the kit's CREATE TABLEs, before its load")
	maxErrors := flag.Int("print-errors", 20, "errors printed in full")
	flag.Parse()
	if flag.NArg() != 1 || *dsn == "" {
		flag.Usage()
		os.Exit(2)
	}
	action := flag.Arg(0)
	if *setup != "" {
		text, err := os.ReadFile(*setup)
		if err != nil {
			fail(err)
		}
		afterDDL = func(ctx context.Context, c *stdlib.Conn) error {
			for _, s := range strings.Split(string(text), ";\n") {
				if strings.TrimSpace(s) == "" {
					continue
				}
				if _, err := c.ExecContext(ctx, s, nil); err != nil {
					return fmt.Errorf("setup %q: %w", strings.TrimSpace(s), err)
				}
			}
			return nil
		}
	}
	db, err := sql.Open(driverName, *dsn)
	if err != nil {
		fail(err)
	}
	db.SetMaxIdleConns(*threads + 1)
	w, err := tpcc.NewWorkloader(db, &tpcc.Config{
		Threads:           *threads,
		Warehouses:        *warehouses,
		MaxMeasureLatency: 16 * time.Second,
		PrepareRetryCount: 0,
	})
	if err != nil {
		fail(err)
	}

	ctx := context.Background()
	var errs atomic.Int64
	var printed atomic.Int64
	report := func(thread int, err error) {
		errs.Add(1)
		if printed.Add(1) <= int64(*maxErrors) {
			fmt.Printf("thread %d: %v\n", thread, err)
		}
	}
	var step func(ctx context.Context, thread int) error
	runCtx := ctx
	switch action {
	case "prepare":
		step = w.Prepare
	case "check":
		step = w.Check
	case "run":
		var cancel context.CancelFunc
		runCtx, cancel = context.WithTimeout(ctx, *dur)
		defer cancel()
		// The kit's Run is one transaction; keep each client at it until
		// the time is up, counting (not stopping at) errors.
		step = func(tctx context.Context, thread int) error {
			for runCtx.Err() == nil {
				if err := w.Run(tctx, thread); err != nil && runCtx.Err() == nil {
					report(thread, err)
				}
			}
			return nil
		}
	default:
		fail(fmt.Errorf("unknown action %q (prepare, run or check)", action))
	}
	var wg sync.WaitGroup
	for t := 0; t < *threads; t++ {
		wg.Add(1)
		go func(t int) {
			defer wg.Done()
			// The transactions run on a context of their own, so the end of
			// the run does not cancel one halfway (that would be counted as
			// an error).
			tctx := w.InitThread(ctx, t)
			defer w.CleanupThread(tctx, t)
			if err := step(tctx, t); err != nil {
				if action == "prepare" {
					// The kit's other loaders wait for the tables this
					// one failed to make: they would wait for ever.
					fail(fmt.Errorf("thread %d: %w", t, err))
				}
				report(t, err)
			}
		}(t)
	}
	wg.Wait()
	if action == "run" {
		w.OutputStats(true)
	}
	fmt.Printf("%s errors: %d\n", action, errs.Load())
	if errs.Load() > 0 {
		os.Exit(1)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "tpcc:", err)
	os.Exit(1)
}
