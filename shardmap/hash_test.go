package shardmap

import (
	"errors"
	"math"
	"strings"
	"testing"
)

// Golden values below were read from PostgreSQL 15.18 on x86-64.

func TestHashText(t *testing.T) {
	tests := []struct {
		in   string
		want int64
	}{
		{"", -6939563903564495251},
		{"a", 3591986179850072241},
		{"abc", -6747756470228489321},
		{"abcd", -1038429303365892052},
		{"abcde", 3076356108696143428},
		{"abcdefgh", -8882191227074733005},
		{"abcdefghi", -3278210106038014113},
		{"abcdefghijk", 3112909444737856467},
		{"abcdefghijkl", -7556637188122330412},
		{"abcdefghijklm", 8871624171452417744},
		{"zz1", 5347316455664159861},
		{"héllo wörld €😀", 7048373469071552362},
	}
	for _, tc := range tests {
		if got := HashText([]byte(tc.in)); got != tc.want {
			t.Errorf("HashText(%q) = %d, want %d", tc.in, got, tc.want)
		}
	}
}

func TestHashBytesSeed(t *testing.T) {
	// hashtextextended(k, seed) for a few seeds, to cover the seeded mix.
	tests := []struct {
		in   string
		seed int64
		want int64
	}{
		{"zz1", 1, 4509147007571975130},
		{"zz1", -1, 5302732298435149514},
		{"zz1", 4294967296, -5537369341338555712},
		{"zz1", 123456789012345, -6750674421290847808},
		{"", 1, -150071773020461347},
		{"", -1, -5142811166230430645},
		{"", 4294967296, 2274062085362124585},
		{"", 123456789012345, 2079315119655201753},
	}
	for _, tc := range tests {
		if got := int64(HashBytes([]byte(tc.in), uint64(tc.seed))); got != tc.want {
			t.Errorf("HashBytes(%q, %d) = %d, want %d", tc.in, tc.seed, got, tc.want)
		}
	}
}

func TestHashInt8(t *testing.T) {
	tests := []struct {
		in   int64
		want int64
	}{
		{0, 4154612158245552303},
		{1, -3670598878359251130},
		{-1, -1888257769727981238},
		{42, 8010225493015854792},
		{math.MaxInt16, 1790040721271588170},
		{math.MinInt16, 8455483389771436374},
		{math.MaxInt32, -9109110466470504941},
		{math.MinInt32, 1977219185673256887},
		// The half folding makes these collide with the int4 bounds.
		{math.MaxInt32 + 1, 1977219185673256887},
		{math.MinInt32 - 1, -9109110466470504941},
		{math.MaxInt64, 1977219185673256887},
		{math.MinInt64, -9109110466470504941},
	}
	for _, tc := range tests {
		if got := HashInt8(tc.in); got != tc.want {
			t.Errorf("HashInt8(%d) = %d, want %d", tc.in, got, tc.want)
		}
	}
}

func TestHashUUID(t *testing.T) {
	tests := []struct {
		in   string
		want int64
	}{
		{"00000000-0000-0000-0000-000000000000", -6859010066814654381},
		{"ffffffff-ffff-ffff-ffff-ffffffffffff", 293445543803463785},
		{"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", 7543054272012930821},
	}
	for _, tc := range tests {
		u, ok := parseUUID([]byte(tc.in))
		if !ok {
			t.Fatalf("parseUUID(%q) failed", tc.in)
		}
		if got := HashUUID(u); got != tc.want {
			t.Errorf("HashUUID(%s) = %d, want %d", tc.in, got, tc.want)
		}
	}
}

