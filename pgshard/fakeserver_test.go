package pgshard

import (
	"net"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
)

// fakeServer accepts one connection, lets it in without a password, and
// answers every simple Query with answer, until answer fails or the
// client goes.
func fakeServer(t *testing.T, answer func(be *pgproto3.Backend) error) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		be := pgproto3.NewBackend(nc, nc)
		if _, err := be.ReceiveStartupMessage(); err != nil {
			return
		}
		be.Send(&pgproto3.AuthenticationOk{})
		be.Send(&pgproto3.BackendKeyData{ProcessID: 7, SecretKey: []byte{1, 2, 3, 4}})
		be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
		for be.Flush() == nil {
			msg, err := be.Receive()
			if err != nil {
				return
			}
			if _, ok := msg.(*pgproto3.Query); ok && answer(be) != nil {
				return
			}
		}
	}()
	return ln.Addr().String()
}
