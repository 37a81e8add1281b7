package integration

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/lattice-db/lattice/shardmap"
)

const (
	hashKeysPerType = 100_000
	hashBatch       = 10_000 // keys per round trip
	hashSlots       = shardmap.DefaultSlotCount
	fuzzInputs      = 20_000 // mutated key strings per parsed type
)

// TestHashMatchesPostgres checks the Go port of PostgreSQL's hashing, key
// parsing and slot arithmetic against a live server. Every key travels as
// text and is parsed by PostgreSQL's own input function, so a parsing
// mismatch shows up as a hash mismatch for the known value.
func TestHashMatchesPostgres(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, testNodeDSN(t, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())

	var version, encoding string
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version'), current_setting('server_encoding')").Scan(&version, &encoding); err != nil {
		t.Fatal(err)
	}
	// Keys are printed on mismatch, so a varying seed costs no reproducibility.
	seed := uint64(time.Now().UnixNano())
	t.Logf("PostgreSQL %s, server_encoding %s, key seed %d", version, encoding, seed)
	rng := rand.New(rand.NewPCG(seed, seed>>1))

	t.Run("text", func(t *testing.T) { checkTextHashes(ctx, t, conn, textKeys(rng)) })
	t.Run("int", func(t *testing.T) { checkIntHashes(ctx, t, conn, rng, intKeys(rng)) })
	t.Run("uuid", func(t *testing.T) { checkUUIDHashes(ctx, t, conn, rng, uuidKeys(rng)) })
	t.Run("int input", func(t *testing.T) {
		checkInputAgreement(ctx, t, conn, shardmap.KeyInt, "int8", fuzz(rng, intSeeds(rng), "0123456789+- \t\n\v\f\rxe_.,aA"))
	})
	t.Run("uuid input", func(t *testing.T) {
		checkInputAgreement(ctx, t, conn, shardmap.KeyUUID, "uuid", fuzz(rng, uuidSeeds(rng), "0123456789abcdefABCDEFg-{}() _"))
	})
}

// pgHash is what the server computed for one key.
type pgHash struct{ hash, slot int64 }

// pgHashes evaluates expr (over the text key k) for every key, in batches of
// one query each, together with the slot expression docs/DESIGN.md section 2 prescribes.
func pgHashes(ctx context.Context, t *testing.T, conn *pgx.Conn, expr string, keys []string) []pgHash {
	t.Helper()
	query := fmt.Sprintf(`SELECT h, h & %d FROM (
		SELECT %s AS h, i FROM unnest($1::text[]) WITH ORDINALITY AS u(k, i)) s
		ORDER BY i`, hashSlots-1, expr)
	out := make([]pgHash, 0, len(keys))
	for lo := 0; lo < len(keys); lo += hashBatch {
		batch := keys[lo:min(lo+hashBatch, len(keys))]
		rows, _ := conn.Query(ctx, query, batch)
		var h pgHash
		_, err := pgx.ForEachRow(rows, []any{&h.hash, &h.slot}, func() error {
			out = append(out, h)
			return nil
		})
		if err != nil {
			t.Fatalf("%s over keys %d..%d: %v", expr, lo, lo+len(batch)-1, err)
		}
	}
	if len(out) != len(keys) {
		t.Fatalf("%s: server returned %d hashes for %d keys", expr, len(out), len(keys))
	}
	return out
}

// checkSlot compares the SQL slot expression with SlotOf and with the slot a
// parse of key gave.
func checkSlot(t *testing.T, key string, pg pgHash, slot int, err error) {
	t.Helper()
	if got := shardmap.SlotOf(pg.hash, hashSlots); int64(got) != pg.slot {
		t.Errorf("key %q: SlotOf(%d) = %d, SQL (h & %d) = %d", key, pg.hash, got, hashSlots-1, pg.slot)
	}
	if err != nil {
		t.Errorf("key %q: %v", key, err)
	} else if int64(slot) != pg.slot {
		t.Errorf("key %q: slot %d, PostgreSQL %d", key, slot, pg.slot)
	}
}

func checkTextHashes(ctx context.Context, t *testing.T, conn *pgx.Conn, keys []string) {
	pg := pgHashes(ctx, t, conn, "hashtextextended(k, 0)", keys)
	for i, k := range keys {
		if got := shardmap.HashText([]byte(k)); got != pg[i].hash {
			t.Errorf("text %q (%d bytes): HashText = %d, hashtextextended = %d", k, len(k), got, pg[i].hash)
		}
		slot, err := shardmap.SlotForText(shardmap.KeyText, []byte(k), hashSlots)
		checkSlot(t, k, pg[i], slot, err)
		slot, err = shardmap.SlotForBinary(shardmap.KeyText, []byte(k), hashSlots)
		checkSlot(t, k, pg[i], slot, err)
	}
	t.Logf("%d text keys checked", len(keys))
}

