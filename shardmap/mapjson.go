package shardmap

import (
	"encoding/json"
	"slices"
	"strconv"
)

// A map's JSON is what encoding/json writes for a Map, encoded and decoded
// here by hand. Through reflection a map of 4,096 slots and 128 shards took
// 290 µs to encode and 620 µs to decode (json.Unmarshal scans the input to
// validate it before it decodes it), and both lie on a freeze's path: the
// migrator encodes the frozen map and the flipped one inside the write
// pause, and every proxy decodes each before it acknowledges or serves it.
// encodeMap writes encoding/json's bytes exactly; decodeMap reads what
// encodeMap writes and hands any other input (nulls, escapes, unknown or
// repeated fields, numbers that are not plain integers) to encoding/json.
// FuzzMapJSON holds both to encoding/json.

// encodeMap returns m's JSON, byte for byte what json.Marshal(m) returns.
func encodeMap(m *Map) []byte {
	b := make([]byte, 0, 64+len(m.Slots)*4+len(m.Shards)*48)
	b = append(b, `{"tenant":`...)
	b = appendJSONString(b, m.Tenant)
	b = append(b, `,"tree":`...)
	b = appendJSONString(b, m.Tree)
	b = append(b, `,"epoch":`...)
	b = strconv.AppendUint(b, m.Epoch, 10)
	b = append(b, `,"slots":`...)
	if m.Slots == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i, v := range m.Slots {
			if i > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendInt(b, int64(v), 10)
		}
		b = append(b, ']')
	}
	b = append(b, `,"shards":`...)
	b = appendShards(b, m.Shards)
	b = append(b, `,"high_water":`...)
	b = strconv.AppendInt(b, int64(m.HighWater), 10)
	b = appendRanges(b, `,"frozen":`, m.Frozen)
	b = appendRanges(b, `,"freezing":`, m.Freezing)
	return append(b, '}')
}

// appendShards writes shards as encoding/json writes a map with integer
// keys: the keys as strings, in the order of those strings.
func appendShards(b []byte, shards map[int]Shard) []byte {
	if shards == nil {
		return append(b, "null"...)
	}
	keys := make([]string, 0, len(shards))
	for idx := range shards {
		keys = append(keys, strconv.Itoa(idx))
	}
	slices.Sort(keys)
	b = append(b, '{')
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		idx, _ := strconv.Atoi(k) // formatted above
		sh := shards[idx]
		b = append(b, '"')
		b = append(b, k...)
		b = append(b, `":{"index":`...)
		b = strconv.AppendInt(b, int64(sh.Index), 10)
		b = append(b, `,"node":`...)
		b = appendJSONString(b, sh.Node)
		b = append(b, `,"state":`...)
		b = appendJSONString(b, string(sh.State))
		if sh.Mixed {
			b = append(b, `,"mixed":true`...)
		}
		b = append(b, '}')
	}
	return append(b, '}')
}

// appendRanges writes an omitempty field of ranges.
func appendRanges(b []byte, field string, ranges [][2]int) []byte {
	if len(ranges) == 0 {
		return b
	}
	b = append(b, field...)
	b = append(b, '[')
	for i, r := range ranges {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '[')
		b = strconv.AppendInt(b, int64(r[0]), 10)
		b = append(b, ',')
		b = strconv.AppendInt(b, int64(r[1]), 10)
		b = append(b, ']')
	}
	return append(b, ']')
}

