package proxy

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/router"
	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// sessionMaxMessage is the message size limit of fuzzed sessions: small, so
// that oversized messages are easy to reach.
const sessionMaxMessage = 4096

// noFunctions has no lattice_* functions.
type noFunctions struct{}

func (noFunctions) Describe(name string) ([]pgproto3.FieldDescription, error) {
	return nil, sqlstate.New("42883", "function %s does not exist", name)
}

func (noFunctions) Call(context.Context, string, string, []*string, map[string]*string) ([][]any, error) {
	return nil, sqlstate.New("42883", "function does not exist")
}

// nodelessServer is a Server whose shard map (an in-process Redis) holds a
// tree t(a text key, b, c) of tenant "fuzz", and whose nodes cannot be
// reached: every statement that needs a backend fails with 08006. What the
// proxy does with client input on its own (protocol, planning, extended
// batches, COPY parsing) runs for real.
func nodelessServer(tb testing.TB) *Server {
	tb.Helper()
	url, stop, err := shardmap.StartEmbedded()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(stop)
	ctx := context.Background()
	store, err := shardmap.OpenRedis(ctx, url)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { store.Close() })
	tree := &shardmap.Tree{Tenant: "fuzz", Name: "t", KeyColumn: "a", KeyType: shardmap.KeyText,
		Columns: []string{"a", "b", "c"}, SlotCount: 64, ShardCount: 4}
	if err := store.CreateTree(ctx, tree, shardmap.NewIdentityMap("fuzz", "t", 64, 4, []string{"n1", "n2"})); err != nil {
		tb.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	pools := pgshard.NewPools(pgshard.PoolConfig{}, func(node, tenant string) (string, error) {
		return "", errors.New("no nodes in this test")
	})
	return NewServer(Config{CatalogNode: "n1", Log: log, Startup: StartupConfig{MaxMessageSize: sessionMaxMessage}},
		shardmap.NewCache(store, time.Hour, log), router.NewPlanner(100), pools, noFunctions{})
}

// dribbleConn is a client that sends a fixed byte string one byte per Read,
// so that the proxy reads exactly what it consumes, and then ends (EOF).
// It records what the proxy writes.
type dribbleConn struct {
	net.Conn // not used
	in       []byte
	read     int
	mu       sync.Mutex
	out      bytes.Buffer
}

func (c *dribbleConn) Read(p []byte) (int, error) {
	if c.read == len(c.in) {
		return 0, io.EOF
	}
	if len(p) == 0 {
		return 0, nil
	}
	p[0] = c.in[c.read]
	c.read++
	return 1, nil
}

func (c *dribbleConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.out.Write(p)
}

func (c *dribbleConn) Close() error                     { return nil }
func (c *dribbleConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *dribbleConn) SetDeadline(time.Time) error      { return nil }
func (c *dribbleConn) SetReadDeadline(time.Time) error  { return nil }
func (c *dribbleConn) SetWriteDeadline(time.Time) error { return nil }

// runSession serves client bytes as serveConn does, from the handshake to
// the end of the session (greet, which needs the catalog node, is replaced
// by default settings), and returns the conn. It fails t when the session
// does not end within a few seconds of the input's end.
func runSession(t *testing.T, srv *Server, client []byte) *dribbleConn {
	t.Helper()
	conn := &dribbleConn{in: client}
	done := make(chan struct{})
	var panicked string
	go func() {
		defer close(done)
		// A panic here would kill the fuzzing process with no input
		// recorded ("terminated unexpectedly"): fail the input instead.
		defer func() {
			if r := recover(); r != nil {
				buf := make([]byte, 64<<10)
				panicked = fmt.Sprintf("%v\n%s", r, buf[:runtime.Stack(buf, false)])
			}
		}()
		ctx := context.Background()
		st, err := Handshake(ctx, conn, srv.cfg.Startup)
		if err != nil || st.Cancel != nil {
			return
		}
		sess := srv.newSession(conn, st)
		params, err := startupSettings(st.Params)
		if err != nil {
			sess.client.Send(sqlstate.As(err).Response())
			_ = sess.client.Flush()
			return
		}
		sess.settings = newSettings(params, map[string]string{})
		sess.client.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
		if sess.flush() != nil {
			return
		}
		defer sess.release()
		sess.loop(ctx)
	}()
	select {
	case <-done:
		if panicked != "" {
			t.Fatalf("the session panicked on input %q: %s", client, panicked)
		}
	case <-time.After(10 * time.Second):
		buf := make([]byte, 1<<20)
		t.Fatalf("session did not end on input %q:\n%s", client, buf[:runtime.Stack(buf, true)])
	}
	return conn
}

