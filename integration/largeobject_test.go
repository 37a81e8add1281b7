package integration

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lattice-db/lattice/sqlstate"
)

// PostgreSQL's catalog OIDs of the functions libpq calls by fastpath, and
// of one it does not.
const (
	fnLoOpen    = 952
	fnLoClose   = 953
	fnLoRead    = 954
	fnLoWrite   = 955
	fnLoCreat   = 957
	fnSetConfig = 2078

	invWrite = 0x20000
	invRead  = 0x40000
)

// fastpath sends one FunctionCall with binary arguments and result, as
// libpq's PQfn does, and returns the result and the call's error.
func fastpath(ctx context.Context, pc *pgconn.PgConn, fn uint32, args ...[]byte) ([]byte, error) {
	formats := make([]uint16, len(args))
	for i := range formats {
		formats[i] = 1
	}
	fe := pc.Frontend()
	fe.Send(&pgproto3.FunctionCall{Function: fn, ArgFormatCodes: formats, Arguments: args, ResultFormatCode: 1})
	if err := fe.Flush(); err != nil {
		return nil, err
	}
	var result []byte
	var callErr error
	for {
		msg, err := pc.ReceiveMessage(ctx)
		if err != nil {
			return nil, err
		}
		switch m := msg.(type) {
		case *pgproto3.FunctionCallResponse:
			result = bytes.Clone(m.Result)
		case *pgproto3.ErrorResponse:
			callErr = pgconn.ErrorResponseToPgError(m)
		case *pgproto3.ReadyForQuery:
			return result, callErr
		}
	}
}

func int4Arg(v int32) []byte { return binary.BigEndian.AppendUint32(nil, uint32(v)) }

// TestLargeObjects: libpq's large-object calls (the fastpath FunctionCall
// message) reach the catalog node through the proxy inside the session's
// transaction, one over two nodes included, and commit or roll back with
// it; psql's \lo_import and \lo_export round-trip a file; a fastpath call
// of any other function gets 0A000 and the session goes on.
func TestLargeObjects(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 2)
	ctx := context.Background()
	c := connect(t, p.DSN("lattice"))
	mustExec(t, c, `CREATE TABLE lo_refs (id int PRIMARY KEY, lo oid NOT NULL)`)
	mustExec(t, c, `SELECT lattice_create_tree('lo_refs', 'id', shard_count => 4)`)
	pc := c.PgConn()
	call := func(what string, fn uint32, args ...[]byte) []byte {
		t.Helper()
		res, err := fastpath(ctx, pc, fn, args...)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return res
	}
	refusal := func(what, code string, fn uint32, args ...[]byte) {
		t.Helper()
		if _, err := fastpath(ctx, pc, fn, args...); pgCode(err) != code {
			t.Fatalf("%s: %v, want %s", what, err, code)
		}
	}
	var loOID uint32
	contents := func() []byte {
		t.Helper()
		var b []byte
		if err := c.QueryRow(ctx, `SELECT lo_get($1)`, loOID).Scan(&b); err != nil {
			t.Fatal(err)
		}
		return b
	}

	created := call("lo_creat outside a transaction", fnLoCreat, int4Arg(invRead|invWrite))
	if len(created) != 4 {
		t.Fatalf("lo_creat returned %x, want an oid", created)
	}
	loOID = binary.BigEndian.Uint32(created)

	// Rows of the tree on both nodes and the large object's write commit
	// together (a two-phase commit over the two nodes).
	payload := make([]byte, 100_000)
	_, _ = rand.Read(payload)
	mustExec(t, c, `BEGIN`)
	mustExec(t, c, `INSERT INTO lo_refs VALUES (1, $1), (2, $1), (3, $1), (4, $1), (5, $1), (6, $1), (7, $1), (8, $1)`, loOID)
	fd := call("lo_open", fnLoOpen, created, int4Arg(invWrite))
	if n := call("lowrite", fnLoWrite, fd, payload); binary.BigEndian.Uint32(n) != uint32(len(payload)) {
		t.Fatalf("lowrite wrote %x, want %d bytes", n, len(payload))
	}
	call("lo_close", fnLoClose, fd)
	var nodes int
	if err := c.QueryRow(ctx, `SELECT count(DISTINCT node) FROM lattice_shards('lo_refs')`).Scan(&nodes); err != nil || nodes != 2 {
		t.Fatalf("the tree's shards are on %d nodes (%v), want 2", nodes, err)
	}
	mustExec(t, c, `COMMIT`)
	if got := contents(); !bytes.Equal(got, payload) {
		t.Fatalf("after COMMIT the large object holds %d bytes, want the %d written", len(got), len(payload))
	}

	// Read back by fastpath, then a rolled-back write leaves it as it was.
	mustExec(t, c, `BEGIN`)
	fd = call("lo_open for reading", fnLoOpen, created, int4Arg(invRead))
	if got := call("loread", fnLoRead, fd, int4Arg(int32(len(payload)))); !bytes.Equal(got, payload) {
		t.Fatalf("loread returned %d bytes, want the %d written", len(got), len(payload))
	}
	mustExec(t, c, `INSERT INTO lo_refs VALUES (9, $1)`, loOID)
	fd = call("lo_open for writing", fnLoOpen, created, int4Arg(invWrite))
	call("lowrite", fnLoWrite, fd, []byte("overwritten"))
	mustExec(t, c, `ROLLBACK`)
	var rows int
	if err := c.QueryRow(ctx, `SELECT count(*) FROM lo_refs`).Scan(&rows); err != nil || rows != 8 {
		t.Fatalf("after ROLLBACK lo_refs has %d rows (%v), want 8", rows, err)
	}
	if got := contents(); !bytes.Equal(got, payload) {
		t.Fatal("a rolled-back lowrite changed the large object")
	}

	// As in PostgreSQL: a descriptor lives until its transaction ends, and
	// a failed transaction refuses the call.
	fd = call("lo_open outside a transaction", fnLoOpen, created, int4Arg(invRead))
	refusal("loread of a descriptor whose transaction ended", "42704", fnLoRead, fd, int4Arg(10))
	mustExec(t, c, `BEGIN`)
	if _, err := c.Exec(ctx, `SELECT 1/0`); pgCode(err) != "22012" {
		t.Fatalf("1/0: %v", err)
	}
	refusal("lo_creat in a failed transaction", sqlstate.InFailedSQLTransaction, fnLoCreat, int4Arg(invWrite))
	mustExec(t, c, `ROLLBACK`)

	// Another function could leave state on a pooled backend.
	refusal("set_config by fastpath", sqlstate.FeatureNotSupported, fnSetConfig, []byte("application_name"), []byte("fastpath"), []byte{0})
	var name string
	if err := c.QueryRow(ctx, `SHOW application_name`).Scan(&name); err != nil || name == "fastpath" {
		t.Fatalf("after the refused call application_name is %q (%v)", name, err)
	}

	// psql's \lo_import and \lo_export, which call libpq's lo_* functions.
	dir := t.TempDir()
	in, out := filepath.Join(dir, "in.bin"), filepath.Join(dir, "out.bin")
	if err := os.WriteFile(in, payload, 0o644); err != nil {
		t.Fatal(err)
	}
	runPsqlScript(t, p.DSN("lattice"), []byte("\\lo_import "+in+"\n\\lo_export :LASTOID "+out+"\n"))
	if got, err := os.ReadFile(out); err != nil || !bytes.Equal(got, payload) {
		t.Fatalf("\\lo_export: %d bytes (%v), want the %d \\lo_import wrote", len(got), err, len(payload))
	}
}
