package integration

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lattice-db/lattice/pgshard"
)

// TestVerifyCatchesSubtleCorruption: the comparison's row hash (DESIGN 5.5)
// sees a difference that a cheaper hash would miss. Each case corrupts the
// split target during the drain, past replication, and the move must stop in
// verify_failed:
//   - values swapped between two rows of a table hashed by its columns,
//     picked so that a plain sum of hash_record_extended, which combines the
//     column hashes linearly, comes out the same;
//   - the values of two columns of a row swapped, which a row hash that
//     combined its column hashes alike would miss;
//   - a numeric value rewritten with another scale (5 as 5.00), equal to
//     numeric and so to its hash, different as text;
//   - a value changed beside a text column named x, the alias the
//     comparison gives the table: a bare x there is the column, and the
//     rows were compared by that column alone.
//
// The move must stop for differing slots, not for a comparison that
// could not run.
func TestVerifyCatchesSubtleCorruption(t *testing.T) {
	for _, tc := range []struct {
		name, columns string
		// corrupt changes the target table, given its name; it returns a
		// key it changed.
		corrupt func(t *testing.T, ctx context.Context, conn *pgx.Conn, table string) string
	}{
		{"swapped values", "v bigint NOT NULL", swapUnseenByLinearHash},
		{"numeric scale", "v numeric NOT NULL", func(t *testing.T, ctx context.Context, c *pgx.Conn, table string) string {
			var key string
			if err := c.QueryRow(ctx, fmt.Sprintf("UPDATE %s SET v = v::numeric(20,2) WHERE k = (SELECT min(k) FROM %s) RETURNING k",
				table, table)).Scan(&key); err != nil {
				t.Fatal(err)
			}
			return key
		}},
		{"values swapped between columns", "v bigint NOT NULL, w bigint NOT NULL DEFAULT 0", func(t *testing.T, ctx context.Context, c *pgx.Conn, table string) string {
			var key string
			if err := c.QueryRow(ctx, fmt.Sprintf("UPDATE %s SET v = w, w = v WHERE k = (SELECT min(k) FROM %s) RETURNING k",
				table, table)).Scan(&key); err != nil {
				t.Fatal(err)
			}
			return key
		}},
		{"a column named x", "x text NOT NULL, v numeric NOT NULL DEFAULT 1", func(t *testing.T, ctx context.Context, c *pgx.Conn, table string) string {
			var key string
			if err := c.QueryRow(ctx, fmt.Sprintf("UPDATE %s SET v = v + 1 WHERE k = (SELECT min(k) FROM %s) RETURNING k",
				table, table)).Scan(&key); err != nil {
				t.Fatal(err)
			}
			return key
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resetNodes(t)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			hold := holdFile(t)
			p := startProxyEnv(t, 2, []string{"LATTICE_TEST_HOLD_AT=drain:" + hold}, "--reshard-tick", "200ms")
			admin := connect(t, p.DSN("lattice"))
			mustExec(t, admin, "CREATE TABLE items (k text PRIMARY KEY, "+tc.columns+")")
			mustExec(t, admin, "INSERT INTO items SELECT 'k' || g, g FROM generate_series(1, 2000) g")
			mustExec(t, admin, "SELECT lattice_create_tree('items', 'k', shard_count => 2)")
			store := harnessStore(t)
			tr, err := store.Tree(ctx, "lattice", "items")
			if err != nil {
				t.Fatal(err)
			}
			mustExec(t, admin, "SELECT lattice_reshard('items', 3)")
			waitHeld(t, hold, "the split to reach its drain")
			migs, err := store.Migrations(ctx, "lattice", "items")
			if err != nil || len(migs) != 1 {
				t.Fatalf("migrations %v, %v", migs, err)
			}
			mig := migs[0]
			target := connect(t, testNodeDSN(t, nodeIndex(mig.TargetNode)))
			mustExec(t, target, "SET session_replication_role = replica")
			key := tc.corrupt(t, ctx, target, pgshard.ShardTable(tr, mig.Target))
			t.Logf("corrupted %s on the target", key)
			if err := os.Remove(hold); err != nil {
				t.Fatal(err)
			}
			pollUntil(t, time.Minute, "the move to be verified or to fail", func() (bool, error) {
				var phase, slots string
				err := admin.QueryRow(ctx, "SELECT phase, coalesce(verify_failed_slots::text, '') FROM lattice_reshard_status('items')").Scan(&phase, &slots)
				if phase == "idle" {
					t.Fatalf("the reshard completed: the corruption of %s went unseen", key)
				}
				if phase == "verify_failed" && slots == "" {
					t.Fatalf("the comparison could not run, rather than finding the slot of %s", key)
				}
				return phase == "verify_failed", err
			})
		})
	}
}

// swapUnseenByLinearHash swaps the v of two target rows for which the sum
// of their hash_record_extended is the same before and after, so only a
// row hash that mixes the column hashes non-linearly tells them apart.
func swapUnseenByLinearHash(t *testing.T, ctx context.Context, c *pgx.Conn, table string) string {
	var a, b string
	err := c.QueryRow(ctx, fmt.Sprintf(`WITH r AS (SELECT k, v FROM %[1]s ORDER BY k LIMIT 60)
		SELECT x.k, y.k FROM r x JOIN r y ON x.k < y.k
		WHERE hash_record_extended(ROW(x.k, x.v)::%[1]s, 0)::numeric + hash_record_extended(ROW(y.k, y.v)::%[1]s, 0)
		    = hash_record_extended(ROW(x.k, y.v)::%[1]s, 0)::numeric + hash_record_extended(ROW(y.k, x.v)::%[1]s, 0)
		LIMIT 1`, table)).Scan(&a, &b)
	if err != nil {
		t.Fatalf("no pair of rows whose swap a linear hash sum misses: %v", err)
	}
	if _, err := c.Exec(ctx, fmt.Sprintf(`UPDATE %[1]s x SET v = y.v FROM %[1]s y
		WHERE (x.k, y.k) IN (($1, $2), ($2, $1))`, table), a, b); err != nil {
		t.Fatal(err)
	}
	return a + " and " + b
}

// TestVerifyColumnNamedX: a table with a column named x, the alias the
// comparison gives the table, reshards to its end. A bare x in the row
// hash was that bigint column, hash_record_extended(bigint) does not
// exist, and every move of such a table stopped in verify_failed.
func TestVerifyColumnNamedX(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := startProxy(t, 2, "--reshard-tick", "200ms")
	admin := connect(t, p.DSN("lattice"))
	mustExec(t, admin, "CREATE TABLE points (k text PRIMARY KEY, x bigint NOT NULL, y bigint)")
	mustExec(t, admin, "INSERT INTO points SELECT 'k' || g, g, -g FROM generate_series(1, 2000) g")
	mustExec(t, admin, "SELECT lattice_create_tree('points', 'k', shard_count => 2)")
	mustExec(t, admin, "SELECT lattice_reshard('points', 3)")
	pollUntil(t, time.Minute, "the reshard to complete", func() (bool, error) {
		var phase, lastError string
		var complete bool
		err := admin.QueryRow(ctx, "SELECT phase, coalesce(last_error, ''), lattice_reshard_complete('points') FROM lattice_reshard_status('points')").Scan(&phase, &lastError, &complete)
		if phase == "verify_failed" {
			t.Fatalf("the move stopped in verify_failed: %s", lastError)
		}
		return complete, err
	})
}
