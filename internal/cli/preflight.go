package cli

import (
	"cmp"
	"context"
	"errors"
	"os"

	"github.com/propio/propio-sandbox/internal/changeset/launch"
	"github.com/propio/propio-sandbox/internal/engine"
	"github.com/propio/propio-sandbox/internal/hostinfo"
	"github.com/propio/propio-sandbox/internal/preflight"
	"github.com/propio/propio-sandbox/internal/profile"
)

// engineConn is the engine the preflight checks connected to, kept for the
// launch that follows them.
type engineConn struct {
	eng  *engine.Engine
	stop func() error
	host string // where the engine was found: unix:///... or what DOCKER_HOST says
}

// close releases the connection and stops a Podman API service started for
// the launch; safe on a connection never made.
func (c *engineConn) close() {
	if c.eng != nil {
		c.eng.Close()
	}
	if c.stop != nil {
		c.stop()
	}
}

// preflightChecks are the built-in checks for p in e's workspace; the
// engine they connect to is kept in conn. For doctor, the disk check also
// says how a changeset would be made here (run does not ask: it costs a
// round trip to the engine).
func (a *app) preflightChecks(e env, p *profile.Profile, build bool, conn *engineConn, doctor bool) []preflight.Check {
	host := e.buildHost()
	var cs func(context.Context) (string, string)
	if doctor {
		cs = func(ctx context.Context) (string, string) {
			if conn.eng == nil {
				return "", ""
			}
			want, err := launch.Wanted()
			if err != nil {
				return "", ""
			}
			ov, err := conn.eng.OverlayCapable(ctx)
			if err != nil {
				return "", ""
			}
			mode, why, err := launch.ChooseMode(want, ov.OK, ov.Why, []string{e.workspace, e.dirs.State})
			if err != nil {
				return "", ""
			}
			return string(mode), why
		}
	}
	return preflight.Checks(preflight.Inputs{
		Changeset: cs,
		Profile:   p,
		Ref:       a.profile,
		Workspace: e.workspace,
		Home:      host.Home,
		Dangers:   e.grantHost().Dangers,
		Host:      host,
		Build:     build,
		Limits:    hostinfo.Limits(),
		Trust:     profile.TrustStore{Dir: e.dirs.State},
		Connect: func(ctx context.Context) (preflight.EngineConn, error) {
			want := cmp.Or(a.engine, p.Engine, engine.Auto)
			loc, err := engine.Locate(ctx, want, os.Getenv)
			if err != nil {
				return nil, engineHint(err, nil, "", want)
			}
			conn.stop, conn.host = loc.Stop, loc.Host
			eng, err := connect(ctx, a, loc)
			if err != nil {
				return nil, err
			}
			conn.eng = eng
			return eng, nil
		},
	})
}

// trustCheck runs the trust preflight check alone, for a build: the
// profile's trust and its build's.
func (a *app) trustCheck(e env, p *profile.Profile) preflight.Result {
	var conn engineConn // the trust check never connects
	for _, c := range a.preflightChecks(e, p, true, &conn, false) {
		if c.Name == preflight.Trust {
			return preflight.RunAll(context.Background(), []preflight.Check{c})[0]
		}
	}
	return preflight.Result{Name: preflight.Trust, Reason: "the trust check is missing from the built-in checks"}
}

// preflightFailed is a failed check as run reports it: exit 3, the check's
// name and reason, and its hints.
func preflightFailed(err error) error {
	var f *preflight.Failure
	if errors.As(err, &f) {
		return withCode{withHint(err, f.Hints...), ExitPreflight}
	}
	return err
}
