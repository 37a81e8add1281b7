package proxy

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lattice-db/lattice/sqlstate"
)

// Memory of client messages in flight.
//
// pgproto3's Backend allocates a message's whole body as soon as it has
// read the header, before the body arrives: a header claiming 64 MB costs
// 64 MB at once, and a thousand silent clients would cost 64 GB. Bodies up
// to smallBody go that way (bounded per connection); a larger one is read
// by bodyReader first, as it arrives, charged to one Budget shared by every
// session, and only then handed to the Backend. Past the budget the session
// ends with 53200 and the others go on.

// smallBody is the largest body the Backend may allocate on its header
// alone: every query and bind of ordinary size.
const smallBody = 64 << 10

// DefaultMaxMessageMemory is the default Budget: bodies of large client
// messages held at once across all sessions.
const DefaultMaxMessageMemory = 256 << 20

// Budget bounds the bytes of large client message bodies in flight.
type Budget struct {
	limit int64
	used  atomic.Int64
}

// NewBudget is a budget of limit bytes; 0 means DefaultMaxMessageMemory.
func NewBudget(limit int64) *Budget {
	if limit <= 0 {
		limit = DefaultMaxMessageMemory
	}
	return &Budget{limit: limit}
}

// Used is the bytes charged now.
func (b *Budget) Used() int64 { return b.used.Load() }

func (b *Budget) take(n int64) bool {
	if b.used.Add(n) > b.limit {
		b.used.Add(-n)
		return false
	}
	return true
}

func (b *Budget) give(n int64) { b.used.Add(-n) }

// bodyReader is what a session's Backend reads the client through: it
// follows the message framing (type byte, length, body), passes small
// messages through and holds back a large one until its body is complete.
type bodyReader struct {
	// r buffers the connection: the framing reads a header and then a
	// body, and unbuffered that is two system calls per message, ten for
	// an extended-protocol statement (Parse, Bind, Describe, Execute,
	// Sync) that arrived in one packet.
	r      *bufio.Reader
	budget *Budget
	// maxBody is the Backend's own bound (SetMaxBodyLen): a longer body
	// is passed to it unread, for it to refuse.
	maxBody int

	pending []byte  // bytes to hand out before reading on: a header, or a whole large message
	hdr     [5]byte // pending's array for a header
	through int     // body bytes of a small message still to pass straight through
	// backendHeld is charged for the Backend's own copy of the last large
	// message, which it keeps until it reads the next header.
	backendHeld int64
	err         error
}

// readBuffer is the size of a session's read buffer, pgproto3's own
// chunk size: a pipeline of ordinary statements is read in one call.
const readBuffer = 8 << 10

func newBodyReader(r io.Reader, budget *Budget) *bodyReader {
	return &bodyReader{r: bufio.NewReaderSize(r, readBuffer), budget: budget, maxBody: DefaultMaxMessageSize}
}

func (br *bodyReader) Read(p []byte) (int, error) {
	if br.err != nil {
		return 0, br.err
	}
	if len(br.pending) > 0 {
		n := copy(p, br.pending)
		br.pending = br.pending[n:]
		if len(br.pending) == 0 {
			br.pending = nil
		}
		return n, nil
	}
	if br.through > 0 {
		n, err := br.r.Read(p[:min(len(p), br.through)])
		br.through -= n
		return n, err
	}
	if err := br.next(); err != nil {
		br.err = err
		return 0, err
	}
	return br.Read(p)
}

// next reads the header of the next message, and the whole body of a large
// one.
func (br *bodyReader) next() error {
	hdr := &br.hdr
	if _, err := io.ReadFull(br.r, hdr[:]); err != nil {
		return err
	}
	// The Backend is past the last large message: it reads this header.
	br.budget.give(br.backendHeld)
	br.backendHeld = 0
	body := int(int32(binary.BigEndian.Uint32(hdr[1:]))) - 4
	if body <= smallBody || body > br.maxBody {
		// Small, or a length the Backend refuses itself.
		br.pending = hdr[:]
		br.through = max(body, 0)
		return nil
	}
	return br.readLarge(*hdr, body)
}

