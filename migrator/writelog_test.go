package migrator

import (
	"slices"
	"strings"
	"testing"

	"github.com/lattice-db/lattice/shardmap"
)

// TestVerifyAfterCrash: a run dies between the flip and the comparison,
// and clients write the moved slots on the target before the next run. The
// next run holds no snapshots; it compares the source's fenced rows with
// the target's rows as of the flip, rebuilt from the target's write log:
// the clients' writes do not fail a good copy, a row the copy got wrong
// stops the release (even one a client wrote after), and without a write
// log the move is not released either.
func TestVerifyAfterCrash(t *testing.T) {
	tests := []struct {
		name    string
		corrupt bool // a copied row changed on the target in the drain, past the log
		noLog   bool // the write log is gone (a freeze by an older build)
		// resumed by a run with --verify-moves=false: the move froze with
		// its write log, so it is compared all the same
		skipOnResume bool
		written      []string
		failed       bool
	}{
		{name: "client writes", written: []string{"updated", "inserted", "deleted"}},
		{name: "corrupt", corrupt: true, written: []string{"updated", "inserted"}, failed: true},
		{name: "corrupt and overwritten", corrupt: true, written: []string{"corrupted row updated"}, failed: true},
		{name: "no write log", noLog: true, failed: true},
		{name: "corrupt, resumed with verification off", corrupt: true, written: []string{"updated"}, failed: true, skipOnResume: true},
	}
	for _, kind := range []shardmap.MigrationKind{shardmap.Split, shardmap.Fold} {
		for _, tc := range tests {
			t.Run(string(kind)+"/"+tc.name, func(t *testing.T) {
				r := newRig(t)
				mig := r.start(kind)
				f := r.nodes
				slot := mig.Slots[0][0] + 1
				run := r.runner("")
				run.crash = func(p string) {
					switch {
					case p == "drain" && tc.corrupt:
						f.put(mig.Target, slot, keyOf(slot, 0), "corrupt")
					case p == "flip":
						panic(crashed{p})
					}
				}
				if point, err := r.run(run, mig); err != nil || point != "flip" {
					t.Fatalf("run stopped at %q (%v), want the crash at flip", point, err)
				}
				// Clients write the target once the map is flipped.
				want := map[string]string{keyOf(slot, 0): "v", keyOf(slot, 1): "v"}
				for _, w := range tc.written {
					switch w {
					case "updated":
						f.write(mig.Target, slot, keyOf(slot, 1), "client", false)
						want[keyOf(slot, 1)] = "client"
					case "inserted":
						f.write(mig.Target, slot, "new", "client", false)
						want["new"] = "client"
					case "deleted":
						f.write(mig.Target, slot, keyOf(slot, 2), "", true)
						want[keyOf(slot, 2)] = ""
					case "corrupted row updated":
						f.write(mig.Target, slot, keyOf(slot, 0), "client", false)
						want[keyOf(slot, 0)] = "client"
					}
				}
				if tc.noLog {
					delete(f.logs, mig.ID)
				}
				rec := r.stored(mig)
				r.opts.SkipVerify = tc.skipOnResume
				if _, err := r.run(r.runner(""), rec); err != nil {
					t.Fatal(err)
				}
				if tc.failed {
					rec = r.stored(mig)
					if rec == nil || rec.Phase != shardmap.PhaseVerifyFailed {
						t.Fatalf("the move went on: %+v", rec)
					}
					if f.called("dropshadow") || f.called("delete") {
						t.Fatalf("the release ran: %v", f.calls)
					}
					if got := f.rows(mig.Source, mig.Slots); got != 4*slotsOf(mig) {
						t.Fatalf("the source holds %d of its %d moved rows", got, 4*slotsOf(mig))
					}
					if tc.noLog {
						if !strings.Contains(rec.LastError, errNoWriteLog.Error()) {
							t.Fatalf("last error %q", rec.LastError)
						}
						return
					}
					if len(rec.Verify.Differ) != 1 || rec.Verify.Differ[0].Slot != slot || !rec.Verify.FromLog {
						t.Fatalf("verification %+v, want slot %d differing, from the write log", rec.Verify, slot)
					}
					if len(rec.Verify.Written) != len(tc.written) {
						t.Fatalf("written since the flip %+v, want %d keys", rec.Verify.Written, len(tc.written))
					}
					if _, err := r.runner("").Repair(r.ctx, rec); err != nil {
						t.Fatal(err)
					}
					if _, err := r.run(r.runner(""), r.stored(mig)); err != nil {
						t.Fatal(err)
					}
				} else if rec.Verify == nil || !rec.Verify.FromLog || len(rec.Verify.Differ) != 0 {
					t.Fatalf("verification %+v, want a pass from the write log", rec.Verify)
				}
				if r.stored(mig) != nil {
					t.Fatal("the move did not complete")
				}
				for key, v := range want {
					got, ok := f.get(mig.Target, slot, key)
					if v == "" && ok || v != "" && got != v {
						t.Errorf("row %s holds %q (%v), want %q", key, got, ok, v)
					}
				}
				if got := f.rows(mig.Source, mig.Slots); got != 0 {
					t.Errorf("the source keeps %d moved rows", got)
				}
				if f.logs[mig.ID] != nil || !slices.Contains(f.calls, "drop writelog "+mig.ID) {
					t.Error("the release left the write log")
				}
			})
		}
	}
}

func slotsOf(mig *shardmap.Migration) int {
	n := 0
	for _, rg := range mig.Slots {
		n += rg[1] - rg[0] + 1
	}
	return n
}
