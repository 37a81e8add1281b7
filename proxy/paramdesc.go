package proxy

import (
	"encoding/binary"

	"github.com/jackc/pgx/v5/pgproto3"
)

// maxWireCount is the most items a protocol message's 16-bit count holds.
const maxWireCount = 1<<16 - 1

// wideParameterDescription describes a statement of more than 65,535
// parameters as PostgreSQL does: all the types, under a count that wrapped
// around. pgproto3 refuses to encode it, which would drop the client; drivers
// infer the count from the length, and the Bind past the limit is then
// refused by the driver or by PostgreSQL with an ErrorResponse.
type wideParameterDescription pgproto3.ParameterDescription

func (*wideParameterDescription) Backend() {}

func (d *wideParameterDescription) Decode(src []byte) error {
	return (*pgproto3.ParameterDescription)(d).Decode(src)
}

func (d *wideParameterDescription) Encode(dst []byte) ([]byte, error) {
	n := len(d.ParameterOIDs)
	dst = append(dst, 't')
	dst = binary.BigEndian.AppendUint32(dst, uint32(4+2+4*n))
	dst = binary.BigEndian.AppendUint16(dst, uint16(n))
	for _, oid := range d.ParameterOIDs {
		dst = binary.BigEndian.AppendUint32(dst, oid)
	}
	return dst, nil
}
