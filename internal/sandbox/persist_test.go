package sandbox

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"github.com/propio/propio-sandbox/internal/backend"
	"github.com/propio/propio-sandbox/internal/hostinfo"
)

// writeRecords writes records into a state directory of the test's.
func writeRecords(t *testing.T, recs ...Record) hostinfo.Dirs {
	t.Helper()
	dirs := hostinfo.Dirs{State: t.TempDir()}
	for _, r := range recs {
		dir := keepDir(dirs, r.Name)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := r.write(dir); err != nil {
			t.Fatal(err)
		}
	}
	return dirs
}

// Find takes a name, or the record of the directory or of the closest one
// above it; several of the same directory are an error naming them.
func TestFind(t *testing.T) {
	t.Parallel()
	dirs := writeRecords(t,
		Record{Name: "top", Workspace: "/w", State: StateRunning},
		Record{Name: "inner", Workspace: "/w/inner", State: StateRunning},
		Record{Name: "a", Workspace: "/two", State: StateRunning},
		Record{Name: "b", Workspace: "/two", State: StateStopped},
		Record{Name: "own", Workspace: "/three", State: StateRunning, Default: true},
		Record{Name: "named", Workspace: "/three", State: StateRunning},
	)
	for _, tc := range []struct {
		name, workspace, want string
		err                   any
	}{
		{name: "inner", want: "inner"},
		{name: "propio-inner", want: "inner"},
		{name: "nosuch", err: &NoSandboxError{}},
		{workspace: "/w", want: "top"},
		{workspace: "/w/src/pkg", want: "top"},
		{workspace: "/w/inner/deeper", want: "inner"},
		{workspace: "/elsewhere", err: &NoSandboxError{}},
		{workspace: "/wx", err: &NoSandboxError{}},
		{workspace: "/two/x", err: &SeveralError{}},
		{workspace: "/three", want: "own"},
	} {
		r, err := Find(dirs, tc.name, tc.workspace)
		switch want := tc.err.(type) {
		case *NoSandboxError:
			if !errors.As(err, &want) {
				t.Errorf("Find(%q, %q) = %+v, %v; want no sandbox", tc.name, tc.workspace, r, err)
			}
		case *SeveralError:
			if !errors.As(err, &want) || !slices.Equal(want.Names, []string{"a", "b"}) {
				t.Errorf("Find(%q, %q) = %v; want several, a and b", tc.name, tc.workspace, err)
			}
		default:
			if err != nil || r.Name != tc.want {
				t.Errorf("Find(%q, %q) = %s, %v; want %s", tc.name, tc.workspace, r.Name, err, tc.want)
			}
		}
	}
}

// A command exec'd from below the workspace runs in the same directory
// below the sandbox's workspace.
func TestWorkDir(t *testing.T) {
	t.Parallel()
	r := Record{Workspace: "/home/me/proj", Target: "/workspace"}
	for dir, want := range map[string]string{
		"/home/me/proj":         "",
		"/home/me/proj/src/pkg": "/workspace/src/pkg",
		"/home/me/other":        "",
	} {
		if got := r.WorkDir(dir); got != want {
			t.Errorf("WorkDir(%s) = %q, want %q", dir, got, want)
		}
	}
}

// A persistent sandbox's resources are left over only when its record
// says nothing of them any more: never while it is stopped, or its
// supervisor is between lives.
func TestKeptLeftover(t *testing.T) {
	t.Parallel()
	host, _ := os.Hostname()
	dirs := writeRecords(t,
		Record{Name: "stopped", ID: "1", State: StateStopped},
		Record{Name: "running", ID: "1", State: StateRunning, Supervisor: 1 << 22},
		Record{Name: "gone", ID: "1", State: StateGone},
		Record{Name: "again", ID: "2", State: StateRunning},
		Record{Name: "starting", ID: "1", State: StateStarting, Supervisor: 1 << 22},
	)
	for name, want := range map[string]bool{
		"stopped": false, "running": false, "gone": true, "again": true, "starting": true, "forgotten": true,
	} {
		s := backend.Sandbox{Project: "propio-" + name, Host: host, PID: 1 << 22, Keep: keepDir(dirs, name), KeepID: "1"}
		if got := leftover(s); got != want {
			t.Errorf("leftover(%s) = %v, want %v", name, got, want)
		}
	}
	other := backend.Sandbox{Project: "propio-x", Host: host + "-elsewhere", Keep: "/nowhere", KeepID: "1"}
	if leftover(other) {
		t.Error("another host's persistent sandbox is a leftover")
	}
}

// A supervisor is alive while it holds its record's lock; looking does
// not keep one that takes it from taking it.
func TestSupervisorLock(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if supervisorRuns(dir) {
		t.Error("a supervisor runs where there is no lock")
	}
	lock, ok, err := takeLock(filepath.Join(dir, lockFile), lockWait)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	if !supervisorRuns(dir) {
		t.Error("the lock is held, and no supervisor is said to run")
	}
	if _, ok, _ := takeLock(filepath.Join(dir, lockFile), 0); ok {
		t.Error("a second supervisor took the lock")
	}
	lock.Close()
	// A look holds the lock, shared, for a moment: a supervisor waits.
	f, _ := os.Open(filepath.Join(dir, lockFile))
	syscall.Flock(int(f.Fd()), syscall.LOCK_SH)
	got := make(chan bool, 1)
	go func() {
		_, ok, _ := takeLock(filepath.Join(dir, lockFile), lockWait)
		got <- ok
	}()
	f.Close()
	if !<-got {
		t.Error("a supervisor could not take the lock after a look")
	}
}

// ls shows each persistent sandbox once, as its record says, and what a
// forgotten one left as persistent leftovers.
func TestWithRecords(t *testing.T) {
	t.Parallel()
	dirs := writeRecords(t, Record{Name: "kept", ID: "1", Project: "propio-kept", State: StateStopped})
	list := []backend.Sandbox{
		{Project: "propio-run", PID: 7, State: "running"},
		{Project: "propio-kept", PID: 8, State: "exited", Keep: keepDir(dirs, "kept"), KeepID: "1"},
		{Project: "propio-old", PID: 9, State: "running", Keep: keepDir(dirs, "old"), KeepID: "1"},
	}
	recs, err := Records(dirs)
	if err != nil {
		t.Fatal(err)
	}
	got := withRecords(list, recs, dirs)
	if len(got) != 3 {
		t.Fatalf("listed %+v", got)
	}
	by := map[string]Sandbox{}
	for _, s := range got {
		by[s.Project] = s
	}
	if s := by["propio-kept"]; !s.Persistent || s.State != StateStopped || s.Name != "kept" || s.PID != 0 {
		t.Errorf("the stopped sandbox: %+v", s)
	}
	if s := by["propio-old"]; !s.Persistent || s.Name != "old" || s.Alive {
		t.Errorf("a forgotten sandbox's leftovers: %+v", s)
	}
	if s := by["propio-run"]; s.Persistent {
		t.Errorf("a run: %+v", s)
	}
}
