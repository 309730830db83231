package ask

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/propio/propio-sandbox/internal/termsafe"
)

// The agent's side: a sandbox whose profile has agent_requests gets a
// directory of its own on the host (AgentBaseDir/PROJECT), mounted
// read-only in the agent's container at /run/propio-sandbox, where the
// launcher serves AgentSocketName:
//
//	POST /v1/requests   an AgentAsk; answered, once decided, with an Answer
//
// The launcher asks the user through a Broker of its own, served as
// LauncherSocketName in the sandbox's ask directory, beside the gateway's
// ask.sock: the agent's directory never holds an approval socket.
const (
	AgentSocketName    = "request.sock"
	LauncherSocketName = "launcher.sock"
)

// AgentAsk is the body of an agent's request.
type AgentAsk struct {
	Kind      string        `json:"kind"` // port | resources | mount
	Reason    string        `json:"reason"`
	Port      int           `json:"port,omitempty"`
	Resources *ResourcesAsk `json:"resources,omitempty"`
	Mount     *MountAsk     `json:"mount,omitempty"`
}

// Answer is what the agent is told of its request: the decision, who
// made it, and what came of it when it was allowed (Result), or why it
// could not be carried out (Error: the decision is then deny).
type Answer struct {
	Decision  string         `json:"decision"` // allow | deny
	DecidedBy string         `json:"decided_by"`
	Result    map[string]any `json:"result,omitempty"`
	Error     string         `json:"error,omitempty"`
}

// AgentBaseDir is the directory of the agents' directories, the sibling of
// BaseDir: $XDG_RUNTIME_DIR/propio-sandbox/agent, else under
// $XDG_STATE_HOME.
func AgentBaseDir() (string, error) {
	base, err := BaseDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(filepath.Dir(base), "agent"), nil
}

// MakeAgentDir creates the agent's directory of project under base, empty
// (one left by an earlier sandbox of the name is replaced), and returns it.
// base is the user's alone (0700); the directory itself is 0755, so that
// the agent's user in the container, whichever it is, reaches the socket.
func MakeAgentDir(base, project string) (string, error) {
	if err := os.MkdirAll(base, 0o700); err != nil {
		return "", fmt.Errorf("making the agent's directory: %w", err)
	}
	dir := filepath.Join(base, project)
	if err := os.RemoveAll(dir); err != nil {
		return "", fmt.Errorf("making the agent's directory: %w", err)
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", fmt.Errorf("making the agent's directory: %w", err)
	}
	if err := os.Chmod(dir, 0o755); err != nil { // whatever the umask
		return "", fmt.Errorf("making the agent's directory: %w", err)
	}
	return dir, nil
}

// ParseAgentAsk decodes and checks an agent's request: a kind of the
// agent's, a reason, and the details of its kind.
func ParseAgentAsk(b []byte) (AgentAsk, error) {
	var a AgentAsk
	if err := json.Unmarshal(b, &a); err != nil {
		return a, fmt.Errorf("the request is not JSON of the form {\"kind\": ..., \"reason\": ...}: %w", err)
	}
	if a.Reason == "" {
		return a, fmt.Errorf("say why in \"reason\": the user sees it")
	}
	if len(a.Reason) > 500 {
		return a, fmt.Errorf("the reason is longer than 500 characters")
	}
	if err := a.inert(); err != nil {
		return a, err
	}
	switch a.Kind {
	case KindPort:
		if a.Port < 1 || a.Port > 65535 {
			return a, fmt.Errorf("a port request needs \"port\": 1 to 65535")
		}
	case KindResources:
		r := a.Resources
		if r == nil || r.CPUs <= 0 && r.Memory <= 0 && r.PIDs <= 0 {
			return a, fmt.Errorf("a resources request needs \"resources\" with cpus, memory (bytes) or pids")
		}
		if r.CPUs < 0 || r.Memory < 0 || r.PIDs < 0 {
			return a, fmt.Errorf("resources may not be negative")
		}
	case KindMount:
		if a.Mount == nil || !filepath.IsAbs(a.Mount.Source) && !strings.HasPrefix(a.Mount.Source, "~/") {
			return a, fmt.Errorf("a mount request needs \"mount\" with an absolute host path (or ~/...) in \"source\"")
		}
		a.Mount.Resolved = "" // the launcher's to say
	default:
		return a, fmt.Errorf("kind %q: want port, resources or mount", a.Kind)
	}
	return a, nil
}

