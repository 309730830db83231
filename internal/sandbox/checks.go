package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/backend"
	"github.com/propio/propio-sandbox/internal/preflight"
	"github.com/propio/propio-sandbox/internal/profile"
)

// CheckSkipError: --skip-checks names a check that cannot be skipped.
type CheckSkipError struct{ Msg string }

func (e *CheckSkipError) Error() string { return e.Msg }

// CheckSkips validates the declared checks to skip: only declared checks
// can be skipped, never a built-in one.
func CheckSkips(p *profile.Profile, skip []string) error {
	var declared []string
	for _, c := range p.Checks {
		declared = append(declared, c.Name)
	}
	for _, s := range skip {
		switch {
		case slices.Contains(profile.BuiltinChecks, s):
			return &CheckSkipError{fmt.Sprintf("--skip-checks %q: built-in checks cannot be skipped, only the profile's own", s)}
		case !slices.Contains(declared, s):
			list := "it declares none"
			if len(declared) > 0 {
				list = "it declares: " + strings.Join(declared, ", ")
			}
			return &CheckSkipError{fmt.Sprintf("--skip-checks %q: %s has no such check (%s)", s, p.Meta.File, list)}
		}
	}
	return nil
}

// declaredChecks are the profile's own checks, but those skipped: each runs
// its command in a throwaway sandbox of the profile (the same network
// policy, gateway included, environment and mounts), which is removed
// afterwards, and passes when the command exits 0. Their output is kept for
// the reason of a failure, not shown.
func (s *launch) declaredChecks() []preflight.Check {
	var checks []preflight.Check
	for _, c := range s.Profile.Checks {
		if slices.Contains(s.Skip, c.Name) {
			continue
		}
		checks = append(checks, preflight.Check{Name: c.Name, Fn: func(ctx context.Context) preflight.Result {
			return s.declaredCheck(ctx, c)
		}})
	}
	return checks
}

func (s *launch) declaredCheck(ctx context.Context, c profile.DeclaredCheck) preflight.Result {
	timeout := c.Deadline()
	hints := []string{
		"fix what the check reports, then run again",
		"or skip it for this run: propio-sandbox run --skip-checks \"" + c.Name + "\"",
	}
	if s.Profile.Network.Mode == "allowlist" && allowlistRefused(s.facts) {
		return preflight.Result{Name: c.Name, Reason: "not run: network.mode allowlist needs Podman " + backend.FencedAllowlistSince + " or newer", Hints: []string{"upgrade Podman, or use Docker (--engine docker) for this profile"}}
	}
	o := s.opts
	o.Project = generator.ProjectName(s.Env.Workspace, "check-"+runID())
	o.Command = c.Run
	o.Timeout = timeout
	o.Keep = nil // a check of a persistent sandbox runs its command, and ends
	var project *types.Project
	var err error
	lookup := os.LookupEnv
	// A check is no agent: it has no directory to make requests in.
	adjust := func(h *generator.Host) { s.adjustAll(h); h.AgentDir = "" }
	if s.Profile.Network.Mode == "allowlist" {
		project, lookup, err = s.prepareGateway(ctx, o, adjust)
	} else {
		project, err = s.plan.Generate(o, adjust)
	}
	if err != nil {
		return preflight.Result{Name: c.Name, Reason: err.Error(), Hints: hints}
	}
	// Its output (and what the engine says while starting it) is kept.
	var out bytes.Buffer
	code, err := Run(ctx, s.rt, project, RunOptions{ImageChecked: true, Streams: backend.Streams{Out: &out, Err: &out}, LookupEnv: lookup, Host: s.host})
	if s.Profile.Network.Mode == "allowlist" {
		dropRunDirs(o.Project)
		if s.facts.Remote {
			if lerr := settleRemoteLog(s.Env.Dirs, o.Project); lerr != nil && err == nil {
				err = lerr
			}
		}
	}
	switch {
	case errors.Is(err, ErrTimeout):
		return preflight.Result{Name: c.Name, Reason: fmt.Sprintf("%v did not finish within %s%s", c.Run, timeout, tail(out.String())), Hints: hints}
	case err != nil:
		return preflight.Result{Name: c.Name, Reason: err.Error(), Hints: hints}
	case code != 0:
		return preflight.Result{Name: c.Name, Reason: fmt.Sprintf("%v exited %d%s", c.Run, code, tail(out.String())), Hints: hints}
	}
	return preflight.Result{Name: c.Name, OK: true, Reason: fmt.Sprintf("%v exited 0", c.Run), Hints: []string{}}
}

// tail is the end of a check's output, for the reason of a failure.
func tail(out string) string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) == 1 && lines[0] == "" {
		return ""
	}
	if len(lines) > 8 {
		lines = lines[len(lines)-8:]
	}
	return ":\n" + strings.Join(lines, "\n")
}