func TestSlotOf(t *testing.T) {
	tests := []struct {
		h         int64
		slotCount int
		want      int
	}{
		{0, 4096, 0},
		{4095, 4096, 4095},
		{4096, 4096, 0},
		{-1, 4096, 4095},
		{-4096, 4096, 0},
		{math.MinInt64, 4096, 0},
		{math.MaxInt64, 4096, 4095},
		{8010225493015854792, 4096, 3784},
		{-1888257769727981238, 4096, 2378}, // as PostgreSQL computes it
		{-1, 16, 15},
		{12345, 1, 0},
	}
	for _, tc := range tests {
		if got := SlotOf(tc.h, tc.slotCount); got != tc.want {
			t.Errorf("SlotOf(%d, %d) = %d, want %d", tc.h, tc.slotCount, got, tc.want)
		}
	}
}

func TestParseInt8(t *testing.T) {
	tests := []struct {
		in      string
		want    int64
		wantErr error // nil, ErrBadKey (syntax) or ErrKeyOutOfRange
	}{
		{"0", 0, nil},
		{"42", 42, nil},
		{"-1", -1, nil},
		{"+42", 42, nil},
		{"-0", 0, nil},
		{"007", 7, nil},
		{" 42 ", 42, nil},
		{"\t\n\v\f\r-42\r\n", -42, nil},
		{"9223372036854775807", math.MaxInt64, nil},
		{"-9223372036854775808", math.MinInt64, nil},
		{"0000000000000000000000009223372036854775807", math.MaxInt64, nil},
		{"9223372036854775808", 0, ErrKeyOutOfRange},
		{"9223372036854775808a", 0, ErrBadKey},
		{"-9223372036854775809", 0, ErrKeyOutOfRange},
		{"18446744073709551616", 0, ErrKeyOutOfRange},
		{"99999999999999999999x", 0, ErrKeyOutOfRange}, // int8in sees the overflow first
		{"", 0, ErrBadKey},
		{" ", 0, ErrBadKey},
		{"-", 0, ErrBadKey},
		{"+", 0, ErrBadKey},
		{"- ", 0, ErrBadKey},
		{" +\t", 0, ErrBadKey},
		{"+-1", 0, ErrBadKey},
		{"--1", 0, ErrBadKey},
		{"- 1", 0, ErrBadKey},
		{"4 2", 0, ErrBadKey},
		{"1_000", 0, ErrBadKey},
		{"0x10", 0, ErrBadKey},
		{"1e3", 0, ErrBadKey},
		{"1.0", 0, ErrBadKey},
		{"12a", 0, ErrBadKey},
		{"1\x00", 0, ErrBadKey},
		{"\u00a01", 0, ErrBadKey}, // no-break space is not C whitespace
		{"１２", 0, ErrBadKey},      // fullwidth digits
	}
	for _, tc := range tests {
		got, err := parseInt8([]byte(tc.in))
		switch {
		case tc.wantErr == nil && err != nil:
			t.Errorf("parseInt8(%q): unexpected error %v", tc.in, err)
		case tc.wantErr == nil && got != tc.want:
			t.Errorf("parseInt8(%q) = %d, want %d", tc.in, got, tc.want)
		case tc.wantErr != nil && !errors.Is(err, tc.wantErr):
			t.Errorf("parseInt8(%q) = %d, %v; want error %v", tc.in, got, err, tc.wantErr)
		case tc.wantErr == ErrBadKey && errors.Is(err, ErrKeyOutOfRange):
			t.Errorf("parseInt8(%q): syntax error reported as out of range: %v", tc.in, err)
		}
	}
}

