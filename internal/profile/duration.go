package profile

import (
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Duration is a positive length of time, written in a profile as 90s, 30m
// or 2h. It is parsed once, when the profile is decoded; everything
// downstream reads the value. Zero is unset.
type Duration time.Duration

// invalidDuration marks a value that is not a positive duration, for Check
// to report at its position (the schema rejects most of them first).
const invalidDuration Duration = -1

// UnmarshalYAML reads a duration such as 30m. A value that is not a
// positive one decodes as invalidDuration rather than failing the decode,
// so that Check reports it at its file, line and column with every other
// problem.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := time.ParseDuration(n.Value)
	if n.Kind != yaml.ScalarNode || err != nil || v <= 0 {
		*d = invalidDuration
		return nil
	}
	*d = Duration(v)
	return nil
}

// MarshalYAML writes the duration as a profile would: 90s, 30m, 2h.
func (d Duration) MarshalYAML() (any, error) { return d.String(), nil }

// String is the duration as a profile would write it: 2h rather than
// time's 2h0m0s.
func (d Duration) String() string {
	s := time.Duration(d).String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