// inert refuses the agent's own words the user is shown, its reason and a
// mount's target, when they hold a character a terminal would act on (an
// escape that clears the screen or writes the clipboard, a bidi control
// that reorders what is read): the agent has no reason to send them. A
// mount's source names a host path as it is; the frontends show it inert.
func (a AgentAsk) inert() error {
	err := termsafe.Check("reason", a.Reason)
	if a.Mount != nil {
		err = errors.Join(err, termsafe.Check("mount.target", a.Mount.Target))
	}
	return err
}

// Request is the Request the launcher asks the user for a.
func (a AgentAsk) Request() Request {
	return Request{Kind: a.Kind, Via: "agent", Port: a.Port, Reason: a.Reason, Resources: a.Resources, Mount: a.Mount}
}

// What says what r asks for, as frontends show it: host:port (the name
// alone for a DNS lookup) for a network request; "port 3000",
// "cpus 4, memory 4GiB, pids 500" or a host path (MountAsk.Path, ", write"
// when asked) for an agent's.
func (r Request) What() string {
	switch r.Kind {
	case KindPort:
		return "port " + strconv.Itoa(r.Port)
	case KindResources:
		if r.Resources != nil {
			return r.Resources.String()
		}
	case KindMount:
		if r.Mount != nil {
			s := r.Mount.Path()
			if r.Mount.Target != "" {
				s += " at " + r.Mount.Target
			}
			if r.Mount.Write {
				s += ", write"
			}
			return s
		}
	}
	if r.Port == 0 {
		return r.Host
	}
	return net.JoinHostPort(r.Host, strconv.Itoa(r.Port))
}

// String is the limits asked for: "cpus 4, memory 4GiB, pids 500".
func (r ResourcesAsk) String() string {
	var parts []string
	if r.CPUs > 0 {
		parts = append(parts, "cpus "+strconv.FormatFloat(r.CPUs, 'g', -1, 64))
	}
	if r.Memory > 0 {
		parts = append(parts, "memory "+Bytes(r.Memory))
	}
	if r.PIDs > 0 {
		parts = append(parts, "pids "+strconv.FormatInt(r.PIDs, 10))
	}
	return strings.Join(parts, ", ")
}

// Bytes says n bytes in the largest binary unit that divides it, or with
// one decimal in GiB or MiB: 4GiB, 1.5GiB, 768MiB, 1000B.
func Bytes(n int64) string {
	for _, u := range []struct {
		size int64
		name string
	}{{1 << 30, "GiB"}, {1 << 20, "MiB"}, {1 << 10, "KiB"}} {
		switch {
		case n >= u.size && n%u.size == 0:
			return strconv.FormatInt(n/u.size, 10) + u.name
		case n >= u.size && u.size >= 1<<20:
			return strconv.FormatFloat(float64(n)/float64(u.size), 'f', 1, 64) + u.name
		}
	}
	return strconv.FormatInt(n, 10) + "B"
}

// ErrNotGrantable: an agent's request is decided for itself: "always" (a
// grant, for a host and port) does not apply to it.
var ErrNotGrantable = errors.New("an agent's request (port, resources, mount) is decided once: always is for network requests")

// Grantable reports whether a decision for always can be kept for r as a
// grant: network requests only.
func Grantable(r Request) bool { return r.Kind == "" || r.Kind == KindNetwork }
