package shardmap

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
)

// ErrBadKey is wrapped by every error about a shard key value the proxy
// cannot hash: bad syntax, wrong binary length, or out of range.
var ErrBadKey = errors.New("invalid shard key value")

// ErrKeyOutOfRange is wrapped, together with ErrBadKey, by errors about a
// well-formed integer that does not fit in a bigint; PostgreSQL reports that
// case as 22003 rather than 22P02.
var ErrKeyOutOfRange = fmt.Errorf("%w: out of range for type bigint", ErrBadKey)

// The mix and final steps of Bob Jenkins' lookup3, as PostgreSQL's hashfn.c
// uses them.
func mix(a, b, c uint32) (uint32, uint32, uint32) {
	a -= c
	a ^= bits.RotateLeft32(c, 4)
	c += b
	b -= a
	b ^= bits.RotateLeft32(a, 6)
	a += c
	c -= b
	c ^= bits.RotateLeft32(b, 8)
	b += a
	a -= c
	a ^= bits.RotateLeft32(c, 16)
	c += b
	b -= a
	b ^= bits.RotateLeft32(a, 19)
	a += c
	c -= b
	c ^= bits.RotateLeft32(b, 4)
	b += a
	return a, b, c
}

func final(a, b, c uint32) (uint32, uint32, uint32) {
	c ^= b
	c -= bits.RotateLeft32(b, 14)
	a ^= c
	a -= bits.RotateLeft32(c, 11)
	b ^= a
	b -= bits.RotateLeft32(a, 25)
	c ^= b
	c -= bits.RotateLeft32(b, 16)
	a ^= c
	a -= bits.RotateLeft32(c, 4)
	b ^= a
	b -= bits.RotateLeft32(a, 14)
	c ^= b
	c -= bits.RotateLeft32(b, 24)
	return a, b, c
}

// lookup3Init is the initial state of every PostgreSQL lookup3 hash of an
// n-byte key (the golden ratio plus an arbitrary constant).
func lookup3Init(n int) uint32 { return 0x9e3779b9 + uint32(n) + 3923095 }

// HashBytes is PostgreSQL's hash_bytes_extended (hash_any_extended) as
// computed on a little-endian machine.
func HashBytes(k []byte, seed uint64) uint64 {
	a := lookup3Init(len(k))
	b, c := a, a
	if seed != 0 {
		a += uint32(seed >> 32)
		b += uint32(seed)
		a, b, c = mix(a, b, c)
	}
	for len(k) >= 12 {
		a += binary.LittleEndian.Uint32(k)
		b += binary.LittleEndian.Uint32(k[4:])
		c += binary.LittleEndian.Uint32(k[8:])
		a, b, c = mix(a, b, c)
		k = k[12:]
	}
	// Zero padding adds nothing, so one pass over a padded copy covers every
	// tail length. Tail bytes 8..10 go one byte up in c: PostgreSQL keeps
	// lookup2's habit of leaving c's low byte to the length.
	var t [12]byte
	copy(t[:], k)
	a += binary.LittleEndian.Uint32(t[0:])
	b += binary.LittleEndian.Uint32(t[4:])
	c += binary.LittleEndian.Uint32(t[8:]) << 8
	// Unlike Jenkins' original, PostgreSQL runs final even for an empty tail.
	_, b, c = final(a, b, c)
	return uint64(b)<<32 | uint64(c)
}

// HashText is hashtextextended(s, 0) under a deterministic collation, which
// hashes the bytes of the string in the database encoding.
func HashText(s []byte) int64 { return int64(HashBytes(s, 0)) }

// HashInt8 is hashint8extended(v, 0). PostgreSQL folds the high half into the
// low one so that an int8 hashes like an int2 or int4 of equal value; that is
// why int2 and int4 keys can be hashed as int8.
func HashInt8(v int64) int64 {
	lo, hi := uint32(v), uint32(v>>32)
	if v >= 0 {
		lo ^= hi
	} else {
		lo ^= ^hi
	}
	// hash_uint32_extended with seed 0.
	a := lookup3Init(4) + lo
	b, c := lookup3Init(4), lookup3Init(4)
	_, b, c = final(a, b, c)
	return int64(uint64(b)<<32 | uint64(c))
}

// HashUUID is uuid_hash_extended(u, 0): the 16 bytes in network order.
func HashUUID(u [16]byte) int64 { return int64(HashBytes(u[:], 0)) }

// SlotOf is the virtual slot of hash h, as SQL's (h & (slotCount-1)) on a
// signed bigint; slotCount must be a power of two.
func SlotOf(h int64, slotCount int) int { return int(h & int64(slotCount-1)) }

