package proxy

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lattice-db/lattice/sqlstate"
)

// Server side of SCRAM-SHA-256 (RFC 5802, RFC 7677) as PostgreSQL runs it:
// the user name inside the SCRAM messages is ignored in favour of the
// startup packet's. Over TLS, SCRAM-SHA-256-PLUS is offered too, with
// tls-server-end-point channel binding (RFC 5929), PostgreSQL's only type:
// the client proves it saw the certificate this proxy presented, so a
// man in the middle with another certificate cannot relay the exchange.

const (
	scramMechanism = "SCRAM-SHA-256"
	scramPlus      = scramMechanism + "-PLUS"
	// scramBinding is the channel-binding type of SCRAM-SHA-256-PLUS.
	scramBinding = "tls-server-end-point"
	// maxAuthMessage bounds a client's SASL messages, as PostgreSQL's
	// PG_MAX_AUTH_TOKEN_LENGTH does.
	maxAuthMessage = 65535
	// scramNonceLen is the raw length of the server's nonce, as in PostgreSQL.
	scramNonceLen = 18
)

// scramAuth authenticates user over b with SCRAM-SHA-256 against users, and
// sends AuthenticationSASLFinal on success. An unknown user goes through the
// same exchange with a mock verifier and fails with the same error as a
// wrong password. endPoint is the tls-server-end-point binding data of the
// connection's TLS, nil without TLS: with it SCRAM-SHA-256-PLUS is offered.
func scramAuth(b *pgproto3.Backend, users *Users, user string, endPoint []byte) error {
	u, known := users.Lookup(user)
	x := scramExchange{endPoint: endPoint}
	if known {
		x.verifier = u.verifier
	} else {
		x.verifier = users.mockVerifier(user)
	}

	mechanisms := []string{scramMechanism}
	if endPoint != nil {
		mechanisms = []string{scramPlus, scramMechanism} // PostgreSQL's order
	}
	b.Send(&pgproto3.AuthenticationSASL{AuthMechanisms: mechanisms})
	if err := b.Flush(); err != nil {
		return err
	}
	// Tells b how to decode the client's next 'p' message.
	if err := b.SetAuthType(pgproto3.AuthTypeSASL); err != nil {
		return err
	}
	msg, err := receiveAuthMessage(b)
	if err != nil {
		return err
	}
	initial, ok := msg.(*pgproto3.SASLInitialResponse)
	if !ok {
		return sqlstate.Fatal(sqlstate.ProtocolViolation, "expected SASL response, got %T", msg)
	}
	switch {
	case initial.AuthMechanism == scramMechanism:
	case initial.AuthMechanism == scramPlus && endPoint != nil:
		x.plus = true
	default:
		return sqlstate.Fatal(sqlstate.ProtocolViolation, "client selected an invalid SASL authentication mechanism")
	}
	nonce := make([]byte, scramNonceLen)
	rand.Read(nonce)
	serverFirst, err := x.first(string(initial.Data), base64.StdEncoding.EncodeToString(nonce))
	if err != nil {
		return err
	}

	b.Send(&pgproto3.AuthenticationSASLContinue{Data: []byte(serverFirst)})
	if err := b.Flush(); err != nil {
		return err
	}
	if err := b.SetAuthType(pgproto3.AuthTypeSASLContinue); err != nil {
		return err
	}
	if msg, err = receiveAuthMessage(b); err != nil {
		return err
	}
	resp, ok := msg.(*pgproto3.SASLResponse)
	if !ok {
		return sqlstate.Fatal(sqlstate.ProtocolViolation, "expected SASL response, got %T", msg)
	}
	serverFinal, proved, err := x.final(string(resp.Data))
	if err != nil {
		return err
	}
	if !known || !proved {
		reason := "wrong password"
		if !known {
			reason = "no such user in the users file"
		}
		// The client sees only the message, the same for both reasons.
		return fmt.Errorf("%w: %s", sqlstate.Fatal(sqlstate.InvalidPassword, "password authentication failed for user %q", user), reason)
	}

	b.Send(&pgproto3.AuthenticationSASLFinal{Data: []byte(serverFinal)})
	return nil
}

// scramExchange holds the state between the two client messages.
type scramExchange struct {
	verifier scramVerifier
	endPoint []byte // the connection's channel-binding data; nil without TLS
	plus     bool   // the client chose SCRAM-SHA-256-PLUS
	// gs2Header is "n,,", "y,," or "p=tls-server-end-point,,".
	gs2Header       string
	clientFirstBare string
	serverFirst     string
	nonce           string // client's then server's
}