func TestParseUUID(t *testing.T) {
	const canonical = "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"
	want := [16]byte{0xa0, 0xee, 0xbc, 0x99, 0x9c, 0x0b, 0x4e, 0xf8, 0xbb, 0x6d, 0x6b, 0xb9, 0xbd, 0x38, 0x0a, 0x11}
	tests := []struct {
		in string
		ok bool
	}{
		{canonical, true},
		{strings.ToUpper(canonical), true},
		{"A0eeBC99-9c0B-4ef8-bB6d-6bb9Bd380a11", true},
		{"{" + canonical + "}", true},
		{"a0eebc999c0b4ef8bb6d6bb9bd380a11", true},
		{"{a0eebc999c0b4ef8bb6d6bb9bd380a11}", true},
		{"a0ee-bc99-9c0b-4ef8-bb6d-6bb9-bd38-0a11", true},
		{"{a0ee-bc99-9c0b-4ef8-bb6d-6bb9-bd38-0a11}", true},
		{"a0eebc99-9c0b4ef8-bb6d6bb9-bd380a11", true},
		{"a0eebc999c0b-4ef8bb6d6bb9bd380a11", true},
		{"", false},
		{"{}", false},
		{"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a1", false},     // 31 digits
		{"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a111", false},   // 33 digits
		{"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11-", false},   // hyphen after the last group
		{"-a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", false},   // leading hyphen
		{"a0e-ebc999c0b4ef8bb6d6bb9bd380a11", false},       // hyphen inside a group of four
		{"a0ee--bc999c0b4ef8bb6d6bb9bd380a11", false},      // two hyphens
		{"a0eebc999c0b4ef8bb6d6bb9bd380a1-1", false},       // hyphen splitting a byte
		{"{" + canonical, false},                           // unclosed brace
		{canonical + "}", false},                           // brace never opened
		{"{" + canonical + "-}", false},                    // hyphen before the brace
		{"{{" + canonical + "}}", false},                   // nested braces
		{"(" + canonical + ")", false},                     // other brackets
		{" " + canonical, false},                           // no whitespace at all
		{canonical + " ", false},                           //
		{"g0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", false},    // not hex
		{"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a1\x00", false}, // NUL
		{"a0eebc99_9c0b_4ef8_bb6d_6bb9bd380a11", false},    // wrong separator
	}
	for _, tc := range tests {
		got, ok := parseUUID([]byte(tc.in))
		if ok != tc.ok || (ok && got != want) {
			t.Errorf("parseUUID(%q) = %x, %v; want ok=%v", tc.in, got, ok, tc.ok)
		}
	}
}

