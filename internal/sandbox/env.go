// Package sandbox owns a sandbox's launch and what it leaves: from a
// resolved profile and the host facts it needs (a Plan, gathered once), it
// checks (preflight), connects to the engine, generates the Compose
// project, starts what the project needs (the SSH agent, the allowlist
// gateway, the changeset), runs the sandbox through the runtime and judges
// what it left (the git guard); and the changesets a run in changeset mode
// keeps for review (finding one, listing them, their diffs, applying and
// discarding them). It never prints: what a user should see goes to a
// Reporter, or is returned for the command line to show, and errors are
// returned, for the command line to present with what to do about them.
package sandbox

import (
	"errors"
	"os"

	"github.com/propio/propio-sandbox/internal/backend"
	"github.com/propio/propio-sandbox/internal/fsutil"
	"github.com/propio/propio-sandbox/internal/hostinfo"
	"github.com/propio/propio-sandbox/internal/profile"
)

// Env holds the directories and facts of the launcher's host that every
// command needs: where its state is, and the workspace.
type Env struct {
	Dirs      hostinfo.Dirs
	Workspace string
	Locs      profile.Locations
}

// LoadEnv gathers the launcher's directories and the workspace (the
// current directory).
func LoadEnv() (Env, error) {
	dirs, err := hostinfo.UserDirs()
	if err != nil {
		return Env{}, err
	}
	ws, err := hostinfo.Workspace()
	if err != nil {
		return Env{}, err
	}
	e := Env{Dirs: dirs, Workspace: ws, Locs: profile.Locations{ConfigDir: dirs.ProfileDir(), Workspace: ws}}
	host := e.GrantHost()
	e.Locs.Host = &host
	return e, nil
}

// Load loads the profile ref selects (a name, a path, or "" for the
// workspace's or the default one), and fits the cpus and memory it leaves
// to the defaults to this host. What it asks for itself loads the same on
// every host: preflight judges it against this one.
func (e Env) Load(ref string) (*profile.Profile, error) {
	p, err := e.Locs.Load(ref)
	if err != nil {
		return nil, err
	}
	p.FitDefaults(hostinfo.Limits())
	return p, nil
}

// GrantHost are the host facts that mount sources are judged on, with the
// engine sockets there may be and those a launch found (extra).
func (e Env) GrantHost(extra ...string) profile.GrantHost {
	home, _ := os.UserHomeDir()
	return profile.GrantHost{
		Home:       home,
		Workspace:  e.Workspace,
		PropioHome: hostinfo.PropioHome(),
		Sockets:    append(engineSockets(home), extra...),
		Resolve:    fsutil.Resolve,
		SameFile:   fsutil.SameFile,
	}
}

var errNoEngine = errors.New("not connected to an engine")

// DiskCapError: the sandbox wrote more than its cap; it was stopped.
type DiskCapError = backend.DiskCapError

// Where a sandbox may write, as a DiskCapError names it.
const (
	PlaceWritableLayer = backend.PlaceWritableLayer
	PlaceImageVolumes  = backend.PlaceImageVolumes
)
