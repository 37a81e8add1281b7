package proxy

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lattice-db/lattice/sqlstate"
)

const (
	DefaultStartupTimeout = 10 * time.Second
	// DefaultMaxMessageSize bounds each client message after startup. It
	// leaves room for large Bind parameters and COPY rows; PostgreSQL's own
	// limit is 1 GB.
	DefaultMaxMessageSize = 64 << 20

	// maxStartupPacket is PostgreSQL's MAX_STARTUP_PACKET_LENGTH.
	maxStartupPacket = 10000
)

// Codes a client sends in place of a protocol version in its first packet.
const (
	cancelRequestCode = 80877102
	sslRequestCode    = 80877103
	gssEncRequestCode = 80877104
)

// StartupConfig configures Handshake.
type StartupConfig struct {
	Users          *Users        // nil: trust every user, for every database
	StartupTimeout time.Duration // to finish startup and authentication; 0: DefaultStartupTimeout
	MaxMessageSize int           // bound on each client message after startup; 0: DefaultMaxMessageSize
	ServerVersion  string        // for the caller's ParameterStatus server_version; Handshake does not send it
	// TLS, when set, is offered to a client that sends SSLRequest; nil
	// answers it 'N' and the client goes on in plain text or gives up.
	TLS *tls.Config
	// TLSRequired refuses a client that starts without TLS (28000).
	TLSRequired bool
	// Budget bounds the large message bodies held at once across
	// connections (inflight.go); nil reads each message as pgproto3 does.
	Budget *Budget
}

// Startup is a client connection that has completed startup and
// authentication, or a cancel request.
type Startup struct {
	// Backend reads the client's messages, bounded by MaxMessageSize, and
	// writes to it.
	Backend *pgproto3.Backend
	// Conn is the connection Backend uses: a *tls.Conn over the accepted
	// one when the client asked for TLS.
	Conn     net.Conn
	User     string
	Database string // the tenant; the user name when the client gave none
	// Params holds every other startup parameter (application_name,
	// client_encoding, options...), but no protocol option (_pq_.*).
	Params map[string]string

	// Cancel is set, and nothing else, when the connection was a
	// CancelRequest; the caller then closes it, sending nothing.
	Cancel *CancelKey

	reader *bodyReader // what Backend reads through, nil without a Budget
}

// Close gives back the budget the connection's reader still holds.
func (s *Startup) Close() { s.reader.release() }

// CancelKey identifies a session to cancel: what the proxy sent the client
// in BackendKeyData.
type CancelKey struct {
	ProcessID, SecretKey uint32
}

// Handshake runs the start of a client connection: it answers SSLRequest
// with 'S' and a TLS handshake when cfg.TLS is set, else with 'N', and
// GSSENCRequest with 'N', reads the StartupMessage, speaks
// protocol 3.0 (a client asking for a newer 3.x gets NegotiateProtocolVersion
// and goes on in 3.0), authenticates the user (trust when cfg.Users is nil,
// else SCRAM-SHA-256, and SCRAM-SHA-256-PLUS over TLS), checks the user is granted the database, and sends
// AuthenticationOk. The caller then sends ParameterStatus, BackendKeyData and
// ReadyForQuery.
//
// On failure it sends the client an ErrorResponse with PostgreSQL's SQLSTATE
// (28P01 for a wrong password or unknown user alike, 28000 for a database not
// granted or a plain connection under TLSRequired, 08P01 for a malformed or
// oversized message, 0A000 for an
// unsupported protocol or a replication connection) and returns an error
// holding that *sqlstate.Error (see sqlstate.As); the caller closes conn. The error
// matches io.EOF when the client sent nothing at all (a port probe), and
// os.ErrDeadlineExceeded when it did not finish within cfg.StartupTimeout;
// such clients are sent nothing. Cancelling ctx abandons the handshake.
func Handshake(ctx context.Context, conn net.Conn, cfg StartupConfig) (*Startup, error) {
	if cfg.StartupTimeout <= 0 {
		cfg.StartupTimeout = DefaultStartupTimeout
	}
	if cfg.MaxMessageSize <= 0 {
		cfg.MaxMessageSize = DefaultMaxMessageSize
	}
	if err := conn.SetDeadline(time.Now().Add(cfg.StartupTimeout)); err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })

	c := &startupConn{conn: conn, budget: cfg.Budget}
	s, err := handshake(c, cfg)
	if s != nil {
		s.reader = c.br
	}
	if !stop() {
		return nil, fmt.Errorf("startup abandoned: %w", context.Cause(ctx))
	}
	if err != nil {
		if e := (*sqlstate.Error)(nil); errors.As(err, &e) {
			b := c.backend()
			b.Send(e.Response())
			b.Flush() // the client may be gone; the error to return is err
		}
		if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
			return nil, fmt.Errorf("startup not completed within %v: %w", cfg.StartupTimeout, err)
		}
		return nil, err
	}
	if err := conn.SetDeadline(time.Time{}); err != nil {
		return nil, err
	}
	return s, nil
}

