package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/daemon"
	"github.com/propio/propio-sandbox/internal/hostinfo"
)

// A launch's background work: what it hands over to processes of their
// own, so that the launcher returns as soon as the sandbox's command has
// ended and what is about the user's files is done (the guard's check,
// the copies back, the changeset). Each takes over the sandbox's name
// (the lock's file descriptor, inherited), so that no launch takes the name
// while its resources are removed by the name's label, and gc leaves them
// to it; a background process that is killed lets go of the name, and gc
// removes what it left (the launcher's pid on its labels is gone).
//
// While a background process of a workspace works (removes, or prepares a
// gateway ahead), it holds the workspace's busy lock, shared: WaitBackground
// waits until none does.

// BackgroundArg is the hidden subcommand background processes run as.
const BackgroundArg = "_background"

// backgroundDir is where the user's background processes keep their log,
// sockets and the workspaces' busy locks.
func backgroundDir(dirs hostinfo.Dirs) (string, error) {
	dir := filepath.Join(dirs.State, "background")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("making the directory of background work: %w", err)
	}
	return dir, nil
}

// maxLog is the size past which the background log is started again (the
// last one kept as log.old).
const maxLog = 1 << 20

// backgroundLog is the log background processes append to.
func backgroundLog(dir string) string {
	path := filepath.Join(dir, "log")
	if fi, err := os.Stat(path); err == nil && fi.Size() > maxLog {
		os.Rename(path, path+".old")
	}
	return path
}

// holdBusy takes the workspace's busy lock, shared, for background work
// about to start (the process doing it inherits it).
func holdBusy(dir, workspace string) (*os.File, error) {
	f, err := os.OpenFile(busyPath(dir, workspace), os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("taking the workspace's busy lock: %w", err)
	}
	// Blocks only while WaitBackground, which holds it exclusively for an
	// instant, looks.
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH); err != nil {
		f.Close()
		return nil, fmt.Errorf("taking the workspace's busy lock: %w", err)
	}
	return f, nil
}

func busyPath(dir, workspace string) string {
	return filepath.Join(dir, generator.ProjectName(workspace, "")+".busy")
}

// WaitBackground waits until no background process of the user works for
// the workspace: what its sandboxes' launchers handed over is removed, the
// gateway prepared ahead is ready. ctx bounds the wait.
func WaitBackground(ctx context.Context, dirs hostinfo.Dirs, workspace string) error {
	f, err := os.OpenFile(busyPath(filepath.Join(dirs.State, "background"), workspace), os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil // nothing was ever handed over
	}
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() {
		// An exclusive lock is granted once every shared one is released;
		// it is let go at once.
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		f.Close()
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("background work for %s still goes on: %w", workspace, ctx.Err())
	}
}

// Removal is what a launcher hands over once its sandbox's command has
// ended: removing what its launcher made of a project, on an engine.
type Removal struct {
	Host     string // where the engine listens
	Project  string
	Launcher int // the pid on what the launcher made; 0: all of the project
	// Streams are where the engine's client says what it does (the
	// background log).
	Streams Streams
}

// Args are the background process's arguments.
func (r Removal) Args() []string {
	return []string{BackgroundArg, "remove", "--host", r.Host, "--project", r.Project, "--launcher", strconv.Itoa(r.Launcher)}
}

// Run removes what the launcher made, in the background process (which
// holds the name and the busy lock it inherited until it exits).
func (r Removal) Run(ctx context.Context) error {
	c, err := connectHost(ctx, r.Host, r.Streams)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.Runtime.Remove(ctx, r.Project, r.Launcher); err != nil {
		return fmt.Errorf("removing sandbox %s: %w", r.Project, err)
	}
	dropRunDirs(r.Project)
	return nil
}

// handOff starts a background process that removes what this launcher made
// of project, holding the name (and the workspace's busy lock) while it
// does; for a run on a gateway prepared ahead, it tells the gateway's keeper,
// which removes all of it. It reports whether it did: when not (a
// changeset's run, whose removal settles its overlay; a Podman service
// started for the launch, which stops with it), the caller removes it.
func (s *launch) handOff(project string) bool {
	if s.removeHere {
		return false
	}
	launcher := os.Getpid()
	if s.adopted != nil {
		if s.adopted.release() {
			return true // its keeper removes all of it
		}
		launcher = 0 // the keeper is gone: what it made is the name's too
	}
	if s.name == nil || s.tempEngine {
		// A Podman service started for the launch stops with it: nothing
		// would be left to remove through.
		return false
	}
	dir, err := backgroundDir(s.Env.Dirs)
	if err != nil {
		return false
	}
	busy, err := holdBusy(dir, s.Env.Workspace)
	if err != nil {
		return false
	}
	defer busy.Close()
	r := Removal{Host: s.host, Project: project, Launcher: launcher}
	_, err = daemon.Spawn(daemon.Spec{Args: r.Args(), Log: backgroundLog(dir), Dir: "/", Files: []*os.File{s.name.file, busy}})
	return err == nil
}
