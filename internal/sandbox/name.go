package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/backend"
	"github.com/propio/propio-sandbox/internal/guard"
)

// maxNames bounds the names a launch tries: the name render shows, then
// NAME-2 ... while other launchers of this host run sandboxes of them.
const maxNames = 64

// namesDir is where launchers of this host hold their sandboxes' names:
// one directory for every user (as /tmp is), since two users' sandboxes
// share the engine's names. A name another user's launcher holds, or that
// they made unusable, is passed over like one that is held.
func namesDir() (string, error) {
	dir := filepath.Join(os.TempDir(), "propio-sandbox-names")
	if err := os.Mkdir(dir, 0o777); err == nil {
		if err := os.Chmod(dir, 0o1777); err != nil {
			return "", fmt.Errorf("making the directory of sandbox names: %w", err)
		}
	} else if !errors.Is(err, os.ErrExist) {
		return "", fmt.Errorf("making the directory of sandbox names: %w", err)
	}
	return dir, nil
}

// claimName takes the project name of a launch in the workspace: the one
// render shows (generator.ProjectName), unless another launcher runs a
// sandbox of that name (taken says so for the engine's), then NAME-2,
// NAME-3 and so on. The name is held by a lock on a file under dir until
// release, against launchers of this host (of any user, when dir is
// namesDir); a launcher that is killed lets go of it with its process.
func claimName(dir, workspace string, taken func(string) bool) (name string, release func(), err error) {
	h, err := claimHeld(dir, workspace, taken)
	if err != nil {
		return "", nil, err
	}
	return h.Name, h.release, nil
}

// heldName is a sandbox name this process holds: the lock on its file,
// which a background process it hands the name to inherits (a lock held
// by either of them holds the name).
type heldName struct {
	Name string
	file *os.File
}

func (h *heldName) release() {
	if h != nil && h.file != nil {
		h.file.Close()
	}
}

// claimHeld is claimName's name and its lock.
func claimHeld(dir, workspace string, taken func(string) bool) (*heldName, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("making the launch lock directory: %w", err)
	}
	base := generator.ProjectName(workspace, "")
	for i := 1; i <= maxNames; i++ {
		name := base
		if i > 1 {
			name = base + "-" + strconv.Itoa(i)
		}
		f, err := openLock(filepath.Join(dir, name+".lock"))
		if errors.Is(err, os.ErrPermission) {
			continue // another user's, which only they can open
		}
		if err != nil {
			return nil, fmt.Errorf("taking the sandbox's name: %w", err)
		}
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil && !taken(name) {
			h := &heldName{Name: name, file: f}
			return h, h.answerFor(os.Getpid())
		}
		f.Close()
		if err == nil {
			continue
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("taking the sandbox's name: %w", err)
		}
	}
	return nil, fmt.Errorf("%d sandboxes of %s run already", maxNames, workspace)
}

// answerFor writes in the name's lock file the launchers whose sandboxes of
// the name its holders answer for (their pids, on the sandboxes' labels):
// the launcher that claimed it, a keeper, the run that adopted its gateway.
func (h *heldName) answerFor(pids ...int) error {
	var b strings.Builder
	for _, pid := range pids {
		fmt.Fprintf(&b, "%d\n", pid)
	}
	if err := h.file.Truncate(0); err != nil {
		return fmt.Errorf("taking the sandbox's name: %w", err)
	}
	if _, err := h.file.WriteAt([]byte(b.String()), 0); err != nil {
		return fmt.Errorf("taking the sandbox's name: %w", err)
	}
	return nil
}

// nameBusy reports whether a process of this host holds the sandbox name
// project and answers for what the launcher pid made of it: that launcher
// running it, or the background process removing what it left, or keeping
// it prepared. That is theirs to remove, never gc's. (A new launcher that
// holds the name answers for its own sandbox only: what an earlier one of
// the name left is a leftover.)
func nameBusy(dir, project string, pid int) bool {
	f, err := os.OpenFile(filepath.Join(dir, project+".lock"), os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return false // never claimed here, or another user's (whose launchers gc cannot see)
	}
	defer f.Close()
	if !errors.Is(syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB), syscall.EWOULDBLOCK) {
		return false
	}
	b, _ := io.ReadAll(io.LimitReader(f, 4096))
	return slices.Contains(strings.Fields(string(b)), strconv.Itoa(pid))
}

// openLock opens a name's lock file, never through a link, creating it so
// that every user can take it after this one lets go.
func openLock(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o666)
	if err == nil {
		return f, f.Chmod(0o666) // whatever the umask
	}
	if !errors.Is(err, os.ErrExist) {
		return nil, err
	}
	return os.OpenFile(path, os.O_RDWR|syscall.O_NOFOLLOW, 0)
}

// engineNames are the engine's sandboxes (list), and their names: held by
// live launchers (or of other hosts, whose launchers it cannot see), or
// left by launchers that are gone.
type engineNames struct {
	list []backend.Sandbox
	held map[string]bool
	left map[string][]int // the pids of the launchers that are gone
}

// namesOn lists the engine's sandboxes: those a process of this host
// answers for (a background process removing them, or keeping them) count
// as held, and are not listed to be removed.
func namesOn(ctx context.Context, rt backend.Runtime) (engineNames, error) {
	list, err := rt.List(ctx)
	if err != nil {
		return engineNames{}, err
	}
	dir, err := namesDir()
	if err != nil {
		return engineNames{}, err
	}
	n := engineNames{held: map[string]bool{}, left: map[string][]int{}}
	for _, sb := range list {
		switch {
		case !leftover(sb):
			n.held[sb.Project] = true
		case sb.Keep == "" && nameBusy(dir, sb.Project, sb.PID):
			n.held[sb.Project] = true
			continue // its background process's to remove
		default:
			n.left[sb.Project] = append(n.left[sb.Project], sb.PID)
		}
		n.list = append(n.list, sb)
	}
	return n, nil
}

// reclaim makes the name free: what a killed launcher of the same name left
// on the engine is removed, and what it left in the workspace (its guard
// plan is still there) judged, before this launch uses the name.
func (s *launch) reclaim(ctx context.Context, names engineNames) error {
	name := s.opts.Project
	// Only what the launchers that are gone made: another launcher may be
	// starting a sandbox of this name on the engine.
	for _, pid := range names.left[name] {
		if err := s.rt.Remove(ctx, name, pid); err != nil {
			return fmt.Errorf("removing what an earlier sandbox of this name left: %w", err)
		}
	}
	if len(names.left[name]) > 0 {
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
