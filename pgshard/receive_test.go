package pgshard

import (
	"bytes"
	"errors"
	"io"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
)

// scripted is a Conn whose backend answers with the given messages.
func scripted(t *testing.T, answers ...pgproto3.BackendMessage) *Conn {
	t.Helper()
	var buf []byte
	for _, m := range answers {
		var err error
		if buf, err = m.Encode(buf); err != nil {
			t.Fatal(err)
		}
	}
	return &Conn{
		fe:       pgproto3.NewFrontend(bytes.NewReader(buf), io.Discard),
		Params:   map[string]string{},
		prepared: map[string]string{},
		names:    map[string]string{},
		portals:  map[string]bool{},
	}
}

func TestReceiveTracksState(t *testing.T) {
	errResp := &pgproto3.ErrorResponse{Severity: "ERROR", Code: "22012", Message: "division by zero"}
	for _, tc := range []struct {
		name     string
		answers  []pgproto3.BackendMessage
		send     func(c *Conn)
		prepared []string // keys still prepared
		gone     []string // keys forgotten
		portals  []string
		closed   []string // portals not open
		evicted  int
		broken   bool
	}{
		{
			name: "parses skipped after an error are forgotten",
			send: func(c *Conn) {
				for _, k := range []string{"a", "b", "c"} {
					c.Send(&pgproto3.Parse{Name: c.AddPrepared(k)})
					c.Send(&pgproto3.Bind{PreparedStatement: c.prepared[k]})
					c.Send(&pgproto3.Execute{})
				}
				c.Send(&pgproto3.Sync{})
			},
			answers: []pgproto3.BackendMessage{
				&pgproto3.ParseComplete{}, &pgproto3.BindComplete{}, &pgproto3.CommandComplete{CommandTag: []byte("SELECT 1")},
				&pgproto3.ParseComplete{}, &pgproto3.BindComplete{}, errResp,
				&pgproto3.ReadyForQuery{TxStatus: 'I'},
			},
			prepared: []string{"a", "b"},
			gone:     []string{"c"},
		},
		{
			name: "a failed parse is forgotten",
			send: func(c *Conn) {
				c.Send(&pgproto3.Parse{Name: c.AddPrepared("a")})
				c.Send(&pgproto3.Sync{})
			},
			answers: []pgproto3.BackendMessage{errResp, &pgproto3.ReadyForQuery{TxStatus: 'I'}},
			gone:    []string{"a"},
		},
		{
			name: "a named portal lives until its transaction ends",
			send: func(c *Conn) {
				c.Send(&pgproto3.Bind{DestinationPortal: "p"})
				c.Send(&pgproto3.Bind{DestinationPortal: "q"})
				c.Send(&pgproto3.Close{ObjectType: 'P', Name: "q"})
				c.Send(&pgproto3.Sync{})
			},
			answers: []pgproto3.BackendMessage{&pgproto3.BindComplete{}, &pgproto3.BindComplete{}, &pgproto3.CloseComplete{}, &pgproto3.ReadyForQuery{TxStatus: 'T'}},
			portals: []string{"p"},
			closed:  []string{"q"},
		},
		{
			name: "portals end with the transaction",
			send: func(c *Conn) {
				c.Send(&pgproto3.Bind{DestinationPortal: "p"})
				c.Send(&pgproto3.Sync{})
			},
			answers: []pgproto3.BackendMessage{&pgproto3.BindComplete{}, &pgproto3.ReadyForQuery{TxStatus: 'I'}},
			closed:  []string{"p"},
		},
		{
			name: "a statement whose result type changed is prepared anew",
			send: func(c *Conn) {
				c.AddPrepared("a")
				c.Send(&pgproto3.Bind{PreparedStatement: c.prepared["a"]})
				c.Send(&pgproto3.Sync{})
			},
			answers: []pgproto3.BackendMessage{
				&pgproto3.ErrorResponse{Severity: "ERROR", Code: "0A000", Message: "cached plan must not change result type"},
				&pgproto3.ReadyForQuery{TxStatus: 'I'},
			},
			gone:    []string{"a"},
			evicted: 1,
		},
		{
			name: "DISCARD ALL and DEALLOCATE ALL forget every statement",
			send: func(c *Conn) {
				c.AddPrepared("a")
				c.AddPrepared("b")
				c.Send(&pgproto3.Query{String: "DEALLOCATE ALL"})
			},
			answers: []pgproto3.BackendMessage{&pgproto3.CommandComplete{CommandTag: []byte("DEALLOCATE ALL")}, &pgproto3.ReadyForQuery{TxStatus: 'I'}},
			gone:    []string{"a", "b"},
		},
		{
			name:    "an answer to no request breaks the connection",
			send:    func(c *Conn) { c.Send(&pgproto3.Sync{}) },
			answers: []pgproto3.BackendMessage{&pgproto3.BindComplete{}, &pgproto3.ReadyForQuery{TxStatus: 'I'}},
			broken:  true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := scripted(t, tc.answers...)
			tc.send(c)
			for range tc.answers {
				if _, err := c.Receive(); err != nil {
					t.Fatal(err)
				}
			}
			for _, k := range tc.prepared {
				if _, ok := c.Prepared([]byte(k)); !ok {
					t.Errorf("%q: not prepared, want prepared", k)
				}
			}
			for _, k := range tc.gone {
				if _, ok := c.Prepared([]byte(k)); ok {
					t.Errorf("%q: prepared, want forgotten", k)
				}
			}
			for _, p := range tc.portals {
				if !c.PortalOpen(p) {
					t.Errorf("portal %q: closed, want open", p)
				}
			}
			for _, p := range tc.closed {
				if c.PortalOpen(p) {
					t.Errorf("portal %q: open, want closed", p)
				}
			}
			if n := len(c.TakeEvicted()); n != tc.evicted {
				t.Errorf("%d statements to close, want %d", n, tc.evicted)
			}
			if c.Broken() != tc.broken {
				t.Errorf("broken %v, want %v", c.Broken(), tc.broken)
			}
			if !c.Idle() && !tc.broken {
				t.Errorf("requests left unanswered: %v", c.queued())
			}
		})
	}
}

