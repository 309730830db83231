// Package profile finds, parses, checks and resolves propio-sandbox profiles.
//
// The pipeline is Load (finds files: the only I/O) -> Parse (one file,
// schema-checked, positions kept) -> extends merge -> decode -> defaults ->
// Check (the rules a schema cannot say). Every error carries the file, line
// and column of the field it is about. This package never talks to a
// container engine and never reads environment variable values.
package profile

import (
	"bytes"
	"fmt"
	"slices"
	"time"

	"go.yaml.in/yaml/v3"
)

// Profile is a resolved profile: extends merged, defaults applied.
type Profile struct {
	Version     int       `yaml:"version,omitempty"`
	Description string    `yaml:"description,omitempty"`
	Image       string    `yaml:"image,omitempty"`
	Build       *Build    `yaml:"build,omitempty"`
	Command     []string  `yaml:"command,omitempty"`
	User        User      `yaml:"user"`
	Workspace   Workspace `yaml:"workspace"`
	Mounts      []Mount   `yaml:"mounts,omitempty"`
	Env         Env       `yaml:"env,omitempty"`
	Network     Network   `yaml:"network"`
	Resources   Resources `yaml:"resources"`
	Security    Security  `yaml:"security"`
	Ports       []Port    `yaml:"ports,omitempty"`
	Git         Git       `yaml:"git,omitempty"`
	// SSHAgent forwards the launcher's SSH agent: auto (when SSH_AUTH_SOCK
	// is set), on, or off (the default). PROPIO_SANDBOX_SSH_AGENT (or
	// SANDBOX_SSH_AGENT) overrides it.
	SSHAgent string `yaml:"ssh_agent,omitempty"`
	// Engine is auto (the default), docker or podman; --engine overrides it.
	Engine string `yaml:"engine,omitempty"`
	// Checks are run, each in a throwaway sandbox of this profile, after
	// the built-in preflight checks and before the agent starts.
	Checks []DeclaredCheck `yaml:"checks,omitempty"`
	// Unsafe names the grants of this profile that undo the sandbox (see
	// grants.go), which are refused unless named here, in a user profile.
	Unsafe []string `yaml:"unsafe,omitempty"`
	// AgentRequests are the kinds of request the agent may make from
	// inside, through /run/propio-sandbox/request.sock (RequestKinds);
	// none (the default, and every built-in's) mounts no such socket.
	AgentRequests []string `yaml:"agent_requests,omitempty"`
	// Secrets are the credentials the allowlist gateway brokers, by the
	// variable that holds a sentinel inside (secrets.go).
	Secrets map[string]*Secret `yaml:"secrets,omitempty"`
	Meta    Meta               `yaml:"-"`
	src     *resolved
	// granted are the unsafe grants Load judged on the host and allowed.
	granted []Grant
}

// Meta says where a resolved profile came from.
type Meta struct {
	Name  string   // the name or path it was asked for by
	File  string   // the leaf file, or builtin:NAME
	Chain []Source // the leaf first, then each profile it extends
}

// Source is one file of an extends chain.
type Source struct {
	File   string // path, or builtin:NAME
	Path   string // absolute path on disk; empty for built-ins
	Real   string // Path with the links of its directory resolved
	SHA256 string
}

// Builtin reports whether the leaf of the chain is a built-in profile.
func (m Meta) Builtin() bool { return len(m.Chain) > 0 && m.Chain[0].Path == "" }

type Build struct {
	Context    string            `yaml:"context,omitempty"`
	Dockerfile string            `yaml:"dockerfile,omitempty"`
	Target     string            `yaml:"target,omitempty"`
	Args       map[string]string `yaml:"args,omitempty"`
	// Dir is the directory of the file that set context; relative paths start there.
	Dir string `yaml:"-"`
}

// Builtin reports whether a built-in profile set the build's context (a
// profile file has a directory).
func (b *Build) Builtin() bool { return b.Dir == "" }

type Workspace struct {
	Target   string   `yaml:"target,omitempty"`
	Mode     string   `yaml:"mode,omitempty"`
	ReadOnly []string `yaml:"readonly,omitempty"`
	Hide     []string `yaml:"hide,omitempty"`
}

type Mount struct {
	Source   string `yaml:"source"`
	Target   string `yaml:"target"`
	Mode     string `yaml:"mode,omitempty"`
	Optional bool   `yaml:"optional,omitempty"`
	// Dir is the directory of the file that declared the mount; a relative source starts there.
	Dir string `yaml:"-"`
}

type Env struct {
	Pass     []string          `yaml:"pass,omitempty"`
	Set      map[string]string `yaml:"set,omitempty"`
	Required []string          `yaml:"required,omitempty"`
}

