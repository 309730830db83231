//go:build linux

package e2e

// The launcher's streams: pipes stay pipes, and a terminal becomes the
// sandbox's terminal.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/testenv"
	"golang.org/x/sys/unix"
)

// TestTerminalPipes: piped stdin reaches the sandbox's command, and without
// a terminal the sandbox gets none.
func TestTerminalPipes(t *testing.T) {
	t.Parallel()
	s := newSandbox(t)
	p := s.Profile(probeOffline)
	r := s.Run("hello from stdin\n", "-p", p, "--", "cat")
	if r.Code != 0 || r.Stdout != "hello from stdin\n" {
		t.Fatalf("want stdin copied back exactly:\n%s", r)
	}
	probeOK(t, probeRun(s, p, "tty"), "stdin=false stdout=false")
}

// TestTerminalPTY: run from a terminal, the sandbox gets one: the probe sees
// terminals, and a line typed on the host's terminal reaches cat inside,
// which echoes it; Ctrl-D ends it and the launcher exits 0.
func TestTerminalPTY(t *testing.T) {
	t.Parallel()
	t.Run("tty", func(t *testing.T) {
		t.Parallel()
		s := newSandbox(t)
		term := terminalStart(t, s, "-p", s.Profile(probeOffline), "--", "tty")
		term.waitFor("stdin=true stdout=true", 90*time.Second)
		if err := term.wait(60 * time.Second); err != nil {
			t.Fatalf("launcher: %v\nterminal:\n%s", err, term.output())
		}
	})
	t.Run("cat", func(t *testing.T) {
		t.Parallel()
		s := newSandbox(t)
		term := terminalStart(t, s, "-p", s.Profile(probeOffline), "--", "cat")
		// Type only once the launcher has put the host's terminal in raw
		// mode: before that, the host's own line discipline would echo the
		// line, proving nothing about the sandbox.
		term.waitRaw(90 * time.Second)
		term.write("ping\n")
		// The sandbox's terminal echoes the line, then cat writes it back.
		term.waitForCount("ping", 2, 60*time.Second)
		term.write("\x04")
		if err := term.wait(60 * time.Second); err != nil {
			t.Fatalf("launcher after Ctrl-D: %v\nterminal:\n%s", err, term.output())
		}
		t.Logf("terminal:\n%q", term.output())
	})
}

// terminalSession is a launcher running on a pseudo-terminal the test drives.
type terminalSession struct {
	t      *testing.T
	master *os.File
	cmd    *exec.Cmd
	done   chan error    // the launcher's exit
	eof    chan struct{} // closed when the terminal's output has been read to the end

	mu  sync.Mutex
	out bytes.Buffer
}

// terminalStart runs the launcher with args on a new pseudo-terminal, as its
// controlling terminal, and collects what it writes there.
func terminalStart(t *testing.T, s *sandbox, args ...string) *terminalSession {
	t.Helper()
	master, slave := terminalOpenPTY(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	cmd := s.Command(ctx, args...)
	cmd.Env = append(cmd.Env, "TERM=xterm")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		master.Close()
		slave.Close()
		t.Fatalf("starting the launcher: %v", err)
	}
	slave.Close() // the launcher holds it now
	term := &terminalSession{t: t, master: master, cmd: cmd, done: make(chan error, 1), eof: make(chan struct{})}
	go func() { term.done <- cmd.Wait() }()
	go term.read(time.Now().Add(3 * time.Minute))
	t.Cleanup(func() {
		// A launcher still running is asked to clean up, then killed.
		if ended, _ := term.exit(0); !ended {
			cmd.Process.Signal(syscall.SIGTERM)
			if ended, _ := term.exit(30 * time.Second); !ended {
				cmd.Process.Kill()
				term.exit(time.Minute)
			}
		}
		master.Close()
	})
	return term
}

// read copies the terminal's output into term.out until it fails or the
// deadline passes.
func (term *terminalSession) read(deadline time.Time) {
	defer close(term.eof)
	buf := make([]byte, 4096)
	for {
		if err := term.master.SetReadDeadline(deadline); err != nil {
			return
		}
		n, err := term.master.Read(buf)
		term.mu.Lock()
		term.out.Write(buf[:n])
		term.mu.Unlock()
		if err != nil {
			return
		}
	}
}

func (term *terminalSession) output() string {
	term.mu.Lock()
	defer term.mu.Unlock()
	return term.out.String()
}

func (term *terminalSession) write(s string) {
	term.t.Helper()
	if err := term.master.SetWriteDeadline(time.Now().Add(10 * time.Second)); err != nil {
		term.t.Fatal(err)
	}
	if _, err := term.master.WriteString(s); err != nil {
		term.t.Fatalf("typing %q: %v", s, err)
	}
}

// poll calls cond until it holds, the launcher exits, or timeout passes.
func (term *terminalSession) poll(what string, timeout time.Duration, cond func() bool) {
	term.t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if ended, err := term.exit(0); ended {
			// What it wrote last may still be in the terminal.
			select {
			case <-term.eof:
			case <-time.After(5 * time.Second):
			}
			if cond() {
				return
			}
			term.t.Fatalf("launcher ended (%v) before %s; terminal:\n%s", err, what, term.output())
		}
		if time.Now().After(deadline) {
			term.t.Fatalf("no %s within %s; terminal:\n%s", what, timeout, term.output())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (term *terminalSession) waitFor(s string, timeout time.Duration) {
	term.t.Helper()
	term.waitForCount(s, 1, timeout)
}

func (term *terminalSession) waitForCount(s string, n int, timeout time.Duration) {
	term.t.Helper()
	term.poll(fmt.Sprintf("%d× %q", n, s), timeout, func() bool { return strings.Count(term.output(), s) >= n })
}

// waitRaw waits until the terminal no longer echoes by itself: the launcher
// has made it raw to pass keys to the sandbox's terminal.
func (term *terminalSession) waitRaw(timeout time.Duration) {
	term.t.Helper()
	raw := func() bool {
		var tio *unix.Termios
		var ioerr error
		err := terminalControl(term.master, func(fd int) { tio, ioerr = unix.IoctlGetTermios(fd, unix.TCGETS) })
		return err == nil && ioerr == nil && tio.Lflag&(unix.ECHO|unix.ICANON) == 0
	}
	term.poll("raw mode", timeout, raw)
}

// wait waits for the launcher to end and returns its error (nil for exit 0).
func (term *terminalSession) wait(timeout time.Duration) error {
	ended, err := term.exit(timeout)
	if !ended {
		return errors.New("did not exit within " + timeout.String())
	}
	return err
}

// exit waits up to timeout (zero: not at all) for the launcher to end, and
// says whether it has, with its error.
func (term *terminalSession) exit(timeout time.Duration) (ended bool, err error) {
	select {
	case err := <-term.done:
		term.done <- err
		return true, err
	default:
	}
	if timeout <= 0 {
		return false, nil
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case err := <-term.done:
		term.done <- err
		return true, err
	case <-timer.C:
		return false, nil
	}
}

// terminalOpenPTY opens a new pseudo-terminal pair (testenv.OpenPTY).
func terminalOpenPTY(t *testing.T) (master, slave *os.File) { return testenv.OpenPTY(t) }

// terminalControl runs fn on f's descriptor (testenv.Control).
func terminalControl(f *os.File, fn func(fd int)) error { return testenv.Control(f, fn) }
