package daemon

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The test binary is the child: TestMain plays the background process
// when DAEMON_TEST_CHILD says how.
func TestMain(m *testing.M) {
	switch os.Getenv("DAEMON_TEST_CHILD") {
	case "ready":
		Ready(nil)
		// Goes on alone: writes where the parent looks, after it returned.
		time.Sleep(200 * time.Millisecond)
		os.WriteFile(os.Getenv("DAEMON_TEST_OUT"), []byte(strings.Join([]string{os.Getenv("DAEMON_TEST_CHILD"), strconv.Itoa(os.Getpid())}, " ")), 0o600)
		os.Exit(0)
	case "fail":
		Ready(errors.New("cannot start the sandbox"))
		os.Exit(1)
	case "exit":
		os.Stderr.WriteString("something went wrong\n")
		os.Exit(3)
	case "files":
		// Holds the first file (a lock) a moment, writes through the second.
		time.Sleep(200 * time.Millisecond)
		note := File(1, "note")
		note.WriteString("files " + strconv.Itoa(os.Getpid()))
		note.Close()
		File(0, "lock").Close()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func start(t *testing.T, mode string) (int, string, error) {
	t.Helper()
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	env := append(os.Environ(), "DAEMON_TEST_CHILD="+mode, "DAEMON_TEST_OUT="+out)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pid, err := Start(ctx, Spec{Args: []string{"-test.run=^$"}, Log: filepath.Join(dir, "log"), Env: env})
	return pid, out, err
}

func TestStartReady(t *testing.T) {
	pid, out, err := start(t, "ready")
	if err != nil {
		t.Fatal(err)
	}
	// The child outlives the wait and finishes alone.
	deadline := time.Now().Add(20 * time.Second)
	for {
		b, err := os.ReadFile(out)
		if err == nil && len(b) > 0 {
			if want := "ready " + strconv.Itoa(pid); string(b) != want {
				t.Fatalf("child wrote %q, want %q", b, want)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the child never wrote its file")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestStartFailed(t *testing.T) {
	_, _, err := start(t, "fail")
	if err == nil || err.Error() != "cannot start the sandbox" {
		t.Fatalf("err = %v, want the child's", err)
	}
}

func TestStartExited(t *testing.T) {
	_, _, err := start(t, "exit")
	if err == nil || !strings.Contains(err.Error(), "ended before it was ready") || !strings.Contains(err.Error(), "something went wrong") {
		t.Fatalf("err = %v, want the exit and the log's tail", err)
	}
}

// TestSpawnFiles: Spawn returns before the child is ready, and the child
// has the files passed, as File(0), File(1): a lock taken in the parent is
// still held by the child after the parent has closed its copy.
func TestSpawnFiles(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	lockPath := filepath.Join(dir, "lock")
	lock, err := os.OpenFile(lockPath, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	note, err := os.CreateTemp(dir, "note")
	if err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), "DAEMON_TEST_CHILD=files", "DAEMON_TEST_OUT="+out)
	pid, err := Spawn(Spec{Args: []string{"-test.run=^$"}, Log: filepath.Join(dir, "log"), Env: env, Files: []*os.File{lock, note}})
	lock.Close()
	note.Close()
	if err != nil {
		t.Fatal(err)
	}
	// The child holds the lock until it exits: a blocking lock here is
	// taken only then.
	again, err := os.OpenFile(lockPath, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if err := syscall.Flock(int(again.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err == nil {
		t.Fatal("the lock is free while the child holds it")
	}
	if err := syscall.Flock(int(again.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(note.Name())
	if err != nil || string(b) != "files "+strconv.Itoa(pid) {
		t.Fatalf("the child wrote %q (%v) through its second file, want files %d", b, err, pid)
	}
}
