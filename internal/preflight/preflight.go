// Package preflight holds the checks a sandbox must pass before anything of
// it is created: the engine is reachable, the image is there, the workspace
// is one a sandbox may have, mount sources exist, required variables are
// set, host ports are free, the profile is trusted, resources fit the host
// and the runtime exists. Each check has a stable name and gives a pass or
// a fail with a reason and hints on what to do.
//
// It never prints and never creates anything: it only looks. The engine is
// reached through the small Engine interface, which internal/engine
// implements; everything else of the host through Inputs' functions, so that
// tests can stand in for them.
package preflight

import (
	"context"
	"fmt"
)

// Names of the built-in checks, in the order they run.
const (
	Workspace   = "workspace"
	Trust       = "trust"
	EnvRequired = "env.required"
	Resources   = "resources"
	Mounts      = "mounts"
	Ports       = "ports"
	SSHAgent    = "ssh-agent"
	Engine      = "engine"
	Image       = "image"
	Runtime     = "runtime"
	NetworkJoin = "network.join"
	Disk        = "disk"
	// Cluster: a Kubernetes cluster's own facts (run --engine kubernetes),
	// in place of the engine's checks.
	Cluster = "cluster"
	// NetworkPolicy: doctor's probe of whether a cluster's CNI enforces
	// NetworkPolicy (doctor --engine kubernetes).
	NetworkPolicy = "network-policy"
)

// Result is how one check went.
type Result struct {
	// Name is the check's stable name.
	Name string `json:"name"`
	// OK is true when the check passed.
	OK bool `json:"ok"`
	// Reason says what was found: why it passed or why it failed.
	Reason string `json:"reason"`
	// Hints say what to do about a failure; none for a pass.
	Hints []string `json:"hints"`
}

func pass(reason string) Result { return Result{OK: true, Reason: reason, Hints: []string{}} }

func fail(reason string, hints ...string) Result {
	if hints == nil {
		hints = []string{}
	}
	return Result{Reason: reason, Hints: hints}
}

// Check is one named check.
type Check struct {
	Name string
	Fn   func(context.Context) Result
}

// Failure is the error of the first check that failed.
type Failure struct{ Result }

func (f *Failure) Error() string {
	return fmt.Sprintf("preflight check %s failed: %s", f.Name, f.Reason)
}

// Run runs checks in order and stops at the first failure, which it returns
// as a *Failure.
func Run(ctx context.Context, checks []Check) error {
	for _, c := range checks {
		if r := run(ctx, c); !r.OK {
			return &Failure{r}
		}
	}
	return nil
}

// RunAll runs every check, whatever the earlier ones gave, and returns
// their results in order.
func RunAll(ctx context.Context, checks []Check) []Result {
	out := make([]Result, 0, len(checks))
	for _, c := range checks {
		out = append(out, run(ctx, c))
	}
	return out
}

// OK reports whether every result passed.
func OK(results []Result) bool {
	for _, r := range results {
		if !r.OK {
			return false
		}
	}
	return true
}

func run(ctx context.Context, c Check) Result {
	r := c.Fn(ctx)
	r.Name = c.Name
	if r.Hints == nil {
		r.Hints = []string{}
	}
	return r
}