// DeclaredCheck is a profile's own preflight check: a command that must
// exit 0 in a sandbox of the profile (same network policy, environment and
// mounts) for the agent to start.
type DeclaredCheck struct {
	Name    string   `yaml:"name"`
	Run     []string `yaml:"run"`
	Timeout Duration `yaml:"timeout,omitempty"` // default DefaultCheckTimeout
}

// DefaultCheckTimeout bounds a declared check that states no timeout.
const DefaultCheckTimeout = 30 * time.Second

// Deadline is how long the check may take: its timeout, or
// DefaultCheckTimeout.
func (c DeclaredCheck) Deadline() time.Duration {
	if c.Timeout > 0 {
		return time.Duration(c.Timeout)
	}
	return DefaultCheckTimeout
}

// Git is the host git setup the sandbox shares.
type Git struct {
	// Config mounts the user's git configuration read-only: ~/.gitconfig,
	// ~/.config/git/config and ~/.gitignore_global, each where it exists.
	Config bool `yaml:"config,omitempty"`
}

type Network struct {
	Mode        string `yaml:"mode,omitempty"`
	HostGateway *bool  `yaml:"host_gateway,omitempty"`
	// Allow and Deny are the egress rules of mode allowlist (see
	// internal/egress for their syntax), parsed once when the profile is
	// decoded; deny wins over allow.
	Allow []Rule `yaml:"allow,omitempty"`
	Deny  []Rule `yaml:"deny,omitempty"`
	// Join names existing engine networks that the allowlist gateway joins
	// (the sandbox never does), so that a rule can allow a container there
	// by its name.
	Join []string `yaml:"join,omitempty"`
	// Bandwidth caps the allowlist gateway's throughput, as 10mbit.
	Bandwidth Bandwidth `yaml:"bandwidth,omitempty"`
	// Unlisted is what the gateway does with a connection no rule matches:
	// deny (the default) or ask the user (package ask).
	Unlisted string `yaml:"unlisted,omitempty"`
	// AskTimeout is how long an asking connection waits for a decision
	// before it is denied; zero: DefaultAskTimeout.
	AskTimeout Duration `yaml:"ask_timeout,omitempty"`
	// Methods are the HTTP methods an allow rule that names none lets
	// through (read-only web: GET, HEAD, OPTIONS); none: any.
	Methods []string `yaml:"methods,omitempty"`
	// UpstreamCA is a PEM file of CA certificates the gateway trusts, beside
	// the system's, for the upstreams whose TLS it terminates; relative to
	// UpstreamCADir.
	UpstreamCA    string `yaml:"upstream_ca,omitempty"`
	UpstreamCADir string `yaml:"-"`
}

// Values of network.unlisted.
const (
	UnlistedDeny = "deny"
	UnlistedAsk  = "ask"
)

// Bounds and default of network.ask_timeout.
const (
	DefaultAskTimeout = Duration(60 * time.Second)
	MinAskTimeout     = Duration(time.Second)
	MaxAskTimeout     = Duration(10 * time.Minute)
)

// Asks reports whether the gateway asks about unlisted connections.
func (n Network) Asks() bool { return n.Mode == "allowlist" && n.Unlisted == UnlistedAsk }

// AskTimeoutOrDefault is network.ask_timeout, or its default when unset.
func (n Network) AskTimeoutOrDefault() Duration {
	if n.AskTimeout > 0 {
		return n.AskTimeout
	}
	return DefaultAskTimeout
}

// Resources are the sandbox's limits. Sizes and the timeout are parsed
// once, when the profile is decoded.
type Resources struct {
	CPUs   float64  `yaml:"cpus,omitempty"`
	Memory ByteSize `yaml:"memory,omitempty"`
	Pids   int64    `yaml:"pids,omitempty"`
	Tmp    ByteSize `yaml:"tmp,omitempty"`
	// Timeout stops the sandbox after this long; zero: never.
	Timeout Duration `yaml:"timeout,omitempty"`
	// Disk caps what the sandbox writes to each place it can write (its
	// writable layer, /tmp and HOME, the workspace and rw mounts, a
	// changeset), in bytes.
	Disk ByteSize `yaml:"disk,omitempty"`
	// Idle removes a persistent sandbox (up) that has run no command
	// (exec) for this long; off never does.
	Idle Idle `yaml:"idle,omitempty"`
}

type Security struct {
	ReadOnlyRootfs  *bool    `yaml:"read_only_rootfs,omitempty"`
	Runtime         string   `yaml:"runtime,omitempty"`
	CapAdd          []string `yaml:"cap_add,omitempty"`
	CapDrop         []string `yaml:"cap_drop,omitempty"`
	NoNewPrivileges *bool    `yaml:"no_new_privileges,omitempty"`
	Init            *bool    `yaml:"init,omitempty"`
}

