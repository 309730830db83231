package cli

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/engine"
	"github.com/propio/propio-sandbox/internal/preflight"
	"github.com/propio/propio-sandbox/internal/profile"
	"github.com/propio/propio-sandbox/internal/sandbox"
)

// checkSkips validates --skip-checks: only declared checks can be skipped,
// never a built-in one.
func checkSkips(p *profile.Profile, skip []string) error {
	var declared []string
	for _, c := range p.Checks {
		declared = append(declared, c.Name)
	}
	for _, s := range skip {
		switch {
		case slices.Contains(profile.BuiltinChecks, s):
			return usageError{fmt.Errorf("--skip-checks %q: built-in checks cannot be skipped, only the profile's own", s)}
		case !slices.Contains(declared, s):
			list := "it declares none"
			if len(declared) > 0 {
				list = "it declares: " + strings.Join(declared, ", ")
			}
			return usageError{fmt.Errorf("--skip-checks %q: %s has no such check (%s)", s, p.Meta.File, list)}
		}
	}
	return nil
}

// declaredChecks are the profile's own checks, but those in skip: each runs
// its command in a throwaway sandbox of the profile (the same network
// policy, gateway included, environment and mounts), which is removed
// afterwards, and passes when the command exits 0. Their output is kept for
// the reason of a failure, not shown.
func (a *app) declaredChecks(eng *engine.Engine, e env, p *profile.Profile, o generator.Options, gen generateFunc, adjust func(*generator.Host), skip []string) []preflight.Check {
	var checks []preflight.Check
	for _, c := range p.Checks {
		if slices.Contains(skip, c.Name) {
			continue
		}
		checks = append(checks, preflight.Check{Name: c.Name, Fn: func(ctx context.Context) preflight.Result {
			return a.declaredCheck(ctx, eng, e, p, o, gen, adjust, c)
		}})
	}
	return checks
}

func (a *app) declaredCheck(ctx context.Context, eng *engine.Engine, e env, p *profile.Profile, o generator.Options, gen generateFunc, adjust func(*generator.Host), c profile.DeclaredCheck) preflight.Result {
	timeout, _ := time.ParseDuration(cmp.Or(c.Timeout, profile.DefaultCheckTimeout)) // Check has parsed it
	hints := []string{
		"fix what the check reports, then run again",
		"or skip it for this run: " + name + " run --skip-checks \"" + c.Name + "\"",
	}
	if p.Network.Mode == "allowlist" && eng.Kind == engine.Podman {
		return preflight.Result{Name: c.Name, Reason: "not run: network.mode allowlist does not run on Podman yet", Hints: []string{"use Docker for this profile (--engine docker)"}}
	}
	var out bytes.Buffer
	capture, err := engine.Connect(ctx, eng.Host, engine.Streams{Out: &out, Err: &out})
	if err != nil {
		return preflight.Result{Name: c.Name, Reason: err.Error(), Hints: hints}
	}
	defer capture.Close()
	o.Project = generator.ProjectName(e.workspace, "check-"+runID())
	o.Command = c.Run
	var project *types.Project
	if p.Network.Mode == "allowlist" {
		project, err = a.prepareGateway(ctx, capture, e, p, o, gen, adjust)
	} else {
		project, err = gen(o, adjust)
	}
	if err != nil {
		return preflight.Result{Name: c.Name, Reason: err.Error(), Hints: hints}
	}
	code, err := sandbox.Run(ctx, capture, project, sandbox.RunOptions{Timeout: timeout, ImageChecked: true})
	switch {
	case errors.Is(err, sandbox.ErrTimeout):
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