func TestSlotForText(t *testing.T) {
	uuid := [16]byte{0xa0, 0xee, 0xbc, 0x99, 0x9c, 0x0b, 0x4e, 0xf8, 0xbb, 0x6d, 0x6b, 0xb9, 0xbd, 0x38, 0x0a, 0x11}
	tests := []struct {
		kt      KeyType
		in      string
		want    int
		wantErr error
	}{
		{KeyText, "zz1", SlotOf(5347316455664159861, DefaultSlotCount), nil},
		{KeyText, "", SlotOf(-6939563903564495251, DefaultSlotCount), nil},
		{KeyText, " 42 ", SlotOf(HashText([]byte(" 42 ")), DefaultSlotCount), nil}, // text is never trimmed
		{KeyInt, "42", SlotOf(8010225493015854792, DefaultSlotCount), nil},
		{KeyInt, " -1\n", SlotOf(-1888257769727981238, DefaultSlotCount), nil},
		{KeyInt, "abc", 0, ErrBadKey},
		{KeyInt, "9223372036854775808", 0, ErrKeyOutOfRange},
		{KeyUUID, "{A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11}", SlotOf(HashUUID(uuid), DefaultSlotCount), nil},
		{KeyUUID, "a0eebc99", 0, ErrBadKey},
		{KeyType("float"), "1", 0, ErrUnsupportedKeyType},
	}
	for _, tc := range tests {
		got, err := SlotForText(tc.kt, []byte(tc.in), DefaultSlotCount)
		if !errors.Is(err, tc.wantErr) || (err == nil && got != tc.want) {
			t.Errorf("SlotForText(%s, %q) = %d, %v; want %d, %v", tc.kt, tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}

func TestSlotForBinary(t *testing.T) {
	uuid := []byte{0xa0, 0xee, 0xbc, 0x99, 0x9c, 0x0b, 0x4e, 0xf8, 0xbb, 0x6d, 0x6b, 0xb9, 0xbd, 0x38, 0x0a, 0x11}
	minusOne := SlotOf(-1888257769727981238, DefaultSlotCount)
	tests := []struct {
		kt      KeyType
		in      []byte
		want    int
		wantErr error
	}{
		{KeyText, []byte("zz1"), SlotOf(5347316455664159861, DefaultSlotCount), nil},
		{KeyInt, []byte{0x00, 0x2a}, SlotOf(8010225493015854792, DefaultSlotCount), nil},
		{KeyInt, []byte{0, 0, 0, 0x2a}, SlotOf(8010225493015854792, DefaultSlotCount), nil},
		{KeyInt, []byte{0, 0, 0, 0, 0, 0, 0, 0x2a}, SlotOf(8010225493015854792, DefaultSlotCount), nil},
		// -1 must be sign-extended from every width.
		{KeyInt, []byte{0xff, 0xff}, minusOne, nil},
		{KeyInt, []byte{0xff, 0xff, 0xff, 0xff}, minusOne, nil},
		{KeyInt, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, minusOne, nil},
		{KeyInt, []byte{0x80, 0}, SlotOf(8455483389771436374, DefaultSlotCount), nil}, // int2 minimum
		{KeyInt, nil, 0, ErrBadKey},
		{KeyInt, []byte{1}, 0, ErrBadKey},
		{KeyInt, []byte{0, 0, 1}, 0, ErrBadKey},
		{KeyInt, make([]byte, 16), 0, ErrBadKey},
		{KeyUUID, uuid, SlotOf(7543054272012930821, DefaultSlotCount), nil},
		{KeyUUID, uuid[:15], 0, ErrBadKey},
		{KeyUUID, append(uuid, 0), 0, ErrBadKey},
		{KeyType("float"), []byte{0, 0, 0, 0}, 0, ErrUnsupportedKeyType},
	}
	for _, tc := range tests {
		got, err := SlotForBinary(tc.kt, tc.in, DefaultSlotCount)
		if !errors.Is(err, tc.wantErr) || (err == nil && got != tc.want) {
			t.Errorf("SlotForBinary(%s, %x) = %d, %v; want %d, %v", tc.kt, tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}

func TestBadKeyMessage(t *testing.T) {
	long := strings.Repeat("9", 1<<20) + "x"
	_, err := SlotForText(KeyInt, []byte(long), DefaultSlotCount)
	if !errors.Is(err, ErrKeyOutOfRange) || !errors.Is(err, ErrBadKey) {
		t.Fatalf("got %v, want ErrKeyOutOfRange wrapping ErrBadKey", err)
	}
	if n := len(err.Error()); n > 200 {
		t.Errorf("error message is %d bytes; a huge key must be cut short", n)
	}
}

// The proxy computes a slot for every routed statement.
func TestSlotForTextDoesNotAllocate(t *testing.T) {
	for _, tc := range benchKeys {
		if n := testing.AllocsPerRun(100, func() {
			if _, err := SlotForText(tc.kt, tc.in, DefaultSlotCount); err != nil {
				t.Fatal(err)
			}
		}); n != 0 {
			t.Errorf("SlotForText(%s, %q) allocates %v times", tc.kt, tc.in, n)
		}
	}
}

var benchKeys = []struct {
	kt KeyType
	in []byte
}{
	{KeyText, []byte("sku-000123456")},
	{KeyText, []byte(strings.Repeat("x", 256))},
	{KeyInt, []byte("-9223372036854775808")},
	{KeyUUID, []byte("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")},
}

func BenchmarkSlotForText(b *testing.B) {
	for _, bk := range benchKeys {
		b.Run(string(bk.kt)+"/"+string(bk.in[:min(len(bk.in), 8)]), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(bk.in)))
			for b.Loop() {
				if _, err := SlotForText(bk.kt, bk.in, DefaultSlotCount); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
