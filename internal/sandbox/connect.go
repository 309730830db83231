package sandbox

import (
	"cmp"
	"context"
	"io"
	"os"

	"github.com/propio/propio-sandbox/internal/engine"
)

// Streams are the launcher's terminal or pipes, which the sandbox's
// command is attached to.
type Streams struct {
	In       io.Reader
	Out, Err io.Writer
}

// Conn is a connection to the engine a launch runs on.
type Conn struct {
	Engine *engine.Engine
	// Host is where the engine was found: unix:///... or what DOCKER_HOST says.
	Host string
	stop func() error
}

// EngineError is a failure to find or reach an engine, with the kind of
// engine that was looked for (Docker or Podman), for what to do about it.
type EngineError struct {
	Kind string
	Err  error
}

func (e *EngineError) Error() string { return e.Err.Error() }
func (e *EngineError) Unwrap() error { return e.Err }

// Connect reaches the engine want names (auto, docker, podman; "" for
// auto), starting a Podman API service for the launch when Podman's does
// not run (Close stops it).
func Connect(ctx context.Context, want string, s Streams) (*Conn, error) {
	want = cmp.Or(want, engine.Auto)
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
	eng, err := engine.Connect(ctx, loc.Host, engine.Streams{In: in, Out: s.Out, Err: s.Err})
	if err != nil {
		if loc.Stop != nil {
			loc.Stop()
		}
		return nil, &EngineError{Kind: loc.Kind, Err: err}
	}
	return &Conn{Engine: eng, Host: loc.Host, stop: loc.Stop}, nil
}

// Close releases the connection and stops a Podman API service started for
// it; safe on a nil Conn.
func (c *Conn) Close() {
	if c == nil {
		return
	}
	if c.Engine != nil {
		c.Engine.Close()
	}
	if c.stop != nil {
		c.stop()
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
