package sandbox

import (
	"cmp"
	"context"
	"os"

	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/hostinfo"
	"github.com/propio/propio-sandbox/internal/preflight"
	"github.com/propio/propio-sandbox/internal/profile"
)

// Preflight are the built-in checks of a profile in a workspace, which run
// and doctor pass before anything is created. The engine the checks reach
// is kept (Conn) for the launch that follows them.
type Preflight struct {
	Env     Env
	Profile *profile.Profile
	Ref     string // how the user named the profile (-p), for hints
	Engine  string // the engine asked for (--engine); the profile's when empty
	Build   bool   // as for run --build: an image the profile can build need not be there yet
	Streams Streams
	// Hint says what to do about an engine that cannot be reached (the
	// command line's words); nil leaves the error as it is.
	Hint func(error) error
	// ChangesetMode, for doctor, says how a changeset would be made on the
	// engine reached (run does not ask: it costs a round trip).
	ChangesetMode func(ctx context.Context, c *Conn) (mode, why string)

	// Conn is the engine the checks connected to, if they did: the caller
	// closes it.
	Conn *Conn
	// Missing: the image is not on the engine, and the launch builds it
	// first (the profile says how, and may).
	Missing bool

	// Fresh: the engine's facts are asked of it, not taken from what its
	// process said before (doctor).
	Fresh bool
	// Early, when set, is a connection started before the profile was
	// read, used when it is to the engine the checks want.
	Early *Early

	// connected, when set, is told of the connection as soon as it is
	// made (a launch lists the engine's sandboxes meanwhile).
	connected func(*Conn)
}

// Checks are the built-in checks, in the order run passes them.
func (f *Preflight) Checks() []preflight.Check { return preflight.Checks(f.inputs()) }

func (f *Preflight) inputs() preflight.Inputs {
	host := f.Env.BuildHost(f.Profile)
	var cs func(context.Context) (string, string)
	if f.ChangesetMode != nil {
		cs = func(ctx context.Context) (string, string) {
			if f.Conn == nil {
				return "", ""
			}
			return f.ChangesetMode(ctx, f.Conn)
		}
	}
	return preflight.Inputs{
		Changeset: cs,
		Profile:   f.Profile,
		Ref:       f.Ref,
		Workspace: f.Env.Workspace,
		Home:      host.Home,
		Dangers:   f.Env.GrantHost().Dangers,
		Host:      host,
		Build:     f.Build,
		Limits:    hostinfo.Limits(),
		Trust:     profile.TrustStore{Dir: f.Env.Dirs.State},
		Connect:   f.connect,
		Missing:   func() { f.Missing = true },
	}
}

func (f *Preflight) connect(ctx context.Context) (preflight.EngineConn, error) {
	want := cmp.Or(f.Engine, f.Profile.Engine)
	c, err, early := f.Early.take(ctx, want)
	if !early {
		c, err = Connect(ctx, want, f.Streams)
	}
	if err != nil {
		if f.Hint != nil {
			err = f.Hint(err)
		}
		return nil, err
	}
	f.Conn = c
	if f.Fresh {
		c.freshInfo()
	}
	if f.connected != nil {
		f.connected(c)
	}
	return c.Runtime, nil
}

// Run passes the checks in order, stopping at the first that fails (a
// *preflight.Failure).
func (f *Preflight) Run(ctx context.Context) error { return preflight.Run(ctx, f.Checks()) }

// TrustCheck runs the trust check alone, for a build: the profile's trust
// and its build's.
func (f *Preflight) TrustCheck() preflight.Result {
	for _, c := range f.Checks() {
		if c.Name == preflight.Trust {
			return preflight.RunAll(context.Background(), []preflight.Check{c})[0]
		}
	}
	return preflight.Result{Name: preflight.Trust, Reason: "the trust check is missing from the built-in checks"}
}

// BuildHost is the generator's view of the host that p's build and mount
// paths need.
func (e Env) BuildHost(p *profile.Profile) generator.Host {
	home, _ := os.UserHomeDir()
	h := generator.Host{Workspace: e.Workspace, Home: home, PropioHome: hostinfo.PropioHome()}
	h.BuiltinContext = hostinfo.BuiltinContext(p, h, e.Dirs)
	return h
}

// Declared are the profile's own checks, each in a throwaway sandbox on the
// engine the built-in checks reached, as run passes them after those.
func (f *Preflight) Declared(plan *Plan, report Reporter) ([]preflight.Check, error) {
	if f.Conn == nil {
		return nil, errNoEngine
	}
	// The engine's facts come from the info its preflight read.
	facts, err := f.Conn.Runtime.Facts(context.Background())
	if err != nil {
		return nil, err
	}
	s := &launch{Launch: &Launch{Env: f.Env, Profile: f.Profile, Ref: f.Ref, Report: report}, report: report, plan: plan, rt: f.Conn.Runtime, facts: facts}
	s.opts = generator.Options{Project: generator.ProjectName(f.Env.Workspace, "")}
	if f.Profile.Network.Mode == "allowlist" {
		if err := GatewayOptions(&s.opts, f.Env.Dirs); err != nil {
			return nil, err
		}
	}
	s.adjust = append(s.adjust, s.engineFacts)
	return s.declaredChecks(), nil
}
