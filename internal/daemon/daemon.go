// Package daemon starts the launcher's own background processes: this
// program again, with other arguments, in a session of its own (no
// terminal: closing the user's does not end it), its stdin /dev/null and
// its output appended to a log file. The parent waits until the child says
// it is ready (Ready), or has failed, or has exited, and then leaves it;
// until then it may show what the child says (Spec.Progress).
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
	"sync"
	"syscall"
	"time"
)

// readyFD is the environment variable that gives the child the file
// descriptor on which it says it is ready; progressFD the one on which it
// says, until then, what the parent shows (Spec.Progress).
const (
	readyFD    = "PROPIO_SANDBOX_READY_FD"
	progressFD = "PROPIO_SANDBOX_PROGRESS_FD"
)

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
	// Progress, when set, gets what the child writes to Progress() until
	// it is ready (or has failed, or exited).
	Progress io.Writer
	// StopWait bounds the wait for the child to end after a SIGTERM, when
	// ctx ends before it is ready; then it is killed. Zero: killed at once.
	StopWait time.Duration
	// Files are open files the child inherits, as its file descriptors 4,
	// 5, ... (File(0), File(1), ... in the child): locks it takes over,
	// which stay held while either process has them open.
	Files []*os.File
}

// Failure is a child's own report that it failed (Fail), with the exit
// code it calls for.
type Failure struct {
	Code int
	Msg  string
}

func (f *Failure) Error() string { return f.Msg }

// Start starts s and waits until it is ready (it called Ready(nil)): then
// it returns the child's pid, and the child goes on alone. When the child
// says it failed (Ready(err), or Fail: a *Failure), or exits first, Start
// returns the error, with the last lines of its log. ctx bounds the wait;
// when it ends first, the child is sent SIGTERM, and killed if it has not
// ended within s.StopWait.
func Start(ctx context.Context, s Spec) (pid int, err error) {
	r, w, err := os.Pipe()
	if err != nil {
		return 0, err
	}
	defer r.Close()
	shown := make(chan struct{})
	var progress *os.File
	if s.Progress != nil {
		pr, pw, err := os.Pipe()
		if err != nil {
			w.Close()
			return 0, err
		}
		defer pr.Close()
		progress = pw
		go func() {
			defer close(shown)
			io.Copy(s.Progress, pr)
		}()
	} else {
		close(shown)
	}
	cmd, err := launchChild(s, w, progress)
	if err != nil {
		if progress != nil {
			<-shown
		}
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
		stop(cmd, exited, s.StopWait)
		<-shown
		return 0, ctx.Err()
	case line := <-said:
		return outcome(line, cmd, exited, shown, s)
	}
}

// outcome is what the child's word means, once what it showed is shown.
func outcome(line string, cmd *exec.Cmd, exited chan error, shown chan struct{}, s Spec) (int, error) {
	switch {
	case line == "ok\n":
		// The child goes on; its exit is reaped by the goroutine above
		// while this process lives, and by init after. It closed its
		// progress before it said so.
		<-shown
		return cmd.Process.Pid, nil
	case strings.HasPrefix(line, "error "):
		<-exited
		<-shown
		return 0, errors.New(strings.TrimSuffix(strings.TrimPrefix(line, "error "), "\n"))
	case strings.HasPrefix(line, "fail "):
		<-exited
		<-shown
		code, msg, _ := strings.Cut(strings.TrimSuffix(strings.TrimPrefix(line, "fail "), "\n"), " ")
		n, _ := strconv.Atoi(code)
		return 0, &Failure{Code: n, Msg: msg}
	}
	// The pipe closed without a word: the child has exited.
	err := <-exited
	<-shown
	return 0, fmt.Errorf("the background process %s ended before it was ready (%v)%s", s.Args, err, tail(s.Log))
}

// stop ends a child that was not ready in time: SIGTERM, then SIGKILL
// after wait.
func stop(cmd *exec.Cmd, exited chan error, wait time.Duration) {
	if wait > 0 {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
			return
		case <-time.After(wait):
		}
	}
	cmd.Process.Kill()
	<-exited
}

// Spawn starts s and returns at once, the child's pid, not waiting until it
// is ready: for work the parent hands over and need not hear about (the
// child's Ready says nothing to anyone). An error says it could not start.
func Spawn(s Spec) (pid int, err error) {
	devnull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		return 0, err
	}
	cmd, err := launchChild(s, devnull, nil)
	if err != nil {
		return 0, err
	}
	// Its exit is reaped while this process lives, and by init after.
	go cmd.Wait()
	return cmd.Process.Pid, nil
}

// launchChild starts s in a session of its own, its output appended to
// s.Log, with ready as its file descriptor 3, s.Files after it, then
// progress when there is one; ready and progress are closed in this
// process (the child's copies stay open until it is ready).
func launchChild(s Spec, ready, progress *os.File) (*exec.Cmd, error) {
	defer ready.Close()
	if progress != nil {
		defer progress.Close()
	}
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
	if progress != nil {
		cmd.Env = append(cmd.Env, progressFD+"="+strconv.Itoa(3+len(cmd.ExtraFiles)))
		cmd.ExtraFiles = append(cmd.ExtraFiles, progress)
	}
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
	if err != nil {
		say("error " + strings.ReplaceAll(err.Error(), "\n", "; "))
		return
	}
	say("ok")
}

// Fail says, in a child that Start started, that it failed, with the exit
// code it calls for: the parent's Start returns a *Failure. What it had to
// say about it, it has said (on Progress).
func Fail(code int, err error) {
	say(fmt.Sprintf("fail %d %s", code, strings.ReplaceAll(err.Error(), "\n", "; ")))
}

func say(line string) {
	closeProgress()
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
	io.WriteString(f, line+"\n")
}

// The child's ends of the pipes are its own: a process it starts in turn
// (a Podman service) must not hold them open after it is ready.
func init() {
	for _, v := range []string{readyFD, progressFD} {
		if fd, err := strconv.Atoi(os.Getenv(v)); err == nil && fd > 2 {
			syscall.CloseOnExec(fd)
		}
	}
}

// Started reports whether this process was started by Start (and has not
// said Ready yet).
func Started() bool { return os.Getenv(readyFD) != "" }

// progress is the child's side of Spec.Progress, open until it is ready.
var progress struct {
	sync.Mutex
	once sync.Once
	f    *os.File
}

func progressFile() *os.File {
	progress.once.Do(func() {
		if fd, err := strconv.Atoi(os.Getenv(progressFD)); err == nil {
			os.Unsetenv(progressFD)
			progress.f = os.NewFile(uintptr(fd), "progress")
		}
	})
	return progress.f
}

func closeProgress() {
	progressFile()
	progress.Lock()
	defer progress.Unlock()
	if progress.f != nil {
		progress.f.Close()
		progress.f = nil
	}
}

// Tee is a writer to w that also writes, in a child that Start started
// with a Progress, to the parent's Progress until the child is ready;
// what the parent no longer reads is only w's.
func Tee(w io.Writer) io.Writer { progressFile(); return tee{w} }

type tee struct{ w io.Writer }

func (t tee) Write(b []byte) (int, error) {
	progress.Lock()
	if progress.f != nil {
		progress.f.Write(b) // a parent that is gone reads no more
	}
	progress.Unlock()
	return t.w.Write(b)
}

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
