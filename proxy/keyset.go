package proxy

import (
	"encoding/binary"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/lattice-db/lattice/router"
	"github.com/lattice-db/lattice/shardmap"
)

// maxKeyElems bounds the keys of an IN list or array the proxy hashes; a
// longer one reads every shard.
const maxKeyElems = 100000

// keyShards returns the shards owning the keys a FanOut plan restricts its
// shard key to (key IN (...), key = ANY(...)), or nil for every shard. A
// key the proxy cannot read restricts nothing: reading every shard is
// always correct for a SELECT, and PostgreSQL reports a malformed value.
func keyShards(m *shardmap.Map, p *router.Plan, bind *pgproto3.Bind, oids []uint32) map[int]bool {
	if p.Keys == nil && p.KeyArray == nil {
		return nil
	}
	kt, slots := p.Tree.KeyType, len(m.Slots)
	only := map[int]bool{}
	for _, k := range p.Keys {
		slot, err := keySlot(kt, slots, k, bind, oids)
		if err != nil {
			return nil
		}
		only[m.Owner(slot).Index] = true
	}
	if a := p.KeyArray; a != nil {
		raw, format, oid := []byte(a.Text), int16(0), uint32(0)
		if a.Param > 0 {
			if bind == nil || a.Param > len(bind.Parameters) {
				return nil
			}
			raw, format = bind.Parameters[a.Param-1], formatFor(bind.ParameterFormatCodes, a.Param-1)
			if a.Param <= len(oids) {
				oid = oids[a.Param-1]
			}
		}
		if raw == nil {
			// key = ANY(NULL) matches no row: any one shard answers.
			only[m.Owner(0).Index] = true
			return only
		}
		slotsOf, ok := arraySlots(kt, slots, raw, format, oid)
		if !ok {
			return nil
		}
		for _, slot := range slotsOf {
			only[m.Owner(slot).Index] = true
		}
	}
	if len(only) == 0 {
		// An empty list or array matches no row.
		only[m.Owner(0).Index] = true
	}
	return only
}

// arraySlots hashes the non-NULL elements of a one-dimensional array value
// in text or binary form.
func arraySlots(kt shardmap.KeyType, slots int, raw []byte, format int16, oid uint32) ([]int, bool) {
	var out []int
	if format == 0 {
		var elems []*string
		if err := typeMap.Scan(pgtype.TextArrayOID, 0, raw, &elems); err != nil || len(elems) > maxKeyElems {
			return nil, false
		}
		for _, e := range elems {
			if e == nil {
				continue
			}
			slot, err := shardmap.SlotForText(kt, []byte(*e), slots)
			if err != nil {
				return nil, false
			}
			out = append(out, slot)
		}
		return out, true
	}
	// Binary: ndim, has-null flag, element type, then per dimension its
	// length and lower bound, then each element as length and bytes.
	if oid != 0 && oid != pgtype.Int2ArrayOID && oid != pgtype.Int4ArrayOID && oid != pgtype.Int8ArrayOID &&
		oid != pgtype.TextArrayOID && oid != pgtype.VarcharArrayOID && oid != pgtype.UUIDArrayOID {
		return nil, false
	}
	if len(raw) < 12 {
		return nil, false
	}
	ndim := int32(binary.BigEndian.Uint32(raw))
	elemOID := binary.BigEndian.Uint32(raw[8:])
	if ndim == 0 {
		return nil, true
	}
	if ndim != 1 || len(raw) < 20 || !binaryKeyOID(kt, elemOID) {
		return nil, false
	}
	n := int32(binary.BigEndian.Uint32(raw[12:]))
	if n < 0 || n > maxKeyElems {
		return nil, false
	}
	rest := raw[20:]
	for range n {
		if len(rest) < 4 {
			return nil, false
		}
		l := int32(binary.BigEndian.Uint32(rest))
		rest = rest[4:]
		if l < 0 {
			continue // NULL
		}
		if int(l) > len(rest) {
			return nil, false
		}
		slot, err := shardmap.SlotForBinary(kt, rest[:l], slots)
		if err != nil {
			return nil, false
		}
		out = append(out, slot)
		rest = rest[l:]
	}
	return out, len(rest) == 0
}
