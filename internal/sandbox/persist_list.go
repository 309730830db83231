package sandbox

import (
	"context"
	"sort"

	"github.com/propio/propio-sandbox/internal/backend"
	"github.com/propio/propio-sandbox/internal/hostinfo"
)

// Sandbox is a sandbox as ls shows it.
type Sandbox = backend.Sandbox

// List lists the sandboxes on the engine, and this user's persistent
// sandboxes as their records say (stopped ones, and gone ones with why,
// too), oldest first. A persistent sandbox shows its supervisor as its
// launcher.
func List(ctx context.Context, c *Conn, dirs hostinfo.Dirs) ([]Sandbox, error) {
	list, err := c.Runtime.List(ctx)
	if err != nil {
		return nil, err
	}
	if list, err = launchStates(list); err != nil {
		return nil, err
	}
	recs, err := Records(dirs)
	if err != nil {
		return nil, err
	}
	return withRecords(list, recs, dirs), nil
}

// ListRecords lists this user's persistent sandboxes as their records say,
// without the engine (which does not answer).
func ListRecords(dirs hostinfo.Dirs) ([]Sandbox, error) {
	recs, err := Records(dirs)
	if err != nil {
		return nil, err
	}
	return withRecords(nil, recs, dirs), nil
}

// withRecords is the engine's list with each persistent sandbox shown
// once, as its record says it is.
func withRecords(list []backend.Sandbox, recs []Record, dirs hostinfo.Dirs) []Sandbox {
	host := hostname()
	shown := map[string]bool{}
	var out []Sandbox
	for _, r := range recs {
		dir := keepDir(dirs, r.Name)
		shown[dir+"\x00"+r.ID] = true
		out = append(out, Sandbox{
			Project: r.Project, Workspace: r.Workspace, Profile: r.Profile,
			PID: r.Supervisor, Host: host, Alive: r.Supervised(),
			State: r.State, Created: r.Created, Persistent: true, Name: r.Name, Why: r.Why,
			Keep: dir, KeepID: r.ID,
		})
	}
	for _, s := range list {
		if s.Keep != "" {
			if shown[s.Keep+"\x00"+s.KeepID] {
				continue
			}
			// What a persistent sandbox left, its record forgotten: gc's.
			s.Persistent, s.Name, s.Alive = true, nameOf(s.Project), false
		}
		out = append(out, s)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out
}
