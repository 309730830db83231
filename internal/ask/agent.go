package ask

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
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
		if a.Mount == nil || !filepath.IsAbs(a.Mount.Source) {
			return a, fmt.Errorf("a mount request needs \"mount\" with an absolute host path in \"source\"")
		}
	default:
		return a, fmt.Errorf("kind %q: want port, resources or mount", a.Kind)
	}
	return a, nil
}

// Request is the Request the launcher asks the user for a.
func (a AgentAsk) Request() Request {
	return Request{Kind: a.Kind, Via: "agent", Port: a.Port, Reason: a.Reason, Resources: a.Resources, Mount: a.Mount}
}
