package router

import (
	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"

	"github.com/lattice-db/lattice/shardmap"
)

// keySetValue is what key IN (...) or key = ANY(...) restricts the shard
// key to. A SELECT with it reads only the shards owning those keys.
type keySetValue struct {
	keys  []Value
	array *Value
}

// keySet reads the items of key IN (a, b, ...). Items that are not
// constants leave the key unrestricted (nil, ""); a constant the key
// cannot take is a problem, as it is for key = constant.
func keySet(tree *shardmap.Tree, items []*pg.Node) (*keySetValue, string) {
	set := &keySetValue{keys: make([]Value, 0, len(items))}
	for _, it := range items {
		c, ok := asConstant(it)
		if !ok {
			return nil, ""
		}
		v, msg := keyValue(tree, c)
		if msg != "" {
			return nil, msg
		}
		set.keys = append(set.keys, v)
	}
	return set, ""
}

// keyArray reads the array of key = ANY(array): ARRAY[constants], a $n
// parameter or a string literal, possibly cast to an array of a type the
// key hashes as. Anything else leaves the key unrestricted.
func keyArray(tree *shardmap.Tree, n *pg.Node) (*keySetValue, string) {
	if a := n.GetAArrayExpr(); a != nil {
		return keySet(tree, a.Elements)
	}
	if tc := n.GetTypeCast(); tc != nil {
		if tc.TypeName == nil || len(tc.TypeName.ArrayBounds) != 1 {
			return nil, ""
		}
		elem := proto.Clone(tc.TypeName).(*pg.TypeName)
		elem.ArrayBounds = nil
		if !keyTypes[tree.KeyType][typeName(elem)] {
			return nil, ""
		}
		if a := tc.Arg.GetAArrayExpr(); a != nil {
			return keySet(tree, a.Elements)
		}
		n = tc.Arg
	}
	c, ok := bareConstant(n)
	if !ok {
		return nil, ""
	}
	switch c.kind {
	case litParam:
		return &keySetValue{array: &Value{Param: c.param}}, ""
	case litString:
		return &keySetValue{array: &Value{Text: c.text}}, ""
	}
	return nil, ""
}