func checkIntHashes(ctx context.Context, t *testing.T, conn *pgx.Conn, rng *rand.Rand, vals []int64) {
	texts := make([]string, len(vals))
	for i, v := range vals {
		texts[i] = intText(rng, v)
	}
	pg := pgHashes(ctx, t, conn, "hashint8extended(k::int8, 0)", texts)
	var b [8]byte
	for i, v := range vals {
		if got := shardmap.HashInt8(v); got != pg[i].hash {
			t.Errorf("int %d (sent as %q): HashInt8 = %d, hashint8extended = %d", v, texts[i], got, pg[i].hash)
		}
		slot, err := shardmap.SlotForText(shardmap.KeyInt, []byte(texts[i]), hashSlots)
		checkSlot(t, texts[i], pg[i], slot, err)
		// Binary parameters arrive at the width of the column's type.
		binary.BigEndian.PutUint64(b[:], uint64(v))
		slot, err = shardmap.SlotForBinary(shardmap.KeyInt, b[:], hashSlots)
		checkSlot(t, texts[i], pg[i], slot, err)
		if v == int64(int32(v)) {
			slot, err = shardmap.SlotForBinary(shardmap.KeyInt, b[4:], hashSlots)
			checkSlot(t, texts[i], pg[i], slot, err)
		}
		if v == int64(int16(v)) {
			slot, err = shardmap.SlotForBinary(shardmap.KeyInt, b[6:], hashSlots)
			checkSlot(t, texts[i], pg[i], slot, err)
		}
	}
	t.Logf("%d int keys checked", len(vals))
}

func checkUUIDHashes(ctx context.Context, t *testing.T, conn *pgx.Conn, rng *rand.Rand, us [][16]byte) {
	texts := make([]string, len(us))
	for i, u := range us {
		texts[i] = uuidText(rng, u)
	}
	pg := pgHashes(ctx, t, conn, "uuid_hash_extended(k::uuid, 0)", texts)
	for i, u := range us {
		if got := shardmap.HashUUID(u); got != pg[i].hash {
			t.Errorf("uuid %x (sent as %q): HashUUID = %d, uuid_hash_extended = %d", u, texts[i], got, pg[i].hash)
		}
		slot, err := shardmap.SlotForText(shardmap.KeyUUID, []byte(texts[i]), hashSlots)
		checkSlot(t, texts[i], pg[i], slot, err)
		slot, err = shardmap.SlotForBinary(shardmap.KeyUUID, u[:], hashSlots)
		checkSlot(t, texts[i], pg[i], slot, err)
	}
	t.Logf("%d uuid keys checked", len(us))
}