// serverMessages decodes what the proxy sent; it fails t on bytes that are
// not a sequence of whole backend messages.
func serverMessages(t *testing.T, out []byte) []pgproto3.BackendMessage {
	t.Helper()
	var msgs []pgproto3.BackendMessage
	for len(out) > 0 {
		if len(out) < 5 || len(out) < 1+int(binary.BigEndian.Uint32(out[1:5])) {
			t.Fatalf("server output ends inside a message after %d messages: %q", len(msgs), out)
		}
		n := 1 + int(binary.BigEndian.Uint32(out[1:5]))
		m, err := pgproto3.NewFrontend(bytes.NewReader(out[:n]), io.Discard).Receive()
		if err != nil {
			t.Fatalf("undecodable server message after %d messages: %v\n%q", len(msgs), err, out[:n])
		}
		out = out[n:]
		msgs = append(msgs, m)
	}
	return msgs
}

var aliceStartup = startupPacket(pgproto3.ProtocolVersion30, "user", "alice", "database", "fuzz")

// msgLen is a message header of type typ declaring length n.
func msgHeader(typ byte, n uint32) []byte {
	return binary.BigEndian.AppendUint32([]byte{typ}, n)
}

// TestSessionProtocolErrors: how a session ends on input that breaks the
// protocol after startup, and on input that does not.
func TestSessionProtocolErrors(t *testing.T) {
	srv := nodelessServer(t)
	cases := []struct {
		name   string
		client []byte
		want   string // the messages after AuthenticationOk and ReadyForQuery
	}{
		{"terminate", encode(&pgproto3.Terminate{}, &pgproto3.Query{String: "SELECT 1"}), ""},
		{"eof", nil, ""},
		{"eof inside a message", []byte("Q\x00\x00\x00\x20SELECT"), ""},
		{"oversized query", cat(msgHeader('Q', sessionMaxMessage+100), bytes.Repeat([]byte("x"), 10)), "FATAL 08P01"},
		{"1 GB declared", msgHeader('Q', 1<<30), "FATAL 08P01"},
		{"length below 4", msgHeader('Q', 3), "FATAL 08P01"},
		{"unknown message type", cat(msgHeader('!', 4)), "FATAL 08P01"},
		{"malformed bind", cat(msgHeader('B', 6), []byte{0, 0}), "FATAL 08P01"},
		{"parse without terminators", cat(msgHeader('P', 6), []byte("00")), "FATAL 08P01"},
		{"password after startup", encode(&pgproto3.PasswordMessage{Password: "x"}), "FATAL 08P01"},
		{"empty query then terminate", encode(&pgproto3.Query{String: ""}, &pgproto3.Terminate{}), "EmptyQueryResponse ReadyForQuery"},
		{"refused statement", encode(&pgproto3.Query{String: "SELECT 1 FROM t FOR UPDATE"}), "ERROR 0A000 ReadyForQuery"},
		{"split insert bound with too few parameters", encode(&pgproto3.Parse{Query: "INSERT INTO t VALUES ($1, $3, 'x'), ($2, 'y', 'z')"},
			&pgproto3.Bind{Parameters: [][]byte{[]byte("k1"), []byte("k2")}}, &pgproto3.Execute{}, &pgproto3.Sync{}), "ParseComplete ERROR 08P01 ReadyForQuery"},
		{"split insert bound with too many parameters", encode(&pgproto3.Parse{Query: "INSERT INTO t VALUES ($1, 'x', 'x'), ($2, 'y', 'z')"},
			&pgproto3.Bind{Parameters: [][]byte{[]byte("k1"), []byte("k2"), []byte("k3")}}, &pgproto3.Execute{}, &pgproto3.Sync{}), "ParseComplete ERROR 08P01 ReadyForQuery"},
		{"more parameter formats than parameters", encode(&pgproto3.Parse{Query: "INSERT INTO t VALUES ($1, 'x', 'x'), ($2, 'y', 'z')"},
			&pgproto3.Bind{ParameterFormatCodes: []int16{0, 0, 0}, Parameters: [][]byte{[]byte("k1"), []byte("k2")}}, &pgproto3.Execute{}, &pgproto3.Sync{}), "ParseComplete ERROR 08P01 ReadyForQuery"},
		{"parse error then sync", encode(&pgproto3.Parse{Query: "SELEC"}, &pgproto3.Bind{}, &pgproto3.Sync{}), "ERROR 42601 ReadyForQuery"},
		{"copy with unreachable node", cat(encode(&pgproto3.Query{String: "COPY t FROM STDIN"}),
			encode(&pgproto3.CopyData{Data: []byte("k\tb\tc\n")}, &pgproto3.CopyDone{})), "CopyInResponse ERROR 08006 ReadyForQuery"},
		{"oversized copy data", cat(encode(&pgproto3.Query{String: "COPY t FROM STDIN"}), msgHeader('d', 1<<30)), "CopyInResponse FATAL 08P01"},
		{"fastpath call of a function that is not a large object's", encode(&pgproto3.FunctionCall{Function: 2078, ArgFormatCodes: []uint16{0},
			Arguments: [][]byte{[]byte("x")}}, &pgproto3.Query{String: ""}), "ERROR 0A000 ReadyForQuery EmptyQueryResponse ReadyForQuery"},
		{"fastpath lo_creat with unreachable node", encode(&pgproto3.FunctionCall{Function: 957, ArgFormatCodes: []uint16{1},
			Arguments: [][]byte{{0, 6, 0, 0}}, ResultFormatCode: 1}), "ERROR 08006 ReadyForQuery"},
		{"bad copy data", cat(encode(&pgproto3.Query{String: "COPY t FROM STDIN (FORMAT csv)"}),
			encode(&pgproto3.CopyData{Data: []byte("\"k\n")}, &pgproto3.CopyDone{})), "CopyInResponse ERROR 22P04 ReadyForQuery"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var before runtime.MemStats
			runtime.ReadMemStats(&before)
			conn := runSession(t, srv, cat(aliceStartup, tc.client))
			var after runtime.MemStats
			runtime.ReadMemStats(&after)
			if grew := after.TotalAlloc - before.TotalAlloc; grew > 16<<20 {
				t.Errorf("the session allocated %d MB", grew>>20)
			}
			msgs := serverMessages(t, conn.out.Bytes())
			var got []string
			for _, m := range msgs[2:] {
				switch m := m.(type) {
				case *pgproto3.ErrorResponse:
					got = append(got, m.Severity+" "+m.Code)
				default:
					got = append(got, strings.TrimPrefix(fmt.Sprintf("%T", m), "*pgproto3."))
				}
			}
			if strings.Join(got, " ") != tc.want {
				t.Fatalf("got %q, want %q", strings.Join(got, " "), tc.want)
			}
		})
	}
}

