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
// The package prints nothing and never exits.
package ask

import (
	"errors"
	"fmt"
	"time"
)

// Request is one pending question: may the sandbox reach Host:Port?
type Request struct {
	ID        string    `json:"id"`   // unique per gateway, short
	Kind      string    `json:"kind"` // "network"
	Host      string    `json:"host"` // name (or address) asked for
	Port      int       `json:"port"` // 0 for a DNS lookup: the name on 80 and 443
	Via       string    `json:"via"`  // http, connect, socks5, dns, sni, host
	Project   string    `json:"project"`
	Workspace string    `json:"workspace"`
	Reason    string    `json:"reason"` // why it asks: "no network.allow rule matches"
	Created   time.Time `json:"created"`
}

// KindNetwork is the Kind of a request to reach a host.
const KindNetwork = "network"

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
