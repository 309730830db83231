package profile

import (
	"errors"

	"github.com/propio/propio-sandbox/internal/egress"
	"go.yaml.in/yaml/v3"
)

// Rule is one entry of network.allow or network.deny (internal/egress says
// the syntax): the rule as internal/egress parses it, Text as written,
// parsed once when the profile is decoded.
type Rule struct {
	egress.Rule
	err    error // why Text is not a rule, for Check to report
	limits bool  // written as a mapping, with its limits
}

// ParseRule reads one entry of network.allow or network.deny.
func ParseRule(s string) (Rule, error) {
	r, err := egress.ParseRule(s)
	return Rule{Rule: r, err: err}, err
}

// ruleLimits is an allow rule written as a mapping: the rule and the limits
// on its HTTP requests.
type ruleLimits struct {
	Host    string   `yaml:"host"`
	Methods []string `yaml:"methods,omitempty"`
	Paths   []string `yaml:"paths,omitempty"`
}

// UnmarshalYAML reads a rule: a string, or (in network.allow) a mapping
// with its host and the methods and paths it limits requests to. One that
// does not parse is kept with its error, for Check to report at its
// position with every other problem; a value that is neither fails the
// decode.
func (r *Rule) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.MappingNode {
		var m ruleLimits
		if err := n.Decode(&m); err != nil {
			return err
		}
		*r, _ = ParseRule(m.Host)
		if r.err == nil {
			lim, err := r.Rule.WithLimits(m.Methods, m.Paths)
			r.Rule, r.err = lim, err
		}
		r.limits = true
		return nil
	}
	var s string
	if err := n.Decode(&s); err != nil {
		return err
	}
	*r, _ = ParseRule(s)
	return nil
}

// Limited reports whether the rule limits methods or paths (written as a
// mapping).
func (r Rule) Limited() bool { return len(r.Methods) > 0 || len(r.Paths) > 0 }

// problem is why the rule is not one: the error it was decoded with, or for
// a null entry, which YAML decodes without asking the rule, that it is empty.
func (r Rule) problem() error {
	if r.err == nil && r.Host == "" && !r.Addr.IsValid() {
		return errors.New("empty rule")
	}
	return r.err
}

// MarshalYAML writes the rule as the profile wrote it: its text, or a
// mapping with its limits.
func (r Rule) MarshalYAML() (any, error) {
	if !r.limits && !r.Limited() {
		return r.Text, nil
	}
	return ruleLimits{Host: r.Text, Methods: r.Methods, Paths: r.Paths}, nil
}

// String is the rule as the profile wrote it.
func (r Rule) String() string { return r.Text }

// Bandwidth is network.bandwidth, the allowlist gateway's cap: the rate as
// written (10mbit) and in bytes per second, parsed once when the profile is
// decoded. The zero value is no cap.
type Bandwidth struct {
	Text           string
	BytesPerSecond int64
	err            error // why Text is not a rate, for Check to report
}

// ParseBandwidth reads a rate such as 10mbit; the empty string is no cap.
func ParseBandwidth(s string) (Bandwidth, error) {
	if s == "" {
		return Bandwidth{}, nil
	}
	v, err := egress.ParseBandwidth(s)
	return Bandwidth{Text: s, BytesPerSecond: v, err: err}, err
}

// UnmarshalYAML reads a rate. One that does not parse is kept with its
// error, for Check to report at its position with every other problem; a
// value that is not a string fails the decode as a string would.
func (b *Bandwidth) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if err := n.Decode(&s); err != nil {
		return err
	}
	*b, _ = ParseBandwidth(s)
	return nil
}

// IsSet reports whether a cap is written.
func (b Bandwidth) IsSet() bool { return b.Text != "" }

// IsZero reports no cap, for omitempty.
func (b Bandwidth) IsZero() bool { return !b.IsSet() }

// MarshalYAML writes the rate as the profile wrote it.
func (b Bandwidth) MarshalYAML() (any, error) { return b.Text, nil }

// String is the rate as the profile wrote it.
func (b Bandwidth) String() string { return b.Text }
