package sandbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"

	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/backend"
	"github.com/propio/propio-sandbox/internal/engine"
)

// This file is where a launch meets the engines it can run on: it finds
// and connects to one (Docker or Podman, through internal/engine), and
// hands the rest of the launch a backend.Runtime. Nothing else in the
// package knows the engine package; another backend connects here.

// Streams are the launcher's terminal or pipes, which the sandbox's
// command is attached to.
type Streams struct {
	In       io.Reader
	Out, Err io.Writer
}

// Conn is a connection to the engine a launch runs on.
type Conn struct {
	// Runtime is the engine, as a launch drives it.
	Runtime backend.Runtime
	// Host is where the engine was found: unix:///... or what DOCKER_HOST says.
	Host string
	// temporary: the engine is a Podman service started for this
	// connection, which Close stops.
	temporary bool
	close     func()
}

// EngineError is a failure to find or reach an engine, with the kind of
// engine that was looked for (Docker or Podman), for what to do about it.
type EngineError struct {
	Kind string
	Err  error
}

func (e *EngineError) Error() string { return e.Err.Error() }
func (e *EngineError) Unwrap() error { return e.Err }

// The engine's sentinels, for the command line to say what to do about
// them.
var (
	ErrEngineMissing    = engine.ErrEngineMissing
	ErrEngineNotRunning = engine.ErrEngineNotRunning
	ErrPermission       = engine.ErrPermission
	ErrEngineTooOld     = engine.ErrEngineTooOld
)

// ErrNotOnCluster: the command needs a container engine, and --engine
// names a Kubernetes cluster.
var ErrNotOnCluster = errors.New("this command runs on a container engine (docker or podman): with --engine kubernetes, only run, ls, gc and doctor are available")

// The engines a launch may ask for.
const (
	Auto   = engine.Auto
	Docker = engine.Docker
	Podman = engine.Podman
)

// Connect reaches the engine want names (auto, docker, podman; "" for
// auto; or a Docker context, after WithContext), starting a Podman API service for the launch when Podman's does
// not run (Close stops it).
func Connect(ctx context.Context, want string, s Streams) (*Conn, error) {
	want = cmp.Or(want, engine.Auto)
	if want == Kubernetes {
		return nil, &EngineError{Kind: want, Err: ErrNotOnCluster}
	}
	loc, err := engine.Locate(ctx, want, os.Getenv)
	if err != nil {
		return nil, &EngineError{Kind: want, Err: err}
	}
	var in io.ReadCloser
	if rc, ok := s.In.(io.ReadCloser); ok {
		in = rc
	} else if s.In != nil {
		in = io.NopCloser(s.In)
	}
	eng, err := engine.ConnectTo(ctx, loc, engine.Streams{In: in, Out: s.Out, Err: s.Err})
	if err != nil {
		if loc.Stop != nil {
			loc.Stop()
		}
		if loc.Context != "" {
			err = fmt.Errorf("docker context %q (from %s): %w", loc.Context, loc.ContextFrom, err)
		}
		return nil, &EngineError{Kind: loc.Kind, Err: err}
	}
	return &Conn{Runtime: eng, Host: loc.Host, temporary: loc.Stop != nil, close: func() {
		eng.Close()
		if loc.Stop != nil {
			loc.Stop()
		}
	}}, nil
}

// freshInfo makes the engine's info be asked of it, not taken from what
// its process said before.
func (c *Conn) freshInfo() {
	if e, ok := c.Runtime.(*engine.Engine); ok {
		e.FreshInfo = true
	}
}

// WithContext is the want that names the Docker context name, as
// --context does.
func WithContext(name string) string { return engine.WithContext(name) }

// ContextError is a Docker context that cannot be used.
type ContextError = engine.ContextError

// connectHost reaches the engine at host itself, as a launcher found it (a
// background process carries on its launcher's work there).
func connectHost(ctx context.Context, host string, s Streams) (*Conn, error) {
	eng, err := engine.Connect(ctx, host, engine.Streams{Out: s.Out, Err: s.Err})
	if err != nil {
		return nil, &EngineError{Kind: engine.Auto, Err: err}
	}
	return &Conn{Runtime: eng, Host: host, close: func() { eng.Close() }}, nil
}

