package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/backend"
	"github.com/propio/propio-sandbox/internal/guard"
)

// maxNames bounds the names a launch tries: the name render shows, then
// NAME-2 ... while other launchers of this host run sandboxes of them.
const maxNames = 64

// claimName takes the project name of a launch in the workspace: the one
// render shows (generator.ProjectName), unless another launcher runs a
// sandbox of that name (taken says so for the engine's), then NAME-2,
// NAME-3 and so on. The name is held by a lock on a file under dir until
// release, against launchers of this user; a launcher that is killed lets
// go of it with its process.
func claimName(dir, workspace string, taken func(string) bool) (name string, release func(), err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", nil, fmt.Errorf("making the launch lock directory: %w", err)
	}
	base := generator.ProjectName(workspace, "")
	for i := 1; i <= maxNames; i++ {
		name = base
		if i > 1 {
			name = base + "-" + strconv.Itoa(i)
		}
		f, err := os.OpenFile(filepath.Join(dir, name+".lock"), os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return "", nil, fmt.Errorf("taking the sandbox's name: %w", err)
		}
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil && !taken(name) {
			return name, func() { f.Close() }, nil
		}
		f.Close()
		if err == nil {
			continue
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			return "", nil, fmt.Errorf("taking the sandbox's name: %w", err)
		}
	}
	return "", nil, fmt.Errorf("%d sandboxes of %s run already", maxNames, workspace)
}

// engineNames are the names of the engine's sandboxes: held by live
// launchers (or of other hosts, whose launchers it cannot see), or left by
// launchers that are gone.
type engineNames struct{ held, left map[string]bool }

func namesOn(ctx context.Context, rt backend.Runtime) (engineNames, error) {
	list, err := rt.List(ctx)
	if err != nil {
		return engineNames{}, err
	}
	n := engineNames{held: map[string]bool{}, left: map[string]bool{}}
	for _, sb := range list {
		if sb.Alive {
			n.held[sb.Project] = true
		} else {
			n.left[sb.Project] = true
		}
	}
	return n, nil
}

// reclaim makes the name free: what a killed launcher of the same name left
// on the engine is removed, and what it left in the workspace (its guard
// plan is still there) judged, before this launch uses the name.
func (s *launch) reclaim(ctx context.Context, names engineNames) error {
	name := s.opts.Project
	if names.left[name] {
		if err := s.rt.Remove(ctx, name, 0); err != nil {
			return fmt.Errorf("removing what an earlier sandbox of this name left: %w", err)
		}
		s.reclaimed = append(s.reclaimed, name)
	}
	plans, err := guard.Pending(s.Env.Dirs.GuardDir())
	if err != nil {
		return err
	}
	for _, plan := range plans {
		if plan.Project != name {
			continue
		}
		if err := reportCheck(s.report, plan, plan.Check(s.Env.Dirs.QuarantineDir()), s.Env.Dirs); err != nil {
			s.report.Failed(err)
		}
	}
	return nil
}

// runID makes the project name of a declared check unique.
func runID() string {
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		return fmt.Sprintf("%x", time.Now().UnixNano())
	}
	return hex.EncodeToString(b)
}