// appendJSONString writes s as encoding/json does: a string of printable
// ASCII that needs no escape as it is, any other through encoding/json
// (its escapes of HTML characters, control characters and bad UTF-8).
func appendJSONString(b []byte, s string) []byte {
	if !plainString(s) {
		q, _ := json.Marshal(s) // a string always encodes
		return append(b, q...)
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// plainString reports whether s is printable ASCII with nothing that
// encoding/json escapes.
func plainString(s string) bool {
	for i := range len(s) {
		c := s[i]
		if c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

// decodeMap decodes a map's JSON.
func decodeMap(b []byte) (*Map, error) {
	if m, ok := readMap(b); ok {
		return m, nil
	}
	m := new(Map)
	if err := json.Unmarshal(b, m); err != nil {
		return nil, err
	}
	return m, nil
}

// mapReader reads the JSON encodeMap writes. Each method reports false on
// anything else, which decodeMap leaves to encoding/json.
type mapReader struct {
	b     []byte
	i     int
	names map[string]string
}

// The top-level fields, each allowed once.
var mapFields = []string{"tenant", "tree", "epoch", "slots", "shards", "high_water", "frozen", "freezing"}

func readMap(b []byte) (*Map, bool) {
	r := mapReader{b: b}
	m := new(Map)
	if !r.next('{') {
		return nil, false
	}
	seen := 0
	for more := !r.next('}'); more; {
		key, ok := r.raw()
		if !ok || !r.next(':') {
			return nil, false
		}
		f := slices.Index(mapFields, string(key)) // no allocation: compared only
		if f < 0 || seen&(1<<f) != 0 {
			return nil, false
		}
		seen |= 1 << f
		switch f {
		case 0:
			m.Tenant, ok = r.str()
		case 1:
			m.Tree, ok = r.str()
		case 2:
			var v int
			v, ok = r.uint()
			m.Epoch = uint64(v)
		case 3:
			m.Slots, ok = r.ints()
		case 4:
			m.Shards, ok = r.shards()
		case 5:
			m.HighWater, ok = r.int()
		case 6:
			m.Frozen, ok = r.ranges()
		case 7:
			m.Freezing, ok = r.ranges()
		}
		if !ok {
			return nil, false
		}
		if more, ok = r.end('}'); !ok {
			return nil, false
		}
	}
	r.space()
	return m, r.i == len(b)
}

func (r *mapReader) space() {
	for r.i < len(r.b) {
		switch r.b[r.i] {
		case ' ', '\t', '\n', '\r':
			r.i++
		default:
			return
		}
	}
}

// next skips white space and takes c if it comes next.
func (r *mapReader) next(c byte) bool {
	r.space()
	if r.i < len(r.b) && r.b[r.i] == c {
		r.i++
		return true
	}
	return false
}

// end reads what follows an element of an object or array closed by
// closer: a comma (more is true) or closer.
func (r *mapReader) end(closer byte) (more, ok bool) {
	if r.next(',') {
		return true, true
	}
	return false, r.next(closer)
}

// raw reads a string without escapes, of printable ASCII, and returns its
// bytes, which are r's.
func (r *mapReader) raw() ([]byte, bool) {
	if !r.next('"') {
		return nil, false
	}
	start := r.i
	for r.i < len(r.b) && r.b[r.i] != '"' {
		if c := r.b[r.i]; c < 0x20 || c > 0x7e || c == '\\' {
			return nil, false
		}
		r.i++
	}
	if r.i == len(r.b) {
		return nil, false
	}
	r.i++
	return r.b[start : r.i-1], true
}

// str reads a string as raw does. The names a map repeats (nodes, states)
// are allocated once per map.
func (r *mapReader) str() (string, bool) {
	b, ok := r.raw()
	if !ok {
		return "", false
	}
	if s, ok := r.names[string(b)]; ok {
		return s, true
	}
	s := string(b)
	if r.names == nil {
		r.names = make(map[string]string)
	}
	r.names[s] = s
	return s, true
}

// int reads an integer as JSON writes one (no leading zero, no fraction or
// exponent) of at most 18 digits, which no int overflows.
func (r *mapReader) int() (int, bool) {
	r.space()
	neg := r.i < len(r.b) && r.b[r.i] == '-'
	if neg {
		r.i++
	}
	v, ok := r.digits()
	if neg {
		v = -v
	}
	return v, ok
}

// uint reads an integer as int does, without a sign.
func (r *mapReader) uint() (int, bool) {
	r.space()
	return r.digits()
}

func (r *mapReader) digits() (int, bool) {
	start := r.i
	v := 0
	for r.i < len(r.b) && r.b[r.i] >= '0' && r.b[r.i] <= '9' {
		v = v*10 + int(r.b[r.i]-'0')
		r.i++
	}
	n := r.i - start
	if n == 0 || n > 18 || n > 1 && r.b[start] == '0' {
		return 0, false
	}
	if r.i < len(r.b) {
		switch r.b[r.i] {
		case '.', 'e', 'E':
			return 0, false
		}
	}
	return v, true
}

func (r *mapReader) ints() (SlotList, bool) {
	if !r.next('[') {
		return nil, false
	}
	out := make(SlotList, 0, DefaultSlotCount)
	for more := !r.next(']'); more; {
		v, ok := r.int()
		if !ok {
			return nil, false
		}
		out = append(out, v)
		if more, ok = r.end(']'); !ok {
			return nil, false
		}
	}
	return out, true
}

func (r *mapReader) ranges() ([][2]int, bool) {
	if !r.next('[') {
		return nil, false
	}
	out := [][2]int{}
	for more := !r.next(']'); more; {
		var rg [2]int
		var ok bool
		if !r.next('[') {
			return nil, false
		}
		if rg[0], ok = r.int(); !ok || !r.next(',') {
			return nil, false
		}
		if rg[1], ok = r.int(); !ok || !r.next(']') {
			return nil, false
		}
		out = append(out, rg)
		if more, ok = r.end(']'); !ok {
			return nil, false
		}
	}
	return out, true
}

func (r *mapReader) shards() (map[int]Shard, bool) {
	if !r.next('{') {
		return nil, false
	}
	out := map[int]Shard{}
	for more := !r.next('}'); more; {
		key, ok := r.raw()
		if !ok || !r.next(':') {
			return nil, false
		}
		idx, ok := shardKey(key)
		if !ok {
			return nil, false
		}
		sh, ok := r.shard()
		if !ok {
			return nil, false
		}
		out[idx] = sh
		if more, ok = r.end('}'); !ok {
			return nil, false
		}
	}
	return out, true
}

// shardKey reads a shard's key as encoding/json reads an integer key
// (strconv.ParseInt).
func shardKey(key []byte) (int, bool) {
	k := mapReader{b: key}
	if v, ok := k.int(); ok && k.i == len(key) && (len(key) == 0 || key[0] != ' ') {
		return v, true
	}
	v, err := strconv.ParseInt(string(key), 10, 64)
	return int(v), err == nil
}

func (r *mapReader) shard() (Shard, bool) {
	var sh Shard
	if !r.next('{') {
		return sh, false
	}
	for more := !r.next('}'); more; {
		field, ok := r.raw()
		if !ok || !r.next(':') {
			return sh, false
		}
		switch string(field) {
		case "index":
			sh.Index, ok = r.int()
		case "node":
			sh.Node, ok = r.str()
		case "state":
			var s string
			s, ok = r.str()
			sh.State = ShardState(s)
		case "mixed":
			sh.Mixed, ok = r.bool()
		default:
			ok = false
		}
		if !ok {
			return sh, false
		}
		if more, ok = r.end('}'); !ok {
			return sh, false
		}
	}
	return sh, true
}

func (r *mapReader) bool() (bool, bool) {
	r.space()
	for _, lit := range []string{"true", "false"} {
		if len(r.b)-r.i >= len(lit) && string(r.b[r.i:r.i+len(lit)]) == lit {
			r.i += len(lit)
			return lit == "true", true
		}
	}
	return false, false
}
