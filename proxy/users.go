package proxy

import (
	"bufio"
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// Users is a loaded users file: who may connect, with which password, to
// which tenants. It is never modified once loaded, so it is safe for
// concurrent use; reloading means loading a new one.
//
// The file holds one user per line, as three fields separated by spaces or
// tabs:
//
//	name  verifier  tenants
//
// Blank lines and lines whose first non-blank character is # are ignored.
//
// The verifier is PostgreSQL's own SCRAM-SHA-256 password verifier,
//
//	SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>
//
// with salt and keys in base64, exactly as `SELECT rolpassword FROM
// pg_authid WHERE rolname = 'app'` prints it (with password_encryption =
// scram-sha-256, the default since PostgreSQL 14), so an existing role's
// password can be pasted, or one made with `lattice passwd`. The file holds
// no password, but a verifier still allows an offline guessing attack:
// keep the file readable only by the proxy.
//
// Tenants is a comma-separated list of database names the user may connect
// to, or * for every database. For example:
//
//	# name  verifier                                           tenants
//	app     SCRAM-SHA-256$4096:c2FsdA==$r1Jx...=:VvBg...=       shop,shop_staging
//	admin   SCRAM-SHA-256$4096:bW9yZQ==$Mk9z...=:q8Zt...=       *
type Users struct {
	byName  map[string]*User
	mockKey []byte // SetMockSecret; nil: a key of this process
}

// User is one entry of a users file.
type User struct {
	Name     string
	verifier scramVerifier
	tenants  map[string]bool // nil: every tenant
}

// scramVerifier is what the server keeps of a SCRAM-SHA-256 password.
type scramVerifier struct {
	iterations int
	salt       []byte
	storedKey  []byte
	serverKey  []byte
}

const (
	scramPrefix = "SCRAM-SHA-256$"
	// scramIterations is PostgreSQL's default scram_iterations.
	scramIterations = 4096
	scramSaltLen    = 16
)

// LoadUsers reads a users file; see Users for its format. Errors name the
// file and line, never the verifier.
func LoadUsers(path string) (*Users, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseUsers(path, f)
}

func parseUsers(path string, r io.Reader) (*Users, error) {
	users := &Users{byName: make(map[string]*User)}
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20) // a tenant list can be long
	line := 0
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		u, err := parseUser(text)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, line, err)
		}
		if _, dup := users.byName[u.Name]; dup {
			return nil, fmt.Errorf("%s:%d: user %q is listed twice", path, line, u.Name)
		}
		users.byName[u.Name] = u
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s:%d: %w", path, line+1, err)
	}
	return users, nil
}

func parseUser(line string) (*User, error) {
	fields := strings.Fields(line)
	if len(fields) != 3 {
		return nil, fmt.Errorf("want 3 fields (name verifier tenants), got %d", len(fields))
	}
	v, err := parseVerifier(fields[1])
	if err != nil {
		return nil, fmt.Errorf("user %q: %w", fields[0], err)
	}
	u := &User{Name: fields[0], verifier: v}
	if fields[2] == "*" {
		return u, nil
	}
	u.tenants = make(map[string]bool)
	for t := range strings.SplitSeq(fields[2], ",") {
		if t == "" || t == "*" {
			return nil, fmt.Errorf("user %q: tenants must be * alone or a comma-separated list of database names", u.Name)
		}
		u.tenants[t] = true
	}
	return u, nil
}

