package profile

import (
	"github.com/docker/go-units"
	"go.yaml.in/yaml/v3"
)

// ByteSize is a size in bytes, written in a profile as 512m or 10g. It is
// parsed once, when the profile is decoded; everything downstream reads the
// number.
type ByteSize int64

// invalidSize marks a value that is not a size, for Check to report at its
// position (the schema rejects most of them first).
const invalidSize ByteSize = -1

// UnmarshalYAML reads a size such as 10g. A value that is not one decodes
// as invalidSize rather than failing the decode, so that Check reports it
// at its file, line and column with every other problem.
func (b *ByteSize) UnmarshalYAML(n *yaml.Node) error {
	v, err := units.RAMInBytes(n.Value)
	if n.Kind != yaml.ScalarNode || err != nil || v < 0 {
		*b = invalidSize
		return nil
	}
	*b = ByteSize(v)
	return nil
}

// MarshalYAML writes the size as a profile would: 10g, 512m, or bytes.
func (b ByteSize) MarshalYAML() (any, error) { return human(int64(b)), nil }

// String is the size as a profile would write it.
func (b ByteSize) String() string { return human(int64(b)) }