// first takes the client-first-message and returns the server-first-message.
func (x *scramExchange) first(msg, serverNonce string) (string, error) {
	flag, rest, _ := strings.Cut(msg, ",")
	switch {
	case strings.HasPrefix(flag, "p="):
		if !x.plus {
			return "", malformedSCRAM("The client selected SCRAM-SHA-256 without channel binding, but the SCRAM message includes channel binding data.")
		}
		if flag[2:] != scramBinding {
			return "", sqlstate.Fatal(sqlstate.ProtocolViolation, "unsupported SCRAM channel-binding type %q", flag[2:])
		}
	case flag == "n", flag == "y":
		if x.plus {
			return "", malformedSCRAM("The client selected SCRAM-SHA-256-PLUS, but the SCRAM message does not include channel binding data.")
		}
		// y: the client can bind but thinks the server cannot. Over TLS
		// the server can, so someone in between removed the -PLUS offer.
		if flag == "y" && x.endPoint != nil {
			return "", sqlstate.Fatal(sqlstate.ProtocolViolation, "SCRAM channel binding negotiation error").
				WithDetail("The client supports SCRAM channel binding but thinks the server does not. However, this server does support channel binding.")
		}
	default:
		return "", malformedSCRAM("unexpected channel-binding flag")
	}
	if strings.HasPrefix(rest, "a=") {
		return "", sqlstate.Fatal(sqlstate.FeatureNotSupported, "client uses authorization identity, but it is not supported")
	}
	if !strings.HasPrefix(rest, ",") {
		return "", malformedSCRAM("unexpected attribute in client-first-message")
	}
	x.gs2Header = flag + ",,"
	x.clientFirstBare = rest[1:]

	attrs := strings.Split(x.clientFirstBare, ",")
	if strings.HasPrefix(attrs[0], "m=") {
		return "", sqlstate.Fatal(sqlstate.FeatureNotSupported, "client requires an unsupported SCRAM extension")
	}
	if len(attrs) < 2 || !strings.HasPrefix(attrs[0], "n=") || !strings.HasPrefix(attrs[1], "r=") {
		return "", malformedSCRAM("client-first-message must start with n= and r=")
	}
	clientNonce := attrs[1][2:]
	if !validNonce(clientNonce) {
		return "", malformedSCRAM("client nonce is empty or has characters other than printable ASCII")
	}
	if err := checkExtensions(attrs[2:]); err != nil {
		return "", err
	}

	x.nonce = clientNonce + serverNonce
	x.serverFirst = "r=" + x.nonce + ",s=" + base64.StdEncoding.EncodeToString(x.verifier.salt) +
		",i=" + strconv.Itoa(x.verifier.iterations)
	return x.serverFirst, nil
}

// final takes the client-final-message and returns the server-final-message
// and whether the client's proof is right. Only a malformed message is an
// error; a wrong proof is for the caller to report.
func (x *scramExchange) final(msg string) (serverFinal string, proved bool, err error) {
	attrs := strings.Split(msg, ",")
	if len(attrs) < 3 {
		return "", false, malformedSCRAM("client-final-message must have c=, r= and p=")
	}
	cb, ok := strings.CutPrefix(attrs[0], "c=")
	if !ok {
		return "", false, malformedSCRAM("client-final-message must start with c=")
	}
	// c= is the gs2 header of the first message, followed with
	// SCRAM-SHA-256-PLUS by the binding data of the TLS the server sees:
	// a client that saw another certificate sends other data.
	want := x.gs2Header
	if x.plus {
		want += string(x.endPoint)
	}
	if got, err := base64.StdEncoding.Strict().DecodeString(cb); err != nil || !hmac.Equal(got, []byte(want)) {
		return "", false, sqlstate.Fatal(sqlstate.ProtocolViolation, "SCRAM channel binding check failed")
	}
	nonce, ok := strings.CutPrefix(attrs[1], "r=")
	if !ok || nonce != x.nonce {
		return "", false, malformedSCRAM("nonce does not match")
	}
	last := attrs[len(attrs)-1]
	if err := checkExtensions(attrs[2 : len(attrs)-1]); err != nil {
		return "", false, err
	}
	proof64, ok := strings.CutPrefix(last, "p=")
	if !ok {
		return "", false, malformedSCRAM("client-final-message must end with p=")
	}
	proof, err := base64.StdEncoding.Strict().DecodeString(proof64)
	if err != nil || len(proof) != sha256.Size {
		return "", false, malformedSCRAM("malformed proof in client-final-message")
	}

	withoutProof := msg[:len(msg)-len(last)-1]
	authMessage := x.clientFirstBare + "," + x.serverFirst + "," + withoutProof
	// ClientKey = ClientProof XOR HMAC(StoredKey, AuthMessage); the proof is
	// right if H(ClientKey) is StoredKey.
	clientKey := hmacSHA256(x.verifier.storedKey, authMessage)
	subtle.XORBytes(clientKey, clientKey, proof)
	hashed := sha256.Sum256(clientKey)
	proved = hmac.Equal(hashed[:], x.verifier.storedKey)
	return "v=" + base64.StdEncoding.EncodeToString(hmacSHA256(x.verifier.serverKey, authMessage)), proved, nil
}

// validNonce reports whether s is a non-empty run of printable ASCII other
// than a comma (RFC 5802's "printable").
func validNonce(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e || s[i] == ',' {
			return false
		}
	}
	return true
}

// checkExtensions accepts optional attributes, which PostgreSQL ignores,
// when they are well-formed: a letter, "=", then a value.
func checkExtensions(attrs []string) error {
	for _, a := range attrs {
		if len(a) < 2 || a[1] != '=' || !('a' <= a[0] && a[0] <= 'z' || 'A' <= a[0] && a[0] <= 'Z') {
			return malformedSCRAM("malformed attribute in SCRAM message")
		}
	}
	return nil
}

func malformedSCRAM(detail string) *sqlstate.Error {
	e := sqlstate.Fatal(sqlstate.ProtocolViolation, "malformed SCRAM message")
	e.Detail = detail
	return e
}
