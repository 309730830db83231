package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

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

// A launch's watchdog: a background process started once the sandbox has
// its name, before anything of it is made, that removes what the launcher
// makes of it at once when the launcher dies without saying it is done
// (SIGKILL, a crash): nothing else would stop the sandbox until its
// command ends (the disk cap's watch and the timeout are the launcher's),
// and gc runs only when asked. It holds the name from the start, as the
// launcher does (gc leaves the sandbox to it), and lets go of it as soon as
// the launcher says it is done.

// Watchdog is the watchdog's work, in its own process: its files are the
// name's lock, the workspace's busy lock (not taken: it takes it once it
// removes) and its end of the launcher's connection.
type Watchdog struct {
	Removal
}

// Args are the watchdog's arguments.
func (w Watchdog) Args() []string {
	return append([]string{BackgroundArg, "watch"}, w.Removal.Args()[2:]...)
}

// LauncherGone waits until the launcher says it is done (then it lets go
// of the name and the busy lock at once, and reports false) or is gone
// without saying so (then it takes the busy lock and reports true).
func (w Watchdog) LauncherGone() bool {
	name, busy, launcher := daemon.File(0, "name lock"), daemon.File(1, "busy lock"), daemon.File(2, "launcher")
	if name == nil || busy == nil || launcher == nil {
		return false // not started by a launcher: nothing to watch
	}
	b := make([]byte, 1)
	n, _ := launcher.Read(b) // blocks until the launcher writes, or its end closes
	if n == 1 && b[0] == watchdogDone {
		name.Close()
		busy.Close()
		launcher.Close() // the launcher waits for this to go on
		return false
	}
	syscall.Flock(int(busy.Fd()), syscall.LOCK_SH)
	return true
}

// watchdogDone is what a launcher writes to its watchdog when it is done.
const watchdogDone = 'd'

// watchdog is the launcher's end of its watchdog's connection.
type watchdog struct{ c *net.UnixConn }

// startWatchdog starts the watchdog of the sandbox of project, or says why
// it could not (the sandbox is then left to gc if the launcher is killed).
// A run on a gateway prepared ahead has its keeper for that (it removes
// the run with its gateway when its launcher hangs up); a Podman service
// started for the launch stops with it, leaving nothing to remove through.
func (s *launch) startWatchdog(project string) (*watchdog, error) {
	if s.adopted != nil || s.tempEngine || s.name == nil {
		return nil, nil
	}
	dir, err := backgroundDir(s.Env.Dirs)
	if err != nil {
		return nil, err
	}
	busy, err := os.OpenFile(busyPath(dir, s.Env.Workspace), os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening the workspace's busy lock: %w", err)
	}
	defer busy.Close()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("connecting to the watchdog: %w", err)
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "watchdog"), os.NewFile(uintptr(fds[1]), "launcher")
	defer theirs.Close()
	defer ours.Close()
	c, err := net.FileConn(ours)
	if err != nil {
		return nil, fmt.Errorf("connecting to the watchdog: %w", err)
	}
	w := Watchdog{Removal{Host: s.host, Project: project, Launcher: os.Getpid()}}
	if _, err := daemon.Spawn(daemon.Spec{Args: w.Args(), Log: backgroundLog(dir), Dir: "/", Files: []*os.File{s.name.file, busy, theirs}}); err != nil {
		c.Close()
		return nil, err
	}
	return &watchdog{c.(*net.UnixConn)}, nil
}

// dismiss tells the watchdog the launcher is done, and waits (a moment at
// most) until it has let go of the name, so that the next launch in the
// workspace finds the name free.
func (w *watchdog) dismiss() {
	if w == nil {
		return
	}
	defer w.c.Close()
	if _, err := w.c.Write([]byte{watchdogDone}); err != nil {
		return
	}
	w.c.SetReadDeadline(time.Now().Add(watchdogLetGo))
	io.Copy(io.Discard, w.c)
}

// watchdogLetGo bounds the wait for the watchdog to let go of the name.
const watchdogLetGo = time.Second
