package sandbox

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/backend"
	"github.com/propio/propio-sandbox/internal/hostinfo"
)

// TestCheckPendingNameTakenAgain: a killed launcher's guard plan is judged
// even when another launcher has since taken its name (names are reclaimed
// from launchers that are gone): the live sandbox of that name is not the
// one the plan guards.
func TestCheckPendingNameTakenAgain(t *testing.T) {
	dirs := hostinfo.Dirs{State: t.TempDir()}
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	plan := map[string]any{"project": "propio-app", "started": time.Now(), "launcher_pid": dead.Process.Pid, "launcher_host": host}
	data, err := json.Marshal(plan)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dirs.GuardDir(), "propio-app.json")
	if err := os.MkdirAll(dirs.GuardDir(), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, data, 0o600); err != nil {
		t.Fatal(err)
	}
	f := newFake(t)
	f.sandboxes = []backend.Sandbox{{Project: "propio-app", PID: os.Getpid(), Host: host, Alive: true, State: "running"}}
	if err := CheckPending(context.Background(), &recorder{}, f, dirs); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(file); err == nil {
		t.Errorf("the plan of the killed launcher was not judged: a live sandbox of another launcher has its name")
	}

	// The plan's own launcher's sandbox still on the engine: not judged yet.
	if err := os.WriteFile(file, data, 0o600); err != nil {
		t.Fatal(err)
	}
	f.sandboxes = append(f.sandboxes, backend.Sandbox{Project: "propio-app", PID: dead.Process.Pid, Host: host, State: "running"})
	if err := CheckPending(context.Background(), &recorder{}, f, dirs); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(file); err != nil {
		t.Errorf("the plan was judged while its own sandbox is still on the engine: %v", err)
	}
}
