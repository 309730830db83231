package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/client"
	"github.com/moby/term"
	"github.com/propio/propio-sandbox/internal/backend"
)

// ExecTarget is a container ExecIn runs commands in, known by its ID on the
// engine at Host, spoken to at APIVersion: what a persistent sandbox's
// record keeps, so that no listing and no version negotiation comes before
// the command.
type ExecTarget struct {
	Host       string
	APIVersion string
	Container  string
}

// ExecIO is a command for ExecIn and the streams it is attached to.
type ExecIO struct {
	Command []string
	// Env is added to the container's environment for the command.
	Env []string
	// WorkDir is where it runs; "" for the container's working directory.
	WorkDir string
	// TTY gives the command a terminal: In and Out are the launcher's
	// terminal, put in raw mode while the command runs, its size followed.
	TTY bool
	// In is the command's stdin; nil attaches none.
	In       io.Reader
	Out, Err io.Writer
	// Signal is called with each of the launcher's SIGINT, SIGTERM and
	// SIGHUP while the command runs (the engine forwards none); nil leaves
	// them to their default.
	Signal func(os.Signal)
}

// Errors ExecIn wraps, for the launch to say what they mean.
var (
	// ErrNoContainer: the target container is not on the engine.
	ErrNoContainer = errors.New("the container is gone")
	// ErrNotRunning: the target container exists and does not run.
	ErrNotRunning = errors.New("the container is not running")
)

// ExecIn runs o.Command in the container t, attached to o's streams, as
// `docker exec` does, straight through the engine's API: create, attach
// (which starts it), and, once its output has ended, inspect for its exit
// code, which it returns (above zero is no error).
func ExecIn(ctx context.Context, t ExecTarget, o ExecIO) (int, error) {
	opts := []client.Opt{client.WithHost(t.Host)}
	if ep, ok := contextOf(configDir(os.Getenv), t.Host); ok && os.Getenv("DOCKER_CERT_PATH") == "" {
		opts = ep.opts // the context's TLS material, or its ssh connection, as Connect
	}
	c, err := client.New(append(opts, client.WithAPIVersion(t.APIVersion))...)
	if err != nil {
		return 0, fmt.Errorf("connecting to %s: %w", t.Host, err)
	}
	defer c.Close()
	size := consoleSize(o)
	created, err := c.ExecCreate(ctx, t.Container, client.ExecCreateOptions{
		Cmd: o.Command, Env: o.Env, WorkingDir: o.WorkDir, TTY: o.TTY, ConsoleSize: size,
		AttachStdin: o.In != nil, AttachStdout: true, AttachStderr: true,
	})
	if err != nil {
		return 0, execError(t, err)
	}
	// From the start on (the attach starts the command), the launcher's
	// signals are the command's.
	if o.Signal != nil {
		stop := forward(o.Signal)
		defer stop()
	}
	att, err := c.ExecAttach(ctx, created.ID, client.ExecAttachOptions{TTY: o.TTY, ConsoleSize: size})
	if err != nil {
		return 0, execError(t, err)
	}
	defer att.Close()
	if o.TTY {
		restore, err := rawTerminal(ctx, c, created.ID, o.In)
		if err != nil {
			return 0, err
		}
		defer restore()
	}
	if o.In != nil {
		go func() {
			io.Copy(att.Conn, o.In)
			att.CloseWrite()
		}()
	}
	if o.TTY {
		_, err = io.Copy(o.Out, att.Reader)
	} else {
		_, err = stdcopy.StdCopy(o.Out, o.Err, att.Reader)
	}
	if err != nil && !errors.Is(err, io.EOF) {
		return 0, fmt.Errorf("reading the output of %v: %w", o.Command, err)
	}
	res, err := c.ExecInspect(context.WithoutCancel(ctx), created.ID, client.ExecInspectOptions{})
	if err != nil {
		return 0, execError(t, err)
	}
	return res.ExitCode, nil
}

// execError says what the engine's refusal of an exec means.
func execError(t ExecTarget, err error) error {
	switch {
	case cerrdefs.IsNotFound(err):
		return fmt.Errorf("%w: %v", ErrNoContainer, err)
	case cerrdefs.IsConflict(err) || strings.Contains(err.Error(), "is not running"):
		return fmt.Errorf("%w: %v", ErrNotRunning, err)
	case client.IsErrConnectionFailed(err) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT):
		return fmt.Errorf("reaching the engine at %s: %w: %v", t.Host, backend.ErrEngineGone, err)
	}
	return err
}

// forward calls f with each SIGINT, SIGTERM and SIGHUP the launcher gets,
// until stop.
func forward(f func(os.Signal)) (stop func()) {
	sigc := make(chan os.Signal, 8)
	signal.Notify(sigc, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case s := <-sigc:
				f(s)
			case <-done:
				return
			}
		}
	}()
	return func() {
		signal.Stop(sigc)
		close(done)
		wg.Wait()
	}
}

// consoleSize is the size of the terminal a command with a TTY gets at
// once (engines of API 1.42 and later take it with the exec; others get
// it right after the start); zero without one.
func consoleSize(o ExecIO) client.ConsoleSize {
	f, ok := o.In.(interface{ Fd() uintptr })
	if !o.TTY || !ok {
		return client.ConsoleSize{}
	}
	ws, err := term.GetWinsize(f.Fd())
	if err != nil {
		return client.ConsoleSize{}
	}
	return client.ConsoleSize{Height: uint(ws.Height), Width: uint(ws.Width)}
}

// rawTerminal puts the terminal in in raw mode, as docker's exec does, and
// keeps the command's terminal the size of it: now, and on each SIGWINCH.
func rawTerminal(ctx context.Context, c *client.Client, execID string, in io.Reader) (restore func(), err error) {
	f, ok := in.(interface{ Fd() uintptr })
	if !ok || !term.IsTerminal(f.Fd()) {
		return nil, errors.New("a terminal was asked for, and stdin is not one")
	}
	fd := f.Fd()
	state, err := term.SetRawTerminal(fd)
	if err != nil {
		return nil, fmt.Errorf("putting the terminal in raw mode: %w", err)
	}
	resize := func() {
		if ws, err := term.GetWinsize(fd); err == nil && ws.Height > 0 {
			c.ExecResize(ctx, execID, client.ExecResizeOptions{Height: uint(ws.Height), Width: uint(ws.Width)})
		}
	}
	resize()
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-winch:
				resize()
			case <-done:
				return
			}
		}
	}()
	return func() {
		signal.Stop(winch)
		close(done)
		term.RestoreTerminal(fd, state)
	}, nil
}

// APIVersion is the engine API version the connection speaks, for an
// ExecTarget.
func (e *Engine) APIVersion() string { return e.cli.Client().ClientVersion() }
