package engine_test

import (
	"context"
	"os"
	"testing"

	"github.com/propio/propio-sandbox/internal/engine"
	"github.com/propio/propio-sandbox/internal/testenv"
)

// TestPathExists checks paths where the engine runs containers (this
// machine, for a local engine), leaving no container behind.
func TestPathExists(t *testing.T) {
	ctx := context.Background()
	eng := connectEngine(t)
	dir := t.TempDir()
	for path, want := range map[string]bool{dir: true, dir + "/missing/socket": false} {
		got, err := eng.PathExists(ctx, testenv.ProbeImage, path)
		if err != nil || got != want {
			t.Errorf("PathExists(%s) = %v, %v; want %v", path, got, err, want)
		}
	}
	if out, _ := testenv.Docker("ps", "-aq", "--filter", "label="+engine.LabelImage+"=path-probe"); out != "" {
		t.Errorf("containers left: %s", out)
	}
	if _, err := eng.DockerDesktop(ctx); err != nil {
		t.Errorf("DockerDesktop: %v", err)
	}
}

// connectEngine connects to the tests' engine (skipping without one), for
// the rest of the test.
func connectEngine(t *testing.T) *engine.Engine {
	t.Helper()
	testenv.RequireEngine(t)
	eng, err := engine.Connect(context.Background(), engine.HostFromEnv(), engine.Streams{Out: os.Stdout, Err: os.Stderr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	return eng
}
