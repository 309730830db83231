package diskcap

import (
	"context"
	"os/exec"
	"runtime"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestWalkKillsNoChild: a walk ends no OS thread, so the children that a
// thread started with a parent-death signal (as the docker CLI's ssh
// helper starts ssh, one per connection to an ssh:// engine) live on.
//
// Each child is started by the thread the next walk's goroutine first runs
// on: the caller's (a goroutine blocked right after starting another one
// hands its thread to it). A walk whose thread ended with it killed them.
func TestWalkKillsNoChild(t *testing.T) {
	if _, err := exec.LookPath("sleep"); err != nil {
		t.Skip("no sleep program to start as a child")
	}
	dir := t.TempDir()
	fill(t, dir+"/f", 4096)
	exited := make(chan error, 10)
	for range 10 {
		runtime.LockOSThread()
		cmd := exec.Command("sleep", "60")
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		err := cmd.Start()
		runtime.UnlockOSThread()
		if err != nil {
			t.Fatal(err)
		}
		go func() { exited <- cmd.Wait() }()
		t.Cleanup(func() { cmd.Process.Kill() })
		if _, err := Walk(context.Background(), []string{dir}); err != nil {
			t.Fatal(err)
		}
	}
	// A thread's end kills its children at once; a child's end reaches
	// Wait within a moment.
	select {
	case err := <-exited:
		t.Fatalf("a child of the launcher ended during the walks: %v", err)
	case <-time.After(time.Second):
	}
}

// TestWalkRunsAtLowPriority: a walk runs at nice 19, and the caller's
// thread keeps its priority.
func TestWalkRunsAtLowPriority(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	before, err := unix.Getpriority(unix.PRIO_PROCESS, unix.Gettid())
	if err != nil {
		t.Fatal(err)
	}
	var nice int
	lowPriority(func() {
		// The raw syscall's value is 20 - nice.
		p, err := unix.Getpriority(unix.PRIO_PROCESS, unix.Gettid())
		if err != nil {
			t.Error(err)
		}
		nice = 20 - p
	})
	if nice != 19 {
		t.Errorf("the walk ran at nice %d, want 19", nice)
	}
	if after, _ := unix.Getpriority(unix.PRIO_PROCESS, unix.Gettid()); after != before {
		t.Errorf("the caller's priority changed from %d to %d", before, after)
	}
}
