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

// Idle is resources.idle: how long a persistent sandbox (up) may run with
// no command running in it (exec), and none started, before its supervisor
// removes it; or off, never. The zero value is unset (DefaultIdle applies).
type Idle struct {
	After Duration // positive; invalidDuration for a value that is neither a duration nor off
	Off   bool
}

// DefaultIdle is resources.idle when no profile sets it.
const DefaultIdle = Duration(30 * time.Minute)

// UnmarshalYAML reads off, or a duration such as 30m (one that is not a
// positive duration is left for Check to report, as Duration's are).
func (i *Idle) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode && n.Value == "off" {
		*i = Idle{Off: true}
		return nil
	}
	*i = Idle{}
	return i.After.UnmarshalYAML(n)
}

// MarshalYAML writes off or the duration.
func (i Idle) MarshalYAML() (any, error) {
	if i.Off {
		return "off", nil
	}
	return i.After.String(), nil
}

// IsZero reports an unset idle, for omitempty.
func (i Idle) IsZero() bool { return !i.Off && i.After == 0 }

// Duration is how long a persistent sandbox may stay idle; zero when off.
func (i Idle) Duration() time.Duration {
	if i.Off {
		return 0
	}
	return time.Duration(i.After)
}

// String is the idle as a profile writes it.
func (i Idle) String() string {
	if i.Off {
		return "off"
	}
	return i.After.String()
}
