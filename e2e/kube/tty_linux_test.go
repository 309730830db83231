package kube

import (
	"bytes"
	"errors"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/testenv"
	"golang.org/x/sys/unix"
)

// TestKubeLaunchTTY: from a terminal, `run --engine kubernetes` gives the
// sandbox a terminal of the launcher's size: what is typed reaches the
// command through it, its output comes back, and its exit code is the
// launcher's; a resize of the launcher's window resizes it.
func TestKubeLaunchTTY(t *testing.T) {
	c, kubeconfig := testenv.Kube(t)
	loadImage(t, agentImage)
	ns := namespace(t, c)
	ws := kubeWorkspace(t, "kubetty")
	master, slave := testenv.OpenPTY(t) // 24×80
	defer master.Close()
	cmd := launcherOn(t, kubeconfig, ws, "run", "--engine", "kubernetes", "-n", ns, "-p", smallProfile(t, "offline", ""), "--",
		"bash", "-c", `read -r line; echo "got:$line"; echo "tty:$(test -t 0 && echo yes) size:$(stty size)"
read -r line; for i in $(seq 50); do s=$(stty size); [ "$s" = "30 100" ] && break; sleep 0.1; done; echo "resized:$s"; exit 5`)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	slave.Close()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		select {
		case <-done:
		default:
			cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				cmd.Process.Kill()
				<-done
			}
		}
	})
	var mu sync.Mutex
	var out bytes.Buffer
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := master.Read(buf)
			mu.Lock()
			out.Write(buf[:n])
			mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	output := func() string {
		mu.Lock()
		defer mu.Unlock()
		return out.String()
	}
	// The line is typed once the sandbox runs (its note on the terminal);
	// what is typed before its input is attached waits in the terminal.
	waitOutput(t, output, "running pod", 2*time.Minute)
	if _, err := master.Write([]byte("typed here\r")); err != nil {
		t.Fatal(err)
	}
	// The launcher's window resized: the sandbox's terminal follows.
	waitOutput(t, output, "size:24 80", 2*time.Minute)
	var ioerr error
	if err := testenv.Control(master, func(fd int) {
		ioerr = unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, &unix.Winsize{Row: 30, Col: 100})
	}); err != nil || ioerr != nil {
		t.Fatalf("resizing the terminal: %v %v", err, ioerr)
	}
	if _, err := master.Write([]byte("again\r")); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		done <- err
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 5 {
			t.Errorf("run: %v, want exit status 5\n%s", err, output())
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("run did not end within 2 minutes of the input\n%s", output())
	}
	time.Sleep(200 * time.Millisecond) // the last of the output, from the terminal's buffer
	for _, want := range []string{"got:typed here", "tty:yes size:24 80", "resized:30 100"} {
		if !strings.Contains(output(), want) {
			t.Errorf("terminal output %q lacks %q", output(), want)
		}
	}
	waitSelectedGone(t, c, ns, managed, 30*time.Second)
}

// waitOutput waits, bounded, until output() holds want.
func waitOutput(t *testing.T, output func() string, want string, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !strings.Contains(output(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q on the terminal within %v:\n%s", want, limit, output())
		}
		time.Sleep(100 * time.Millisecond) // a terminal's output is polled
	}
}