// checkInputAgreement feeds inputs, mostly malformed, to PostgreSQL's input
// function for pgType and to SlotForText: both must accept the same strings,
// with the same slot, and reject the rest with the same class of error.
func checkInputAgreement(ctx context.Context, t *testing.T, conn *pgx.Conn, kt shardmap.KeyType, pgType string, inputs []string) {
	hashFn := map[string]string{"int8": "hashint8extended", "uuid": "uuid_hash_extended"}[pgType]
	// PostgreSQL 15 has no pg_input_is_valid; a subtransaction per input
	// keeps one bad input from failing the whole batch.
	fn := "pg_temp.lattice_try_" + pgType
	if _, err := conn.Exec(ctx, fmt.Sprintf(`CREATE FUNCTION %s(k text, OUT h bigint, OUT state text) LANGUAGE plpgsql AS $$
		BEGIN
			h := %s(k::%s, 0);
		EXCEPTION WHEN others THEN
			state := SQLSTATE;
		END $$`, fn, hashFn, pgType)); err != nil {
		t.Fatal(err)
	}
	query := fmt.Sprintf(`SELECT r.h & %d, r.state FROM unnest($1::text[]) WITH ORDINALITY AS u(k, i),
		LATERAL %s(k) r ORDER BY i`, hashSlots-1, fn)
	accepted := 0
	for lo := 0; lo < len(inputs); lo += hashBatch {
		batch := inputs[lo:min(lo+hashBatch, len(inputs))]
		rows, _ := conn.Query(ctx, query, batch)
		i := lo
		var pgSlot *int64
		var state *string
		_, err := pgx.ForEachRow(rows, []any{&pgSlot, &state}, func() error {
			in := inputs[i]
			i++
			slot, err := shardmap.SlotForText(kt, []byte(in), hashSlots)
			switch {
			case state == nil && err != nil:
				t.Errorf("%s %q: PostgreSQL accepts it, Go: %v", pgType, in, err)
			case state == nil && int64(slot) != *pgSlot:
				t.Errorf("%s %q: slot %d, PostgreSQL %d", pgType, in, slot, *pgSlot)
			case state == nil:
				accepted++
			case err == nil:
				t.Errorf("%s %q: PostgreSQL rejects it (%s), Go accepts it (slot %d)", pgType, in, *state, slot)
			// 22003 is numeric_value_out_of_range; the rest is bad syntax.
			case (*state == "22003") != errors.Is(err, shardmap.ErrKeyOutOfRange), !errors.Is(err, shardmap.ErrBadKey):
				t.Errorf("%s %q: PostgreSQL rejects it with %s, Go with %v", pgType, in, *state, err)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("%s inputs %d..%d: %v", pgType, lo, lo+len(batch)-1, err)
		}
		if i != lo+len(batch) {
			t.Fatalf("%s inputs %d..%d: server returned %d rows", pgType, lo, lo+len(batch)-1, i-lo)
		}
	}
	t.Logf("%d %s inputs checked, %d accepted by both", len(inputs), pgType, accepted)
}

// textKeys covers every lookup3 tail length many times, long keys, multibyte
// UTF-8 and key shapes applications use. PostgreSQL text holds no NUL byte.
func textKeys(rng *rand.Rand) []string {
	keys := []string{"", "zz1", " ", "\x7f", "\u0080", "\u07ff", "\u0800", "\uffff", "\U00010000", "\U0010ffff"}
	for n := 0; n <= 64; n++ {
		for range 300 {
			keys = append(keys, asciiString(rng, n))
		}
	}
	for n := 1; n <= 2000; n++ {
		keys = append(keys, asciiString(rng, n))
	}
	for n := 1; n <= 2000; n += 7 {
		keys = append(keys, utf8String(rng, n))
	}
	for range 30_000 {
		keys = append(keys, utf8String(rng, rng.IntN(40)))
	}
	for i := range 5_000 {
		keys = append(keys, fmt.Sprintf("sku-%06d", i), fmt.Sprintf("user%d@example.com", rng.IntN(1e9)))
	}
	for len(keys) < hashKeysPerType {
		keys = append(keys, asciiString(rng, rng.IntN(200)))
	}
	return keys
}

// asciiString is n random bytes in 1..127, control characters included.
func asciiString(rng *rand.Rand, n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(1 + rng.IntN(127))
	}
	return string(b)
}

// utf8String is n random code points of 1 to 4 bytes each.
func utf8String(rng *rand.Rand, n int) string {
	ranges := [][2]rune{{0x01, 0x7f}, {0x80, 0x7ff}, {0x800, 0xd7ff}, {0xe000, 0xffff}, {0x10000, 0x10ffff}}
	b := make([]byte, 0, 4*n)
	for range n {
		r := ranges[rng.IntN(len(ranges))]
		b = utf8.AppendRune(b, r[0]+rng.Int32N(r[1]-r[0]+1))
	}
	return string(b)
}

// intKeys covers zero, ±1, the int2/int4/int8 boundaries and their
// neighbours, powers of two, and random values of every magnitude.
func intKeys(rng *rand.Rand) []int64 {
	vals := []int64{0, 1, -1}
	for _, b := range []int64{math.MaxInt16, math.MinInt16, math.MaxInt32, math.MinInt32, math.MaxInt64 - 1, math.MinInt64 + 1} {
		vals = append(vals, b-1, b, b+1)
	}
	for s := range 63 {
		p := int64(1) << s
		vals = append(vals, p, p-1, -p, -p+1, -p-1)
	}
	vals = append(vals, math.MinInt64)
	for v := int64(-1000); v <= 1000; v++ {
		vals = append(vals, v)
	}
	for range 10_000 {
		vals = append(vals, int64(int16(rng.Uint32())), int64(int32(rng.Uint32())))
	}
	for range 20_000 {
		vals = append(vals, int64(rng.Uint64())>>rng.IntN(64)) // every magnitude, both signs
	}
	for len(vals) < hashKeysPerType {
		vals = append(vals, int64(rng.Uint64()))
	}
	return vals
}

// intText renders v in one of the text forms int8in accepts.
func intText(rng *rand.Rand, v int64) string {
	s := strconv.FormatInt(v, 10)
	switch rng.IntN(6) {
	case 0:
		if v >= 0 {
			s = "+" + s
		}
	case 1:
		zeros := strings.Repeat("0", 1+rng.IntN(20))
		if v < 0 {
			s = "-" + zeros + s[1:]
		} else {
			s = zeros + s
		}
	case 2:
		s = whitespace(rng) + s + whitespace(rng)
	}
	return s
}

func whitespace(rng *rand.Rand) string {
	const ws = " \t\n\v\f\r"
	b := make([]byte, rng.IntN(4))
	for i := range b {
		b[i] = ws[rng.IntN(len(ws))]
	}
	return string(b)
}

// uuidKeys covers all-zero, all-ff, every single bit set and cleared, and
// random bytes (not only version 4).
func uuidKeys(rng *rand.Rand) [][16]byte {
	var zero, ones [16]byte
	for i := range ones {
		ones[i] = 0xff
	}
	us := [][16]byte{zero, ones}
	for bit := range 128 {
		set, clear := zero, ones
		set[bit/8] |= 1 << (bit % 8)
		clear[bit/8] &^= 1 << (bit % 8)
		us = append(us, set, clear)
	}
	for len(us) < hashKeysPerType {
		var u [16]byte
		binary.LittleEndian.PutUint64(u[:], rng.Uint64())
		binary.LittleEndian.PutUint64(u[8:], rng.Uint64())
		us = append(us, u)
	}
	return us
}

// uuidText renders u in one of the text forms uuid_in accepts.
func uuidText(rng *rand.Rand, u [16]byte) string {
	hex := fmt.Sprintf("%x", u[:])
	var s string
	switch rng.IntN(4) {
	case 0: // standard
		s = hex[:8] + "-" + hex[8:12] + "-" + hex[12:16] + "-" + hex[16:20] + "-" + hex[20:]
	case 1: // no hyphens
		s = hex
	default: // a hyphen after any group of four digits, or none
		var b strings.Builder
		for g := 0; g < 32; g += 4 {
			if g > 0 && rng.IntN(2) == 0 {
				b.WriteByte('-')
			}
			b.WriteString(hex[g : g+4])
		}
		s = b.String()
	}
	switch rng.IntN(3) {
	case 0:
		s = strings.ToUpper(s)
	case 1: // mixed case
		b := []byte(s)
		for i := range b {
			if b[i] >= 'a' && rng.IntN(2) == 0 {
				b[i] -= 'a' - 'A'
			}
		}
		s = string(b)
	}
	if rng.IntN(4) == 0 {
		s = "{" + s + "}"
	}
	return s
}

// intSeeds and uuidSeeds are valid inputs, some at the edges, for fuzz to
// mutate.
func intSeeds(rng *rand.Rand) []string {
	seeds := []string{"9223372036854775807", "-9223372036854775808", "9223372036854775808", "-9223372036854775809", "0", "-0", "+0"}
	for range 200 {
		seeds = append(seeds, intText(rng, int64(rng.Uint64())>>rng.IntN(64)))
	}
	return seeds
}

func uuidSeeds(rng *rand.Rand) []string {
	var seeds []string
	for range 200 {
		var u [16]byte
		binary.LittleEndian.PutUint64(u[:], rng.Uint64())
		binary.LittleEndian.PutUint64(u[8:], rng.Uint64())
		seeds = append(seeds, uuidText(rng, u))
	}
	return seeds
}

// fuzz returns the seeds and fuzzInputs strings made from them by one to
// three random deletions, insertions or replacements of alphabet bytes.
func fuzz(rng *rand.Rand, seeds []string, alphabet string) []string {
	out := append([]string(nil), seeds...)
	for len(out) < len(seeds)+fuzzInputs {
		b := []byte(seeds[rng.IntN(len(seeds))])
		for range 1 + rng.IntN(3) {
			c := alphabet[rng.IntN(len(alphabet))]
			i := rng.IntN(len(b) + 1)
			switch op := rng.IntN(3); {
			case op == 0 && i < len(b):
				b = append(b[:i], b[i+1:]...)
			case op == 1 && i < len(b):
				b[i] = c
			default:
				b = append(b[:i], append([]byte{c}, b[i:]...)...)
			}
		}
		out = append(out, string(b))
	}
	return out
}