// SlotForText is the slot of a key value given in PostgreSQL's text format,
// parsed the way the key type's input function (int8in, uuid_in) does.
func SlotForText(kt KeyType, text []byte, slotCount int) (int, error) {
	switch kt {
	case KeyText:
		return SlotOf(HashText(text), slotCount), nil
	case KeyInt:
		v, err := parseInt8(text)
		if err != nil {
			return 0, err
		}
		return SlotOf(HashInt8(v), slotCount), nil
	case KeyUUID:
		u, ok := parseUUID(text)
		if !ok {
			return 0, fmt.Errorf("%w: invalid input syntax for type uuid: %s", ErrBadKey, quoteKey(text))
		}
		return SlotOf(HashUUID(u), slotCount), nil
	}
	return 0, fmt.Errorf("%w %q", ErrUnsupportedKeyType, kt)
}

// SlotForBinary is the slot of a key value given in PostgreSQL's binary
// format: a big-endian int2, int4 or int8, 16 uuid bytes, or raw text bytes.
func SlotForBinary(kt KeyType, b []byte, slotCount int) (int, error) {
	switch kt {
	case KeyText:
		return SlotOf(HashText(b), slotCount), nil
	case KeyInt:
		var v int64
		switch len(b) {
		case 2:
			v = int64(int16(binary.BigEndian.Uint16(b)))
		case 4:
			v = int64(int32(binary.BigEndian.Uint32(b)))
		case 8:
			v = int64(binary.BigEndian.Uint64(b))
		default:
			return 0, fmt.Errorf("%w: binary integer must be 2, 4 or 8 bytes, got %d", ErrBadKey, len(b))
		}
		return SlotOf(HashInt8(v), slotCount), nil
	case KeyUUID:
		if len(b) != 16 {
			return 0, fmt.Errorf("%w: binary uuid must be 16 bytes, got %d", ErrBadKey, len(b))
		}
		return SlotOf(HashUUID([16]byte(b)), slotCount), nil
	}
	return 0, fmt.Errorf("%w %q", ErrUnsupportedKeyType, kt)
}

// isSpace is C isspace() in the C locale, which is what int8in skips.
func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'
}

// parseInt8 accepts what PostgreSQL 15's int8in accepts: optional whitespace,
// an optional sign, decimal digits, optional whitespace.
func parseInt8(s []byte) (int64, error) {
	i := 0
	for i < len(s) && isSpace(s[i]) {
		i++
	}
	neg := false
	if i < len(s) && (s[i] == '-' || s[i] == '+') {
		neg = s[i] == '-'
		i++
	}
	// Like int8in, accumulate up to the negative bound (2^63): passing it is
	// out of range at once, before trailing junk is seen, while the positive
	// bound is checked only after the syntax, so "9223372036854775808x" is a
	// syntax error and "99999999999999999999x" is out of range.
	const bound = uint64(1 << 63)
	start := i
	var m uint64
	for ; i < len(s) && s[i] >= '0' && s[i] <= '9'; i++ {
		d := uint64(s[i] - '0')
		if m > (bound-d)/10 {
			return 0, fmt.Errorf("%w: %s", ErrKeyOutOfRange, quoteKey(s))
		}
		m = m*10 + d
	}
	digits := i > start
	for i < len(s) && isSpace(s[i]) {
		i++
	}
	if !digits || i != len(s) {
		return 0, fmt.Errorf("%w: invalid input syntax for type bigint: %s", ErrBadKey, quoteKey(s))
	}
	if neg {
		return int64(-m), nil
	}
	if m == bound {
		return 0, fmt.Errorf("%w: %s", ErrKeyOutOfRange, quoteKey(s))
	}
	return int64(m), nil
}

// parseUUID accepts what uuid_in accepts: 32 hex digits of either case, an
// optional hyphen after any group of four (except the last), the whole
// optionally wrapped in braces. No whitespace.
func parseUUID(s []byte) (u [16]byte, ok bool) {
	i := 0
	braces := len(s) > 0 && s[0] == '{'
	if braces {
		i++
	}
	for n := range u {
		if i+1 >= len(s) {
			return u, false
		}
		hi, ok1 := unhex(s[i])
		lo, ok2 := unhex(s[i+1])
		if !ok1 || !ok2 {
			return u, false
		}
		u[n] = hi<<4 | lo
		i += 2
		if n%2 == 1 && n < len(u)-1 && i < len(s) && s[i] == '-' {
			i++
		}
	}
	if braces {
		if i >= len(s) || s[i] != '}' {
			return u, false
		}
		i++
	}
	return u, i == len(s)
}

func unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// quoteKey quotes a rejected key for an error message, cut short so that a
// huge value cannot flood logs or the client.
func quoteKey(s []byte) string {
	const maxQuoted = 64
	if len(s) > maxQuoted {
		return fmt.Sprintf("%q... (%d bytes)", s[:maxQuoted], len(s))
	}
	return fmt.Sprintf("%q", s)
}
