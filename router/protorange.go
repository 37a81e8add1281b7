package router

import (
	"sync"

	"google.golang.org/protobuf/reflect/protoreflect"
)

// rangeFields calls f for each populated field of m in field-number order.
// protoreflect's own Range order is undefined and differs from one build
// to the next, while plans (the order of composed calls, of rewritten
// expressions) must come out the same from every binary.
func rangeFields(m protoreflect.Message, f func(protoreflect.FieldDescriptor, protoreflect.Value) bool) {
	for _, it := range fieldItems(m.Descriptor()) {
		fd := it.field
		if it.oneof != nil {
			// One lookup for the whole oneof: pg.Node's has hundreds of
			// members, and asking each whether it is set dominated planning.
			if fd = m.WhichOneof(it.oneof); fd == nil {
				continue
			}
		} else if !m.Has(fd) {
			continue
		}
		if !f(fd, m.Get(fd)) {
			return
		}
	}
}

// fieldItem is a field of a message, or one of its oneofs as a whole.
type fieldItem struct {
	field protoreflect.FieldDescriptor
	oneof protoreflect.OneofDescriptor
}

var fieldItemCache sync.Map // protoreflect.FullName -> []fieldItem

// fieldItems lists md's fields in field-number order, each
// oneof once at the place of its first member.
func fieldItems(md protoreflect.MessageDescriptor) []fieldItem {
	if v, ok := fieldItemCache.Load(md.FullName()); ok {
		return v.([]fieldItem)
	}
	var items []fieldItem
	seen := map[protoreflect.FullName]bool{}
	fields := md.Fields()
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		if od := fd.ContainingOneof(); od != nil && !od.IsSynthetic() {
			if !seen[od.FullName()] {
				seen[od.FullName()] = true
				items = append(items, fieldItem{oneof: od})
			}
			continue
		}
		items = append(items, fieldItem{field: fd})
	}
	fieldItemCache.Store(md.FullName(), items)
	return items
}
