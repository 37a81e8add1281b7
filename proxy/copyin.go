package proxy

import (
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lattice-db/lattice/pgshard"
)

// A client's COPY FROM STDIN to one backend is relayed by a goroutine of
// its own while the session goes on reading the backend, so that an error
// PostgreSQL sends mid-copy (a bad row) reaches the client at once, as it
// would from PostgreSQL: a client such as pgx stops sending then, and one
// that streams without end would otherwise never get to CopyDone.

// copyRelay is the client side of such a COPY.
type copyRelay struct {
	be *pgshard.Conn
	// mu orders the relay's writes to be with the end of the COPY: once
	// over is set, the relay does not touch be again.
	mu   sync.Mutex
	over bool
	// end receives the relay's last read, once: the client's message that
	// followed an ended COPY, which the session serves next, or the
	// client's read error; nothing if the client ended the COPY itself.
	end chan clientRead
}

type clientRead struct {
	msg pgproto3.FrontendMessage
	err error
}

// copyIn starts relaying the client's COPY data to be, after telling the
// client PostgreSQL's CopyInResponse. The caller goes on reading be and
// calls copyOver when the backend ends the COPY.
func (s *session) copyIn(be *pgshard.Conn) error {
	if err := s.flush(); err != nil {
		return errClientGone
	}
	if prev := s.copying; prev != nil {
		// A COPY before it in the same Query, ended by the client: its
		// relay read nothing more.
		<-prev.end
	}
	r := &copyRelay{be: be, end: make(chan clientRead, 1)}
	s.copying = r
	go s.relayCopy(r)
	return nil
}

func (s *session) relayCopy(r *copyRelay) {
	for {
		msg, err := s.client.Receive()
		r.mu.Lock()
		if r.over {
			// The backend ended the COPY: what the client sent is the
			// session's to serve (it ignores leftover COPY messages).
			r.mu.Unlock()
			r.end <- clientRead{msg, err}
			return
		}
		done, ferr := s.relayOne(r.be, msg, err)
		r.mu.Unlock()
		if done || ferr != nil {
			// A backend write error shows when the session reads it.
			if err != nil {
				r.end <- clientRead{nil, err}
			} else {
				r.end <- clientRead{}
			}
			return
		}
	}
}

// relayOne passes one client message of a COPY to be and reports whether
// the client's COPY ended.
func (s *session) relayOne(be *pgshard.Conn, msg pgproto3.FrontendMessage, err error) (bool, error) {
	if err != nil {
		be.Send(&pgproto3.CopyFail{Message: "client connection lost"})
		return true, be.Flush()
	}
	switch m := msg.(type) {
	case *pgproto3.CopyData:
		be.Send(m)
		s.copyBytes += len(m.Data)
		if s.copyBytes > 1<<18 || s.in == nil || !s.in.buffered() {
			// The client paused: PostgreSQL reads what it has so far.
			s.copyBytes = 0
			return false, be.Flush()
		}
		return false, nil
	case *pgproto3.CopyDone, *pgproto3.CopyFail:
		be.Send(m)
		return true, be.Flush()
	case *pgproto3.Flush, *pgproto3.Sync:
		// Ignored during COPY, as PostgreSQL does.
		return false, nil
	}
	be.Send(&pgproto3.CopyFail{Message: fmt.Sprintf("unexpected message %T during COPY", msg)})
	return true, be.Flush()
}

// copyOver notes that be sent a message that ends the COPY (an error, or
// its CommandComplete): the relay leaves be alone from now on.
func (s *session) copyOver(be *pgshard.Conn) {
	if r := s.copying; r != nil && r.be == be {
		r.mu.Lock()
		r.over = true
		r.mu.Unlock()
	}
}

// receive reads the client's next message, taking first the one the COPY
// relay read after its COPY ended.
func (s *session) receive() (pgproto3.FrontendMessage, error) {
	if r := s.copying; r != nil {
		s.copying = nil
		r.mu.Lock()
		r.over = true
		r.mu.Unlock()
		if last := <-r.end; last.msg != nil || last.err != nil {
			return last.msg, last.err
		}
	}
	return s.client.Receive()
}