// parseVerifier parses PostgreSQL's SCRAM-SHA-256 verifier format. Its
// errors say what is wrong without quoting the verifier.
func parseVerifier(s string) (scramVerifier, error) {
	rest, ok := strings.CutPrefix(s, scramPrefix)
	if !ok {
		if strings.HasPrefix(s, "md5") {
			return scramVerifier{}, errors.New("md5 password hashes are not supported: set password_encryption = 'scram-sha-256' in PostgreSQL and set the password again, or use lattice passwd")
		}
		return scramVerifier{}, errors.New("verifier must have the form SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>")
	}
	iterSalt, keys, ok1 := strings.Cut(rest, "$")
	iter, salt64, ok2 := strings.Cut(iterSalt, ":")
	stored64, server64, ok3 := strings.Cut(keys, ":")
	if !ok1 || !ok2 || !ok3 {
		return scramVerifier{}, errors.New("verifier must have the form SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>")
	}
	var v scramVerifier
	var err error
	v.iterations, err = strconv.Atoi(iter)
	if err != nil || v.iterations < 1 || v.iterations > math.MaxInt32 {
		return scramVerifier{}, errors.New("verifier has an invalid iteration count")
	}
	if v.salt, err = base64.StdEncoding.DecodeString(salt64); err != nil || len(v.salt) == 0 {
		return scramVerifier{}, errors.New("verifier has an invalid salt")
	}
	v.storedKey, err = base64.StdEncoding.DecodeString(stored64)
	if err != nil || len(v.storedKey) != sha256.Size {
		return scramVerifier{}, errors.New("verifier has an invalid StoredKey")
	}
	v.serverKey, err = base64.StdEncoding.DecodeString(server64)
	if err != nil || len(v.serverKey) != sha256.Size {
		return scramVerifier{}, errors.New("verifier has an invalid ServerKey")
	}
	return v, nil
}

func (v scramVerifier) String() string {
	enc := base64.StdEncoding
	return scramPrefix + strconv.Itoa(v.iterations) + ":" + enc.EncodeToString(v.salt) +
		"$" + enc.EncodeToString(v.storedKey) + ":" + enc.EncodeToString(v.serverKey)
}

// Lookup returns the user called name.
func (us *Users) Lookup(name string) (*User, bool) {
	u, ok := us.byName[name]
	return u, ok
}

// Allows reports whether u may connect to tenant (a database name).
func (u *User) Allows(tenant string) bool {
	return u.tenants == nil || u.tenants[tenant]
}

// NewVerifier returns the users-file verifier of password, in the form
// PostgreSQL itself would store: a random 16-byte salt and 4096 iterations.
func NewVerifier(password string) (string, error) {
	if password == "" {
		return "", errors.New("empty password")
	}
	if !saslprepStable(password) {
		return "", errors.New("password has characters that clients rewrite before hashing (non-ASCII spaces, invisible characters, " +
			"or text not in Unicode NFKC form): use the rewritten form, or set it in PostgreSQL and copy the verifier from pg_authid")
	}
	salt := make([]byte, scramSaltLen)
	rand.Read(salt)
	v, err := deriveVerifier(password, salt, scramIterations)
	if err != nil {
		return "", err
	}
	return v.String(), nil
}

func deriveVerifier(password string, salt []byte, iterations int) (scramVerifier, error) {
	salted, err := pbkdf2.Key(sha256.New, password, salt, iterations, sha256.Size)
	if err != nil {
		return scramVerifier{}, err
	}
	clientKey := hmacSHA256(salted, "Client Key")
	storedKey := sha256.Sum256(clientKey)
	return scramVerifier{
		iterations: iterations,
		salt:       salt,
		storedKey:  storedKey[:],
		serverKey:  hmacSHA256(salted, "Server Key"),
	}, nil
}

func hmacSHA256(key []byte, msg string) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(msg))
	return h.Sum(nil)
}

// saslprepStable reports whether SASLprep (RFC 4013), which PostgreSQL and
// its clients apply to a password before hashing it, leaves password as it
// is, or gives up on it and uses it as it is. Then the verifier of the raw
// bytes is the one every client will match, without porting SASLprep.
func saslprepStable(password string) bool {
	for _, r := range password {
		if r < utf8.RuneSelf {
			continue // SASLprep passes ASCII through untouched
		}
		if unicode.Is(unicode.Zs, r) || mappedToNothing(r) {
			return false
		}
	}
	return norm.NFKC.IsNormalString(password)
}

// mappedToNothing reports whether SASLprep deletes r (RFC 3454 table B.1).
func mappedToNothing(r rune) bool {
	switch r {
	case 0x00AD, 0x034F, 0x1806, 0x180B, 0x180C, 0x180D, 0x200B, 0x200C, 0x200D, 0x2060, 0xFEFF:
		return true
	}
	return r >= 0xFE00 && r <= 0xFE0F
}