// FuzzSession runs a session of a client that sends arbitrary bytes after
// a valid startup: simple and extended protocol messages, COPY data, and
// garbage. It checks that the proxy never panics, that the session ends
// once the input does, that all it sends is well-formed with a SQLSTATE on
// every error, and that a session that stops reading before the input's end
// either read a Terminate or told the client why in an ErrorResponse.
func FuzzSession(f *testing.F) {
	seeds := [][]byte{
		nil,
		encode(&pgproto3.Query{String: "SELECT 1"}, &pgproto3.Terminate{}),
		encode(&pgproto3.Query{String: "BEGIN; SELECT * FROM t WHERE a = 'k'; COMMIT"}),
		encode(&pgproto3.Query{String: "SET application_name = 'x'; SHOW application_name; DISCARD ALL"}),
		encode(&pgproto3.Parse{Name: "s", Query: "SELECT * FROM t WHERE a = $1"}, &pgproto3.Bind{PreparedStatement: "s", Parameters: [][]byte{[]byte("k")}},
			&pgproto3.Describe{ObjectType: 'P'}, &pgproto3.Execute{}, &pgproto3.Sync{}),
		encode(&pgproto3.Parse{Query: "INSERT INTO t VALUES ($1, 1, 2), ($2, 3, 4)", ParameterOIDs: []uint32{25, 25}}, &pgproto3.Bind{Parameters: [][]byte{[]byte("a"), nil}},
			&pgproto3.Execute{MaxRows: 1}, &pgproto3.Flush{}, &pgproto3.Close{ObjectType: 'S'}, &pgproto3.Sync{}),
		encode(&pgproto3.Query{String: "COPY t FROM STDIN"}, &pgproto3.CopyData{Data: []byte("k1\tb\tc\nk2\t\\N\tx\n")}, &pgproto3.CopyDone{}, &pgproto3.Query{String: "SELECT 1"}),
		encode(&pgproto3.Query{String: "COPY t (b, a) FROM STDIN (FORMAT csv)"}, &pgproto3.CopyData{Data: []byte("x,\"k\n")}, &pgproto3.CopyFail{Message: "no"}),
		encode(&pgproto3.Query{String: "COPY t FROM STDIN (FORMAT binary)"}, &pgproto3.CopyData{Data: binaryHeader}, &pgproto3.Sync{}, &pgproto3.CopyDone{}),
		encode(&pgproto3.Query{String: "SELECT lattice_shards('t')"}, &pgproto3.Query{String: "SELECT * FROM t"}),
		encode(&pgproto3.Parse{Query: "SELEC"}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{}, &pgproto3.Query{String: ""}),
		cat(encode(&pgproto3.Query{String: "SELECT 1"}), msgHeader('Q', 1<<20)),
		cat(msgHeader('B', 12), []byte{0, 0, 0, 1, 0, 0, 0, 0}),
		encode(&pgproto3.FunctionCall{Function: 952, ArgFormatCodes: []uint16{1, 1}, Arguments: [][]byte{{0, 0, 64, 0}, {0, 2, 0, 0}}, ResultFormatCode: 1},
			&pgproto3.Parse{Query: "SELECT 1"}, &pgproto3.FunctionCall{Function: 1}, &pgproto3.Sync{}),
	}
	for _, s := range seeds {
		f.Add(s)
	}
	srv := nodelessServer(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		client := cat(aliceStartup, data)
		conn := runSession(t, srv, client)
		msgs := serverMessages(t, conn.out.Bytes())
		for _, m := range msgs {
			if e, ok := m.(*pgproto3.ErrorResponse); ok && (len(e.Code) != 5 || e.Message == "") {
				t.Fatalf("ErrorResponse without SQLSTATE or message: %+v", e)
			}
		}
		if conn.read == len(client) {
			return // the client ended the session
		}
		if conn.read >= 5 && bytes.Equal(client[conn.read-5:conn.read], []byte{'X', 0, 0, 0, 4}) {
			return // Terminate
		}
		if len(msgs) > 0 {
			if _, ok := msgs[len(msgs)-1].(*pgproto3.ErrorResponse); ok {
				return
			}
		}
		t.Fatalf("the session stopped reading at byte %d of %d without an ErrorResponse; it sent %d messages", conn.read, len(client), len(msgs))
	})
}
