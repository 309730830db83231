package sandbox

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
)

// The connection made while the profile is read is the launch's when it is
// to the engine the launch wants, with its outcome (here: no engine at the
// address), and only once; another engine's launch makes its own.
func TestEarlyConnection(t *testing.T) {
	t.Setenv("DOCKER_HOST", "unix://"+filepath.Join(t.TempDir(), "none.sock"))
	t.Setenv("DOCKER_CONTEXT", "")
	ctx := context.Background()

	e := ConnectEarly("", Streams{})
	if _, _, ok := e.take(ctx, Podman); ok {
		t.Error("an early connection to the default engine was taken for Podman")
	}
	c, err, ok := e.take(ctx, "")
	if !ok || c != nil || !errors.Is(err, ErrEngineNotRunning) && !errors.Is(err, ErrEngineMissing) {
		t.Fatalf("take = %v, %v, %v; want the early connection's failure: no engine at the address", c, err, ok)
	}
	if _, _, ok := e.take(ctx, ""); ok {
		t.Error("an early connection was taken twice")
	}
	e.Close() // taken: nothing to close

	var none *Early
	if _, _, ok := none.take(ctx, ""); ok {
		t.Error("no early connection, yet one was taken")
	}
	none.Close()
}