// readLarge reads a large body as it arrives, charging the budget for what
// it holds, then charges the Backend's copy too.
func (br *bodyReader) readLarge(hdr [5]byte, body int) error {
	const step = 64 << 10
	buf := make([]byte, 0, 5+step)
	buf = append(buf, hdr[:]...)
	var held int64
	defer func() { br.budget.give(held) }()
	for len(buf)-5 < body {
		grow := min(step, body-(len(buf)-5))
		if !br.budget.take(int64(grow)) {
			return br.overBudget(body)
		}
		held += int64(grow)
		buf = append(buf, make([]byte, grow)...)
		if _, err := io.ReadFull(br.r, buf[len(buf)-grow:]); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
	}
	if !br.budget.take(int64(body)) {
		return br.overBudget(body)
	}
	br.backendHeld = int64(body)
	br.pending = buf
	return nil
}

func (br *bodyReader) overBudget(body int) error {
	e := sqlstate.Fatal(sqlstate.OutOfMemory, "out of memory: a message of %d bytes does not fit in what the proxy holds for large client messages (%d bytes, the --max-message-memory limit)", body, br.budget.limit)
	e.Detail = fmt.Sprintf("Messages over %d bytes are held in the proxy until they are complete; those of every session share --max-message-memory.", smallBody)
	e.Hint = "Send smaller messages (split large COPY rows or parameters), or raise --max-message-memory."
	return e
}

// setMaxBody sets the bound on message bodies of b, which reads through
// br (nil: b reads the connection itself).
func setMaxBody(b *pgproto3.Backend, br *bodyReader, n int) {
	b.SetMaxBodyLen(n)
	if br != nil {
		br.maxBody = n
	}
}

// buffered reports whether bytes read from the connection wait to be
// handed out: the client sent more than the messages read so far.
func (br *bodyReader) buffered() bool {
	return len(br.pending) > 0 || br.through > 0 || br.r.Buffered() > 0
}

// dropBuffered drops the bytes read from the connection and not handed
// out yet, and reports how many.
func (br *bodyReader) dropBuffered() int {
	if br == nil {
		return 0
	}
	n, _ := br.r.Discard(br.r.Buffered())
	return n
}

// release gives back what the reader still holds, when the session ends.
func (br *bodyReader) release() {
	if br == nil {
		return
	}
	br.budget.give(br.backendHeld)
	br.backendHeld = 0
}

// Bounds on what a session keeps between messages: each statement holds
// its text and plan, each portal its statement's state.
const (
	DefaultMaxPreparedStatements = 10000
	DefaultMaxPortals            = 1000
)

// stmtRoom refuses a new named statement past --max-prepared-statements;
// the unnamed one replaces itself.
func (s *session) stmtRoom(name string) error {
	if _, ok := s.stmts[name]; ok || name == "" || len(s.stmts) < s.srv.cfg.MaxPreparedStatements {
		return nil
	}
	e := sqlstate.New(sqlstate.ProgramLimitExceeded, "too many prepared statements in this session (%d, the --max-prepared-statements limit)", s.srv.cfg.MaxPreparedStatements)
	e.Hint = "Close statements the session no longer uses (or bound the driver's statement cache), or raise --max-prepared-statements."
	return e
}

// portalRoom refuses a new named portal past --max-portals.
func (s *session) portalRoom(name string) error {
	if _, ok := s.portals[name]; ok || name == "" || len(s.portals) < s.srv.cfg.MaxPortals {
		return nil
	}
	e := sqlstate.New(sqlstate.ProgramLimitExceeded, "too many open portals in this session (%d, the --max-portals limit)", s.srv.cfg.MaxPortals)
	e.Hint = "Close portals once their rows are read, or raise --max-portals."
	return e
}