// Close releases the connection and stops a Podman API service started for
// it; safe on a nil Conn.
func (c *Conn) Close() {
	if c != nil && c.close != nil {
		c.close()
	}
}

// With connects to the engine want names, calls fn, and closes the
// connection.
func With(want string, s Streams, fn func(context.Context, *Conn) error) error {
	ctx := context.Background()
	c, err := Connect(ctx, want, s)
	if err != nil {
		return err
	}
	defer c.Close()
	return fn(ctx, c)
}

// EngineFactsOf are the engine facts of an engine of kind (Auto is taken
// for Docker), for a render, which asks no engine: a rootless Podman's
// keep-id is known only to a launch.
func EngineFactsOf(kind string) generator.EngineFacts { return hostFacts(engine.FactsOf(kind, false)) }

// engineSockets are the paths an engine's socket may have on this host,
// which a mount must not hand the sandbox.
func engineSockets(home string) []string { return engine.Sockets(os.Getenv, home) }

// execIO is a command execIn runs, and its streams.
type execIO struct {
	Command, Env []string
	WorkDir      string
	TTY          bool
	In           io.Reader
	Out, Err     io.Writer
	Signal       func(os.Signal)
}

// execIn runs a command in the agent's container of the persistent
// sandbox rec, through the engine's API, where rec says the container is.
func execIn(ctx context.Context, rec Record, o execIO) (int, error) {
	code, err := engine.ExecIn(ctx, engine.ExecTarget{Host: rec.Host, APIVersion: rec.APIVersion, Container: rec.Container},
		engine.ExecIO{Command: o.Command, Env: o.Env, WorkDir: o.WorkDir, TTY: o.TTY, In: o.In, Out: o.Out, Err: o.Err, Signal: o.Signal})
	switch {
	case errors.Is(err, engine.ErrNoContainer):
		return 0, &NotRunningError{Name: rec.Name, State: "broken", Why: "its container is no longer on the engine; down removes what is left"}
	case errors.Is(err, engine.ErrNotRunning):
		return 0, &NotRunningError{Name: rec.Name, State: "broken", Why: "its container does not run; stop, then start, runs it again"}
	case err != nil:
		return 0, fmt.Errorf("running %v in sandbox %s: %w", o.Command, rec.Name, err)
	}
	return code, nil
}

// Early is a connection made while the launcher reads its profile: the
// engine's sockets probed, the client set up and the version known by the
// time the checks need them. It is made to the engine the command line
// (or the environment) names; a profile that names another engine has its
// own made as usual, and this one closed.
type Early struct {
	want string
	done chan struct{}
	conn *Conn
	err  error
	mu   sync.Mutex
	used bool // taken by a launch, which closes it
}

// ConnectEarly starts connecting to the engine want names, as Connect does.
func ConnectEarly(want string, s Streams) *Early {
	if want == Kubernetes {
		return nil // a cluster is reached by the launch itself
	}
	e := &Early{want: cmp.Or(want, engine.Auto), done: make(chan struct{})}
	go func() {
		defer close(e.done)
		e.conn, e.err = Connect(context.Background(), want, s)
	}()
	return e
}

// take is the early connection's outcome when it was made to the engine
// want names (ok), which the caller then owns; safe on a nil Early.
func (e *Early) take(ctx context.Context, want string) (c *Conn, err error, ok bool) {
	if e == nil || cmp.Or(want, engine.Auto) != e.want {
		return nil, nil, false
	}
	select {
	case <-e.done:
	case <-ctx.Done():
		return nil, ctx.Err(), false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.used {
		return nil, nil, false
	}
	e.used = true
	return e.conn, e.err, true
}

// Close closes the connection unless a launch took it (stopping a Podman
// service it started), once it is made; safe on a nil Early.
func (e *Early) Close() {
	if e == nil {
		return
	}
	<-e.done
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.used {
		e.used = true
		e.conn.Close()
	}
}
