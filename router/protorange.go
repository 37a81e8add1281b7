package router

import "google.golang.org/protobuf/reflect/protoreflect"

// rangeFields calls f for each populated field of m in field-number order.
// protoreflect's own Range order is undefined and differs from one build
// to the next, while plans (the order of composed calls, of rewritten
// expressions) must come out the same from every binary.
func rangeFields(m protoreflect.Message, f func(protoreflect.FieldDescriptor, protoreflect.Value) bool) {
	fields := m.Descriptor().Fields()
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		if !m.Has(fd) {
			continue
		}
		if !f(fd, m.Get(fd)) {
			return
		}
	}
}