// TestPendingQueueReused: the requests of statement after statement reuse
// one array, and a pipeline whose queue never empties moves down instead
// of growing, with every answer still matched to its request in order.
func TestPendingQueueReused(t *testing.T) {
	c := scripted(t)
	for i := 0; i < 100; i++ {
		c.push(request{kind: reqBind, name: "p"})
		c.push(request{kind: reqSync})
		c.pop()
		c.pop()
	}
	if cap(c.pending) > 4 || c.head != 0 {
		t.Fatalf("after 100 statements: cap %d, head %d", cap(c.pending), c.head)
	}
	// Two requests always outstanding, 10,000 times over.
	c.push(request{kind: reqParse, name: "s0"})
	for i := 1; i <= 10000; i++ {
		c.push(request{kind: reqParse, name: "s" + strconv.Itoa(i)})
		q := c.queued()
		if len(q) != 2 || q[0].name != "s"+strconv.Itoa(i-1) {
			t.Fatalf("step %d: queued %v", i, q)
		}
		c.pop()
	}
	if cap(c.pending) > 8 {
		t.Fatalf("a never-empty queue grew to cap %d", cap(c.pending))
	}
}

// TestReceiveRefusesReportedSetting: a ParameterStatus that CheckParam
// refuses fails the read and breaks the connection, so that it is closed,
// never pooled; others pass on to the caller.
func TestReceiveRefusesReportedSetting(t *testing.T) {
	refuse := errors.New("refused")
	check := func(name, value string) error {
		if name == "standard_conforming_strings" && value != "on" {
			return refuse
		}
		return nil
	}
	for _, tc := range []struct {
		name  string
		param *pgproto3.ParameterStatus
		want  error
	}{
		{"allowed", &pgproto3.ParameterStatus{Name: "standard_conforming_strings", Value: "on"}, nil},
		{"other setting", &pgproto3.ParameterStatus{Name: "application_name", Value: "x"}, nil},
		{"refused", &pgproto3.ParameterStatus{Name: "standard_conforming_strings", Value: "off"}, refuse},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := scripted(t, tc.param, &pgproto3.ReadyForQuery{TxStatus: 'I'})
			c.checkParam = check
			c.Send(&pgproto3.Query{String: "SELECT f()"})
			_, err := c.Receive()
			if !errors.Is(err, tc.want) || c.Broken() != (tc.want != nil) || !errors.Is(c.Refusal(), tc.want) {
				t.Fatalf("Receive: %v, broken %v, refusal %v; want %v", err, c.Broken(), c.Refusal(), tc.want)
			}
		})
	}
}
