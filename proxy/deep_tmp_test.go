package proxy

import (
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
)

func TestSeqTmp(t *testing.T) {
	srv := nodelessServer(t)
	for _, qs := range [][]string{
		{"BEGIN", "SAVEPOINT a", "ROLLBACK TO a", "RELEASE a", "COMMIT"},
		{"BEGIN; SAVEPOINT a; ROLLBACK TO a; ROLLBACK TO a; RELEASE a; SAVEPOINT b; RELEASE b; ROLLBACK TO b"},
		{"SAVEPOINT a; ROLLBACK TO a; RELEASE a"},
		{"BEGIN; SAVEPOINT a; SELECT * FROM t WHERE a='k'; ROLLBACK TO a; SELECT 1; COMMIT"},
		{"BEGIN; SAVEPOINT a; SAVEPOINT a; RELEASE a; ROLLBACK TO a; RELEASE a; ROLLBACK TO a"},
		{"BEGIN", "SAVEPOINT a", "SELECT 1/0", "ROLLBACK TO a", "SELECT 1", "COMMIT AND CHAIN", "ROLLBACK TO a", "ROLLBACK AND CHAIN", "SAVEPOINT x", "PREPARE TRANSACTION 'x'"},
		{"BEGIN; ROLLBACK TO a; SAVEPOINT a", "ROLLBACK TO a", "END"},
		{"START TRANSACTION READ ONLY; SAVEPOINT s; DECLARE c CURSOR FOR SELECT * FROM t; FETCH c; ROLLBACK TO s; CLOSE c; COMMIT"},
	} {
		var msgs []pgproto3.FrontendMessage
		for _, q := range qs {
			msgs = append(msgs, &pgproto3.Query{String: q})
		}
		conn := runSession(t, srv, cat(aliceStartup, encode(msgs...)))
		t.Logf("%q", conn.out.Bytes())
	}
}