// startupConn is the client connection during startup: plain, then TLS
// once the client asked for it; its Backend is made on first use, so that
// nothing is read ahead of a TLS handshake.
type startupConn struct {
	conn    net.Conn
	budget  *Budget
	b       *pgproto3.Backend
	br      *bodyReader
	secured bool
	// endPoint is the TLS channel-binding data (endpoint.go), nil without
	// TLS.
	endPoint []byte
}

func (c *startupConn) backend() *pgproto3.Backend {
	if c.b == nil {
		var r io.Reader = c.conn
		if c.budget != nil {
			c.br = newBodyReader(c.conn, c.budget)
			r = c.br
		}
		c.b = pgproto3.NewBackend(r, c.conn)
	}
	return c.b
}

// startTLS answers an SSLRequest with 'S' and runs the TLS handshake.
func (c *startupConn) startTLS(cfg *tls.Config) error {
	if _, err := c.conn.Write([]byte{'S'}); err != nil {
		return err
	}
	var cert *tls.Certificate
	tc := tls.Server(c.conn, recordCertificate(cfg, &cert))
	// The deadline set on the accepted connection bounds the handshake.
	if err := tc.Handshake(); err != nil {
		return fmt.Errorf("TLS handshake: %w", err)
	}
	c.conn, c.secured, c.endPoint = tc, true, endPointBinding(cert)
	return nil
}

func handshake(c *startupConn, cfg StartupConfig) (*Startup, error) {
	asked := make(map[uint32]bool) // encryption requests, each allowed once
	for {
		// Read from the connection, not a Backend: a Backend buffers, and
		// nothing the client sends after an SSLRequest may be read ahead
		// of the TLS handshake.
		pkt, err := readStartupPacket(c.conn)
		if err != nil {
			return nil, err
		}
		switch code := binary.BigEndian.Uint32(pkt); code {
		case sslRequestCode, gssEncRequestCode:
			if asked[code] || len(pkt) != 4 || c.secured {
				return nil, sqlstate.Fatal(sqlstate.ProtocolViolation, "invalid encryption request")
			}
			asked[code] = true
			if code == sslRequestCode && cfg.TLS != nil {
				if err := c.startTLS(cfg.TLS); err != nil {
					return nil, err
				}
				continue
			}
			// No GSSAPI encryption, nor TLS without a certificate: the
			// client goes on in plain text or gives up, as its sslmode says.
			if _, err := c.conn.Write([]byte{'N'}); err != nil {
				return nil, err
			}
		case cancelRequestCode:
			// A 3.0 cancel key is 4 bytes, the only kind the proxy hands out.
			if len(pkt) != 12 {
				return nil, errors.New("invalid length of cancel request")
			}
			return &Startup{Cancel: &CancelKey{
				ProcessID: binary.BigEndian.Uint32(pkt[4:]),
				SecretKey: binary.BigEndian.Uint32(pkt[8:]),
			}}, nil
		default:
			if cfg.TLSRequired && !c.secured {
				e := sqlstate.Fatal(sqlstate.InvalidAuthorizationSpecification, "TLS required: this server accepts only encrypted connections")
				e.Hint = "Connect with sslmode=require (or verify-full)."
				return nil, e
			}
			b := c.backend()
			s, err := startupMessage(b, c.br, code, pkt[4:], c.endPoint, cfg)
			if s != nil {
				s.Conn = c.conn
			}
			return s, err
		}
	}
}

// readStartupPacket reads a length-prefixed packet that has no type byte and
// returns it without the length.
func readStartupPacket(r io.Reader) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, fmt.Errorf("reading startup packet: %w", err)
	}
	if hdr[0] == 0x16 {
		// A TLS ClientHello: the client would not understand an ErrorResponse.
		return nil, errors.New("client started TLS without SSLRequest (sslnegotiation=direct), which is not supported")
	}
	n := int(int32(binary.BigEndian.Uint32(hdr[:]))) - 4
	if n < 4 || n > maxStartupPacket {
		return nil, sqlstate.Fatal(sqlstate.ProtocolViolation, "invalid length of startup packet")
	}
	pkt := make([]byte, n)
	if _, err := io.ReadFull(r, pkt); err != nil {
		return nil, fmt.Errorf("reading startup packet: %w", err)
	}
	return pkt, nil
}