// resolved keeps the merged node tree and which file each node came from, so
// that checks after the merge still point at the right file, line and column.
type resolved struct {
	root   *yaml.Node
	origin map[*yaml.Node]*Document
	leaf   *Document
	chain  []*Document // the leaf first, then each file it extends
	// workspace is the directory whose files are repository profile files.
	workspace string
	configDir string // where user profiles are, for hints
}

// Pos returns the position of the field at path (keys and indexes), or of its
// closest existing parent. With no path it is the start of the leaf file.
func (p *Profile) Pos(path ...string) Pos {
	if p.src == nil {
		return Pos{File: p.Meta.File, Line: 1, Col: 1}
	}
	n := find(p.src.root, path, false)
	if n == p.src.root && len(path) > 0 {
		// Not set anywhere: point at the start of the leaf file.
		return Pos{File: p.src.leaf.File, Line: 1, Col: 1}
	}
	return p.src.posOf(n)
}

func (r *resolved) posOf(n *yaml.Node) Pos {
	d := r.origin[n]
	if d == nil {
		d = r.leaf
	}
	return posOf(d.File, n)
}

// dirOf returns the directory of the file that set the field at path.
func (r *resolved) dirOf(path ...string) string {
	n := find(r.root, path, false)
	if d := r.origin[n]; d != nil {
		return d.Dir
	}
	return r.leaf.Dir
}

// errorAt builds an Error about the field at path.
func (p *Profile) errorAt(msg, hint string, path ...string) *Error {
	return &Error{Pos: p.Pos(path...), Field: fieldPath(path), Msg: msg, Hint: hint}
}

// YAML renders the resolved profile, with defaults, as YAML.
func (p *Profile) YAML() ([]byte, error) {
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(p); err != nil {
		return nil, fmt.Errorf("encoding profile: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("encoding profile: %w", err)
	}
	return buf.Bytes(), nil
}

// replaced are the lists that a child replaces whole instead of appending to:
// an argument list is one value, and its repeated words are meaningful.
var replaced = map[string]bool{"command": true}

// merge returns child laid over parent: maps merge, scalars override, lists
// append without duplicates (except the replaced ones). The result shares leaf
// nodes with its inputs, so positions survive; new mapping and sequence nodes
// are recorded as the child's. path is the dotted field path of the nodes.
func merge(path string, parent, child *yaml.Node, origin map[*yaml.Node]*Document, childDoc *Document) *yaml.Node {
	if parent == nil || replaced[path] || secretFrom(path) {
		return child
	}
	if child == nil {
		return parent
	}
	switch {
	case parent.Kind == yaml.MappingNode && child.Kind == yaml.MappingNode:
		out := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Line: child.Line, Column: child.Column}
		origin[out] = childDoc
		for i := 0; i+1 < len(parent.Content); i += 2 {
			k := parent.Content[i]
			v := parent.Content[i+1]
			if cv := lookup(child, k.Value); cv != nil {
				sub := k.Value
				if path != "" {
					sub = path + "." + k.Value
				}
				v = merge(sub, v, cv, origin, childDoc)
				k = lookupKey(child, k.Value)
			}
			out.Content = append(out.Content, k, v)
		}
		for i := 0; i+1 < len(child.Content); i += 2 {
			if lookup(parent, child.Content[i].Value) == nil {
				out.Content = append(out.Content, child.Content[i], child.Content[i+1])
			}
		}
		return out
	case parent.Kind == yaml.SequenceNode && child.Kind == yaml.SequenceNode:
		out := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq", Line: child.Line, Column: child.Column}
		origin[out] = childDoc
		var seen [][]byte
		add := func(n *yaml.Node) {
			key := canonical(n)
			if slices.ContainsFunc(seen, func(b []byte) bool { return bytes.Equal(b, key) }) {
				return
			}
			seen = append(seen, key)
			out.Content = append(out.Content, n)
		}
		for _, n := range parent.Content {
			add(n)
		}
		for _, n := range child.Content {
			add(n)
		}
		return out
	}
	return child
}

// canonical is a comparable form of a node's value, for list de-duplication.
func canonical(n *yaml.Node) []byte {
	var v any
	if err := n.Decode(&v); err != nil {
		return []byte(n.Value)
	}
	b, err := yaml.Marshal(v)
	if err != nil {
		return []byte(n.Value)
	}
	return b
}

// recordOrigin marks every node of a document's tree as coming from it.
func recordOrigin(n *yaml.Node, d *Document, origin map[*yaml.Node]*Document) {
	origin[n] = d
	for _, c := range n.Content {
		recordOrigin(c, d, origin)
	}
}
