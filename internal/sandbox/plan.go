package sandbox

import (
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/grants"
	"github.com/propio/propio-sandbox/internal/guard"
	"github.com/propio/propio-sandbox/internal/hostinfo"
	"github.com/propio/propio-sandbox/internal/profile"
)

// Plan is what a launch (or render) generates its projects from: the
// resolved profile and the host facts it needs, gathered once (the
// workspace walk for its patterns, the account files, the extra mounts,
// the guard's scan of the git directories), for every project a launch
// makes: the sandbox's, the declared checks'.
type Plan struct {
	Env     Env
	Profile *profile.Profile
	// Guard is what the git guard holds and checks for this workspace.
	Guard guard.Plan
	// Warnings are about the workspace rules (rules not followed through a
	// symbolic link) and the guard's notes.
	Warnings []string
	host     generator.Host
}

// NewPlan gathers the host facts p needs in e's workspace. A bad
// PROPIO_SANDBOX_MOUNTS is a *hostinfo.MountsError.
func NewPlan(e Env, p *profile.Profile) (*Plan, error) {
	host, warnings, err := hostinfo.Gather(p, e.Workspace, e.Dirs)
	if err != nil {
		return nil, err
	}
	if p.Network.Mode == "allowlist" {
		if err := gatherGrants(&host, e); err != nil {
			return nil, err
		}
	}
	g := hostinfo.Guard(p, &host)
	return &Plan{Env: e, Profile: p, Guard: g, Warnings: append(warnings, g.Notes()...), host: host}, nil
}

// gatherGrants adds the user's grants for the workspace to the host facts,
// for the gateway of an allowlist sandbox.
func gatherGrants(h *generator.Host, e Env) error {
	gs, err := grants.For(e.Dirs, e.Workspace)
	if err != nil {
		return &GrantsFileError{Err: err}
	}
	h.GrantsFile = grants.File(e.Dirs, e.Workspace)
	for _, g := range gs {
		h.Grants = append(h.Grants, generator.Grant{N: g.N, Deny: g.Action == grants.Deny, Rule: g.Rule()})
	}
	return nil
}

// GrantsFileError is a grants file (internal/grants) that could not be
// read; the CLI says what to do about it.
type GrantsFileError struct{ Err error }

func (e *GrantsFileError) Error() string { return "reading your grants: " + e.Err.Error() }
func (e *GrantsFileError) Unwrap() error { return e.Err }

// Generate generates the project of the plan for o; adjust adds what the
// launch found out since (the engine's facts, a forwarded SSH agent, the
// changeset). Its errors name the profile file, line and column.
func (pl *Plan) Generate(o generator.Options, adjust ...func(*generator.Host)) (*types.Project, error) {
	h := pl.host // the adjustments change only fields of its own
	for _, f := range adjust {
		f(&h)
	}
	return generator.Generate(pl.Profile, h, o)
}

// Kubernetes generates the objects that run the plan's sandbox on a
// cluster (generator.Kubernetes), from the same plan as its project.
func (pl *Plan) Kubernetes(o generator.Options, ko generator.KubeOptions, adjust ...func(*generator.Host)) (*generator.KubeObjects, error) {
	h := pl.host
	for _, f := range adjust {
		f(&h)
	}
	return generator.Kubernetes(pl.Profile, h, o, ko)
}
