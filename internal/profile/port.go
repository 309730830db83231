package profile

import (
	"github.com/compose-spec/compose-go/v2/types"
	"go.yaml.in/yaml/v3"
)

// Port is one entry of ports: the text as written ("3000", "8080:80",
// "127.0.0.1:8080:80/udp"), and the ports it publishes, parsed once when
// the profile is decoded. A host address or port that is not written is
// empty in Bindings: the generator decides what it means.
type Port struct {
	Spec     string
	Bindings []types.ServicePortConfig
	err      error // why Spec is not a port, for Check to report
}

// ParsePort reads one entry of ports.
func ParsePort(spec string) (Port, error) {
	b, err := types.ParsePortConfig(spec)
	if err != nil {
		return Port{Spec: spec, err: err}, err
	}
	return Port{Spec: spec, Bindings: b}, nil
}

// UnmarshalYAML reads a port. One that does not parse is kept with its
// error, for Check to report at its position with every other problem.
func (p *Port) UnmarshalYAML(n *yaml.Node) error {
	*p, _ = ParsePort(n.Value)
	return nil
}

// MarshalYAML writes the port as the profile wrote it.
func (p Port) MarshalYAML() (any, error) { return p.Spec, nil }

// String is the port as the profile wrote it.
func (p Port) String() string { return p.Spec }
