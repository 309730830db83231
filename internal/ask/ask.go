// Package ask is the protocol by which an allowlist sandbox's gateway asks
// the user about a connection no rule decides (network.unlisted: ask): the
// types both ends share, the host-side client (Find, Pending, Watch, Decide)
// that the CLI's frontends use, and the gateway-side Broker that holds the
// pending requests and serves them.
//
// The transport is HTTP over a unix socket, ask.sock, in a directory of the
// user's on the host (Dir), mode 0700, with sandbox.json beside it; the
// launcher bind-mounts that directory into the gateway's container only,
// never the agent's. Endpoints:
//
//	GET  /v1/requests        the pending requests, a JSON array
//	GET  /v1/watch           NDJSON Events: every pending request first, then
//	                         each new one and each decision; while at least
//	                         one watch is open an approver is attached
//	POST /v1/requests/{id}   a Decision; 404 when the request is gone
//
// The launcher of a sandbox whose profile has agent_requests serves a Broker
// of its own, as launcher.sock in the same directory, for the requests the
// agent makes from inside (agent.go); the client covers every socket of
// the directory.
//
// The package prints nothing and never exits.
package ask

import (
	"errors"
	"fmt"
	"time"
)

// Request is one pending question: may the sandbox reach Host:Port (Kind
// network, the gateway's), or may the agent have what it asks for from
// inside (Kind port, resources or mount, the launcher's)?
type Request struct {
	ID   string `json:"id"`   // unique per sandbox, short
	Kind string `json:"kind"` // network | port | resources | mount
	Host string `json:"host"` // name (or address) asked for
	// Port is the port asked for: of Host (0 for a DNS lookup: the name on
	// 80 and 443), or, for a port request, the sandbox's port to publish.
	Port      int           `json:"port"`
	Via       string        `json:"via"` // http, connect, socks5, dns, sni, host; "agent" for the agent's
	Project   string        `json:"project"`
	Workspace string        `json:"workspace"`
	Reason    string        `json:"reason"`              // why it asks: "no network.allow rule matches", or the agent's words
	Resources *ResourcesAsk `json:"resources,omitempty"` // a resources request's
	Mount     *MountAsk     `json:"mount,omitempty"`     // a mount request's
	Created   time.Time     `json:"created"`
}

// ResourcesAsk is what a resources request asks for: the new limits of the
// agent's container; a zero field is left as it is.
type ResourcesAsk struct {
	CPUs   float64 `json:"cpus,omitempty"`
	Memory int64   `json:"memory,omitempty"` // bytes
	PIDs   int64   `json:"pids,omitempty"`
}

// MountAsk is what a mount request asks for: the host path Source to appear
// at Target inside, read-only unless Write. Resolved is the host path the
// launcher would copy, as it judged Source before asking anyone: what the
// user is shown and decides. The agent never sets it.
type MountAsk struct {
	Source   string `json:"source"`
	Target   string `json:"target,omitempty"`
	Write    bool   `json:"write,omitempty"`
	Resolved string `json:"resolved,omitempty"`
}

// Path is the host path a mount request copies, as the user is shown it:
// Resolved, and "SOURCE → RESOLVED" when the agent asked for it by another
// name (~/...); Source itself before it is judged.
func (m MountAsk) Path() string {
	switch m.Resolved {
	case "":
		return m.Source
	case m.Source:
		return m.Resolved
	}
	return m.Source + " → " + m.Resolved
}

// The kinds of request: the gateway asks KindNetwork; the agent asks the
// others through the launcher.
const (
	KindNetwork   = "network"
	KindPort      = "port"
	KindResources = "resources"
	KindMount     = "mount"
)

// Decision is an answer to a Request.
type Decision struct {
	Action string `json:"action"` // "allow" | "deny"
	Scope  string `json:"scope"`  // "once" | "run" | "always"
}

// Actions and scopes of a Decision. ScopeAlways is written to the user's
// grants by the frontend before it posts the decision; the gateway treats
// it as ScopeRun and logs it as it is.
const (
	Allow = "allow"
	Deny  = "deny"

	ScopeOnce   = "once"
	ScopeRun    = "run"
	ScopeAlways = "always"
)

// Who decided a request, as the decision log says it (DecidedBy).
const (
	ByRule       = "rule"
	ByUser       = "user"
	ByTimeout    = "timeout"
	ByNoApprover = "no-approver"
)

// Validate reports whether d is a decision a gateway takes.
func (d Decision) Validate() error {
	if d.Action != Allow && d.Action != Deny {
		return fmt.Errorf("action %q: want allow or deny", d.Action)
	}
	return ValidScope(d.Scope)
}

// ValidScope reports whether s is once, run or always.
func ValidScope(s string) error {
	switch s {
	case ScopeOnce, ScopeRun, ScopeAlways:
		return nil
	}
	return fmt.Errorf("scope %q: want once, run or always", s)
}

// Event is one line of the watch stream (NDJSON).
type Event struct {
	Type      string    `json:"type"` // "pending" | "decided"
	Request   Request   `json:"request"`
	Decision  *Decision `json:"decision,omitempty"`   // with "decided"
	DecidedBy string    `json:"decided_by,omitempty"` // user | timeout | no-approver
}

// Event types.
const (
	EventPending = "pending"
	EventDecided = "decided"
)

// ErrGone is returned by Decide when the request is no longer pending: it
// was decided (by someone else, or its timeout), or its connection ended.
var ErrGone = errors.New("the request is no longer pending")

// File names in a sandbox's ask directory.
const (
	SocketName  = "ask.sock"
	SandboxFile = "sandbox.json"
)
