package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/guard"
	"github.com/propio/propio-sandbox/internal/hostinfo"
)

// ExecRequest is a command to run in a persistent sandbox.
type ExecRequest struct {
	Dirs hostinfo.Dirs
	// Name is the sandbox's; "" for Workspace's only one. Workspace is the
	// directory exec runs in: below a sandbox's workspace, the command
	// runs in the same directory below the sandbox's.
	Name, Workspace string
	Command         []string
	// TTY gives the command the launcher's terminal (Streams.In and Out
	// are one).
	TTY     bool
	Streams Streams
	// Report (required) says what the guard did once the command has
	// ended.
	Report Reporter
}

// EnvExec names, in the environment of each command exec runs, which
// exec it is: the keeper's signal finds the command's process by it.
const EnvExec = "PROPIO_SANDBOX_EXEC"

// execWait bounds how long exec waits for a sandbox its supervisor is
// removing (idle) or stopping, before it says what became of it.
const execWait = removeBudget + killBudget

// NotRunningError: the persistent sandbox does not run: stopped, gone, or
// its supervisor killed.
type NotRunningError struct {
	Name, State, Why string
}

func (e *NotRunningError) Error() string {
	msg := fmt.Sprintf("sandbox %s is %s", e.Name, e.State)
	if e.Why != "" {
		msg += ": " + e.Why
	}
	return msg
}

// Exec runs the command in the persistent sandbox as `docker exec` does,
// straight through the engine's API to the container its record names
// (nothing listed, no version negotiated), as the sandbox's user, in its
// working directory, with its environment. The launcher's SIGINT, SIGTERM
// and SIGHUP go to the command (docker exec forwards none). While it runs
// the sandbox is not idle. It returns the command's exit code.
func Exec(ctx context.Context, req ExecRequest) (int, error) {
	rec, err := Find(req.Dirs, req.Name, req.Workspace)
	if err != nil {
		return 0, err
	}
	dir := keepDir(req.Dirs, rec.Name)
	busy, rec, err := holdExecBusy(ctx, dir, rec)
	if err != nil {
		return 0, err
	}
	defer func() {
		touch(busy.Name())
		busy.Close()
	}()
	id := NewKeepID()
	signalled := func(sig os.Signal) {
		// Not on the command's way: its output goes on while the signal
		// goes in.
		go signalExec(rec, id, sig)
	}
	start := time.Now()
	code, err := execIn(ctx, rec, execIO{
		Command: req.Command, Env: []string{EnvExec + "=" + id}, TTY: req.TTY, WorkDir: rec.WorkDir(req.Workspace),
		In: req.Streams.In, Out: req.Streams.Out, Err: req.Streams.Err, Signal: signalled,
	})
	gerr := checkExec(req.Report, req.Dirs, rec.Project, start)
	switch {
	case gerr == nil:
	case err == nil:
		err = gerr
	default:
		req.Report.Failed(gerr)
	}
	return code, err
}

// checkExec judges, once a command exec ran has ended, what changed in
// the persistent sandbox's directories since it started, as the end of a
// run does (the rest of the held surface stays held between commands):
// the host's git, run between two execs, runs nothing it wrote. The
// supervisor's plan stays saved for its own check when the sandbox stops.
// What a process the command left running writes afterwards is judged by
// the next exec's check, for what changes while it runs, and by stop.
func checkExec(r Reporter, dirs hostinfo.Dirs, project string, since time.Time) error {
	plans, err := guard.Pending(dirs.GuardDir())
	if err != nil {
		return err
	}
	for _, plan := range plans {
		if plan.Project != project {
			continue
		}
		if err := reported(r, plan, plan.CheckSince(dirs.QuarantineDir(), since), dirs); err != nil {
			return err
		}
	}
	return nil
}

// holdExecBusy takes the busy file's lock, shared, for as long as the command
// runs, and marks the sandbox active. When its supervisor holds the lock
// (it found the sandbox idle, and removes it), it waits, bounded, and says
// what became of the sandbox. The record is the one to run in.
func holdExecBusy(ctx context.Context, dir string, rec Record) (*os.File, Record, error) {
	if err := usable(rec); err != nil {
		return nil, rec, err
	}
	f, err := os.OpenFile(filepath.Join(dir, busyFile), os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, rec, fmt.Errorf("marking sandbox %s active: %w", rec.Name, err)
	}
	err = syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		err = waitShared(ctx, f)
		if err == nil {
			// Taken after the supervisor let go: the sandbox is what its
			// record says now.
			if rec, err = readRecord(dir); err == nil {
				err = usable(rec.current())
			}
		}
	}
	if err != nil {
		f.Close()
		return nil, rec, err
	}
	touch(f.Name())
	return f, rec, nil
}

// waitShared waits, at most execWait, for the lock, shared.
func waitShared(ctx context.Context, f *os.File) error {
	done := make(chan error, 1)
	go func() { done <- syscall.Flock(int(f.Fd()), syscall.LOCK_SH) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(execWait):
		return fmt.Errorf("its supervisor has been ending it for %s", execWait)
	}
}

// usable says why a command cannot run in the sandbox of rec, if it
// cannot.
func usable(rec Record) error {
	switch {
	case rec.State == StateRunning && !rec.Unsupervised():
		return nil
	case rec.Unsupervised():
		return &NotRunningError{Name: rec.Name, State: "unsupervised", Why: rec.Why}
	}
	return &NotRunningError{Name: rec.Name, State: rec.State, Why: rec.Why}
}

// signalExec sends sig to the command of the exec id, through the keeper:
// an exec of it in the sandbox, as the sandbox's user, that finds the
// command's process by its environment.
func signalExec(rec Record, id string, sig os.Signal) {
	s, ok := sig.(syscall.Signal)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), killBudget)
	defer cancel()
	cmd := append(append([]string(nil), generator.KeeperCommand...), "signal", strconv.Itoa(int(s)), id)
	execIn(ctx, rec, execIO{Command: cmd, Out: io.Discard, Err: io.Discard})
}

// Keeper is a persistent sandbox's main process (generator.KeeperCommand),
// in the sandbox: it waits until it is told to end (SIGTERM, SIGINT,
// SIGHUP), and returns. It reads and writes nothing.
func Keeper() {
	sigc := make(chan os.Signal, 1)
	signal.Notify(sigc, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	<-sigc
}

// SignalExec, in a persistent sandbox (the keeper's signal), sends sig to
// the command that exec id started: the process whose environment names
// id and whose parent is outside the sandbox's processes (the engine's),
// not the processes it started, which have id too. It can signal only
// what the sandbox's user can.
func SignalExec(sig syscall.Signal, id string) error {
	want := []byte(EnvExec + "=" + id + "\x00")
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil || !strings.Contains("\x00"+string(env), "\x00"+string(want)) {
			continue
		}
		if ppidOf(pid) == 0 {
			return syscall.Kill(pid, sig)
		}
	}
	return fmt.Errorf("no process of exec %s", id)
}

// ppidOf is the parent pid of pid, as its pid namespace sees it (0: a
// parent outside it); -1 when it cannot be read.
func ppidOf(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return -1
	}
	// pid (comm) state ppid ...: comm may hold spaces and parentheses.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return -1
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 2 {
		return -1
	}
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		return -1
	}
	return ppid
}
