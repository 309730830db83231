package sandbox

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/propio/propio-sandbox/internal/backend"
)

// TestRunTeardown: once the command has ended, the removal may be handed
// over (Release), and is not done by the run; before it ended, or when
// Release declines, the run removes everything itself; an engine that has
// gone away (before the removal, or during it) is said in an
// *EngineGoneError naming what is left, with exit code 125, and nothing
// more is asked of it.
func TestRunTeardown(t *testing.T) {
	t.Parallel()
	gone := errors.New("the engine at fake:// does not answer")
	for _, tc := range []struct {
		name     string
		setup    func(f *fakeRuntime)
		release  bool // what Release answers
		code     int
		released bool // Release was asked
		removed  bool // the run removed everything itself
		gone     bool
	}{
		{"ended, handed over", func(f *fakeRuntime) {}, true, 3, true, false, false},
		{"ended, declined", func(f *fakeRuntime) {}, false, 3, true, true, false},
		{"not started", func(f *fakeRuntime) {
			f.on["Run"] = func(context.Context) error { return errors.New("cannot create") }
		}, true, 0, false, true, false},
		{"engine gone", func(f *fakeRuntime) {
			f.on["Reachable"] = func(context.Context) error { return gone }
		}, true, ExitEngineGone, false, false, true},
		{"engine gone while removing", func(f *fakeRuntime) {
			var n atomic.Int32
			f.on["Reachable"] = func(context.Context) error {
				if n.Add(1) > 1 {
					return gone
				}
				return nil
			}
			f.on["Remove"] = func(context.Context) error { return errors.New("error marking network for deletion") }
		}, false, ExitEngineGone, true, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFake(t)
			f.run = func(context.Context, backend.RunSpec) (int, error) { return 3, nil }
			tc.setup(f)
			p := testProject(true)
			p.Networks["outside"] = types.NetworkConfig{Name: "propio-test-1_outside"}
			var asked atomic.Value
			var started string
			o := RunOptions{
				Host:    "fake://",
				Started: func(c string) { started = c },
				Release: func(project string) bool { asked.Store(project); return tc.release },
			}
			out := runOnly(t, f, &fakeSignals{}, p, o)
			if out.code != tc.code {
				t.Errorf("exit code %d, want %d (%v)", out.code, tc.code, out.err)
			}
			if got, _ := asked.Load().(string); (got != "") != tc.released || tc.released && got != p.Name {
				t.Errorf("Release asked for %q, want asked: %v", got, tc.released)
			}
			if got := slices.Contains(f.called(), "Remove"); got != tc.removed {
				t.Errorf("the run removed it itself: %v, want %v; calls %v", got, tc.removed, f.called())
			}
			var ge *EngineGoneError
			if errors.As(out.err, &ge) != tc.gone {
				t.Fatalf("error %v, want an engine gone: %v", out.err, tc.gone)
			}
			switch {
			case tc.gone:
				if !errors.Is(out.err, gone) || strings.Contains(out.err.Error(), "\n") {
					t.Errorf("error %q: want one line, wrapping how the engine was found gone", out.err)
				}
				for _, name := range []string{"propio-test-1-gateway-1", "propio-test-1_outside", "propio-test-1_sandbox", "fake://"} {
					if !strings.Contains(out.err.Error(), name) {
						t.Errorf("error %q does not name %s", out.err, name)
					}
				}
				if started != "" && !strings.Contains(out.err.Error(), started) {
					t.Errorf("error %q does not name the sandbox's container %s", out.err, started)
				}
			case tc.name != "not started" && out.err != nil:
				t.Errorf("error %v, want none", out.err)
			}
		})
	}
}