// startupMessage handles a StartupMessage of the given protocol version whose
// parameters are params.
func startupMessage(b *pgproto3.Backend, br *bodyReader, version uint32, params []byte, endPoint []byte, cfg StartupConfig) (*Startup, error) {
	if major, minor := version>>16, version&0xffff; major != 3 {
		return nil, sqlstate.Fatal(sqlstate.FeatureNotSupported, "unsupported frontend protocol %d.%d: server supports 3.0", major, minor)
	}
	p, err := parseStartupParams(params)
	if err != nil {
		return nil, err
	}
	var unsupported []string
	for k := range p {
		if strings.HasPrefix(k, "_pq_.") {
			unsupported = append(unsupported, k)
			delete(p, k)
		}
	}
	if version != pgproto3.ProtocolVersion30 || len(unsupported) > 0 {
		slices.Sort(unsupported)
		// Like PostgreSQL, send the full version number (libpq reads it so;
		// pgconn reads the minor part).
		b.Send(&pgproto3.NegotiateProtocolVersion{
			NewestMinorProtocol: pgproto3.ProtocolVersion30,
			UnrecognizedOptions: unsupported,
		})
	}

	user, database := p["user"], p["database"]
	if user == "" {
		return nil, sqlstate.Fatal(sqlstate.InvalidAuthorizationSpecification, "no PostgreSQL user name specified in startup packet")
	}
	if database == "" {
		database = user
	}
	if r, ok := p["replication"]; ok && !isFalse(r) {
		e := sqlstate.Fatal(sqlstate.FeatureNotSupported, "replication connections are not supported")
		e.Hint = "Connect to a node directly for replication."
		return nil, e
	}
	delete(p, "user")
	delete(p, "database")
	delete(p, "replication")

	if cfg.Users != nil {
		setMaxBody(b, br, min(maxAuthMessage, cfg.MaxMessageSize))
		if err := scramAuth(b, cfg.Users, user, endPoint); err != nil {
			return nil, err
		}
		// Checked only once the user has proved who it is, so grants are
		// not revealed to anyone else.
		if u, _ := cfg.Users.Lookup(user); !u.Allows(database) {
			return nil, sqlstate.Fatal(sqlstate.InvalidAuthorizationSpecification, "user %q is not allowed to connect to database %q", user, database)
		}
	}
	b.Send(&pgproto3.AuthenticationOk{})
	if err := b.Flush(); err != nil {
		return nil, err
	}
	setMaxBody(b, br, cfg.MaxMessageSize)
	return &Startup{Backend: b, User: user, Database: database, Params: p}, nil
}

// parseStartupParams parses the name/value pairs of a StartupMessage: each a
// NUL-terminated string, the list ended by an empty name.
func parseStartupParams(buf []byte) (map[string]string, error) {
	p := make(map[string]string)
	for {
		name, rest, ok := bytes.Cut(buf, []byte{0})
		if !ok {
			break
		}
		if len(name) == 0 {
			if len(rest) != 0 {
				break
			}
			return p, nil
		}
		value, rest, ok := bytes.Cut(rest, []byte{0})
		if !ok {
			break
		}
		p[string(name)] = string(value)
		buf = rest
	}
	return nil, sqlstate.Fatal(sqlstate.ProtocolViolation, "invalid startup packet layout: expected terminator as last byte")
}

// isFalse reports whether v is a PostgreSQL boolean false, the only value of
// the replication parameter that asks for an ordinary connection.
func isFalse(v string) bool {
	switch strings.ToLower(v) {
	case "false", "off", "no", "0", "f", "n":
		return true
	}
	return false
}

// receiveAuthMessage reads the client's next message during authentication.
// A message that breaks the protocol (oversized, unknown, malformed) becomes
// an 08P01 error to send; a connection error is only annotated.
func receiveAuthMessage(b *pgproto3.Backend) (pgproto3.FrontendMessage, error) {
	msg, err := b.Receive()
	if err == nil {
		return msg, nil
	}
	if connLost(err) {
		return nil, fmt.Errorf("reading authentication response: %w", err)
	}
	if tooBig := (*pgproto3.ExceededMaxBodyLenErr)(nil); errors.As(err, &tooBig) {
		return nil, sqlstate.Fatal(sqlstate.ProtocolViolation, "invalid message length")
	}
	return nil, fmt.Errorf("%w: %v", sqlstate.Fatal(sqlstate.ProtocolViolation, "invalid message from client"), err)
}
