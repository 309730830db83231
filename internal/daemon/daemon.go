// Package daemon starts the launcher's own background processes: this
// program again, with other arguments, in a session of its own (no
// terminal: closing the user's does not end it), its stdin /dev/null and
// its output appended to a log file. The parent waits until the child says
// it is ready (Ready), or has failed, or has exited, and then leaves it.
//
// A persistent sandbox's supervisor and a run's background removal are
// such processes.
package daemon

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
)

// readyFD is the environment variable that gives the child the file
// descriptor on which it says it is ready.
const readyFD = "PROPIO_SANDBOX_READY_FD"

// Spec is a background process to start.
type Spec struct {
	// Args are its arguments (this program is the command).
	Args []string
	// Log is the file its stdout and stderr are appended to (made 0600).
	Log string
	// Env is its environment; nil is the launcher's.
	Env []string
	// Dir is its working directory; "" is the launcher's.
	Dir string
	// Files are open files the child inherits, as its file descriptors 4,
	// 5, ... (File(0), File(1), ... in the child): locks it takes over,
	// which stay held while either process has them open.
	Files []*os.File
}

// Start starts s and waits until it is ready (it called Ready(nil)): then
// it returns the child's pid, and the child goes on alone. When the child
// says it failed (Ready(err)), or exits first, Start returns the error,
// with the last lines of its log. ctx bounds the wait; when it ends first,
// the child is killed.
func Start(ctx context.Context, s Spec) (pid int, err error) {
	r, w, err := os.Pipe()
	if err != nil {
		return 0, err
	}
	defer r.Close()
	cmd, err := launchChild(s, w)
	if err != nil {
		return 0, err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	said := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(r).ReadString('\n')
		said <- line
	}()
	select {
	case <-ctx.Done():
		cmd.Process.Kill()
		return 0, ctx.Err()
	case line := <-said:
		switch {
		case line == "ok\n":
			// The child goes on; its exit is reaped by the goroutine above
			// while this process lives, and by init after.
			return cmd.Process.Pid, nil
		case strings.HasPrefix(line, "error "):
			<-exited
			return 0, errors.New(strings.TrimSuffix(strings.TrimPrefix(line, "error "), "\n"))
		}
		// The pipe closed without a word: the child has exited.
		err := <-exited
		return 0, fmt.Errorf("the background process %s ended before it was ready (%v)%s", s.Args, err, tail(s.Log))
	}
}

// Spawn starts s and returns at once, the child's pid, not waiting until it
// is ready: for work the parent hands over and need not hear about (the
// child's Ready says nothing to anyone). An error says it could not start.
func Spawn(s Spec) (pid int, err error) {
	devnull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		return 0, err
	}
	cmd, err := launchChild(s, devnull)
	if err != nil {
		return 0, err
	}
	// Its exit is reaped while this process lives, and by init after.
	go cmd.Wait()
	return cmd.Process.Pid, nil
}

// launchChild starts s in a session of its own, its output appended to s.Log,
// with ready as its file descriptor 3 and s.Files after it; ready is
// closed in this process.
func launchChild(s Spec, ready *os.File) (*exec.Cmd, error) {
	defer ready.Close() // the child's copy stays open until it is ready
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("finding this program: %w", err)
	}
	logf, err := os.OpenFile(s.Log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening the background process's log: %w", err)
	}
	defer logf.Close()
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return nil, err
	}
	defer devnull.Close()
	cmd := exec.Command(self, s.Args...)
	cmd.Dir = s.Dir
	cmd.Env = s.Env
	if cmd.Env == nil {
		cmd.Env = os.Environ()
	}
	cmd.Env = append(cmd.Env, readyFD+"=3")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = devnull, logf, logf
	cmd.ExtraFiles = append([]*os.File{ready}, s.Files...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", s.Args, err)
	}
	return cmd, nil
}

// File is the i-th of the files the parent passed in Spec.Files, in a child
// that Start or Spawn started (nil otherwise).
func File(i int, name string) *os.File {
	if i < 0 || !child {
		return nil
	}
	return os.NewFile(uintptr(4+i), name)
}

// child: this process was started by Start or Spawn (Ready unsets the
// variable that says so).
var child = os.Getenv(readyFD) != ""

// Ready says, in a child that Start started, that it is ready (err nil)
// or that it failed (the parent's Start returns err). Outside such a child,
// or called again, it does nothing.
func Ready(err error) {
	fd, e := strconv.Atoi(os.Getenv(readyFD))
	if e != nil {
		return
	}
	os.Unsetenv(readyFD)
	f := os.NewFile(uintptr(fd), "ready")
	if f == nil {
		return
	}
	defer f.Close()
	if err != nil {
		fmt.Fprintf(f, "error %s\n", strings.ReplaceAll(err.Error(), "\n", "; "))
		return
	}
	io.WriteString(f, "ok\n")
}

// Started reports whether this process was started by Start (and has not
// said Ready yet).
func Started() bool { return os.Getenv(readyFD) != "" }

// tail is the last lines of the log, for an error, or "".
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil || len(b) == 0 {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 5 {
		lines = lines[len(lines)-5:]
	}
	return ": " + strings.Join(lines, "; ")
}

// Alive reports whether the process pid still runs.
func Alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
