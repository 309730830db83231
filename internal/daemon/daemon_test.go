package daemon

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
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
	case "progress":
		w := Tee(os.Stderr)
		io.WriteString(w, "building\n")
		io.WriteString(w, "starting\n")
		Ready(nil)
		io.WriteString(w, "only in the log\n")
		os.Exit(0)
	case "code":
		io.WriteString(Tee(os.Stderr), "error: the check failed\n")
		Fail(3, errors.New("a preflight check failed"))
		os.Exit(3)
	case "slow":
		// Never ready: ends on SIGTERM, saying so.
		sigs := make(chan os.Signal, 1)
		signal.Notify(sigs, syscall.SIGTERM)
		io.WriteString(Tee(os.Stderr), "waiting\n")
		<-sigs
		io.WriteString(Tee(os.Stderr), "removing what I made\n")
		os.Exit(143)

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
	pid, out, _, err := startWith(t, context.Background(), mode, nil)
	return pid, out, err
}

func startWith(t *testing.T, ctx context.Context, mode string, progress io.Writer) (pid int, out, log string, err error) {
	t.Helper()
	dir := t.TempDir()
	out = filepath.Join(dir, "out")
	log = filepath.Join(dir, "log")
	env := append(os.Environ(), "DAEMON_TEST_CHILD="+mode, "DAEMON_TEST_OUT="+out)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pid, err = Start(ctx, Spec{Args: []string{"-test.run=^$"}, Log: log, Env: env, Progress: progress, StopWait: 10 * time.Second})
	return pid, out, log, err
}

// What the child says until it is ready is shown; after, only logged.
func TestStartProgress(t *testing.T) {
	var shown bytes.Buffer
	_, _, log, err := startWith(t, context.Background(), "progress", &shown)
	if err != nil {
		t.Fatal(err)
	}
	if shown.String() != "building\nstarting\n" {
		t.Errorf("shown %q, want what the child said before it was ready", shown.String())
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		b, _ := os.ReadFile(log)
		if strings.Contains(string(b), "only in the log") {
			if !strings.HasPrefix(string(b), "building\nstarting\n") {
				t.Errorf("log %q lacks what was shown", b)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the log never got the line after ready: %q", b)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A child that fails says with which exit code; what it said is shown.
func TestStartFailCode(t *testing.T) {
	var shown bytes.Buffer
	_, _, _, err := startWith(t, context.Background(), "code", &shown)
	var f *Failure
	if !errors.As(err, &f) || f.Code != 3 || f.Msg != "a preflight check failed" {
		t.Fatalf("err = %#v, want a Failure with code 3", err)
	}
	if shown.String() != "error: the check failed\n" {
		t.Errorf("shown %q", shown.String())
	}
}

// A wait that ends first stops the child with SIGTERM, and shows what it
// says while it ends.
func TestStartCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	shown := syncBuffer{seen: "waiting", then: cancel}
	_, _, _, err := startWith(t, ctx, "slow", &shown)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want the cancel", err)
	}
	if !strings.Contains(shown.String(), "removing what I made") {
		t.Errorf("shown %q: the child did not end on SIGTERM, or it was not shown", shown.String())
	}
}

// syncBuffer is a buffer that calls then once it holds seen.
type syncBuffer struct {
	mu   sync.Mutex
	b    bytes.Buffer
	seen string
	then func()
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, err := s.b.Write(p)
	if s.then != nil && strings.Contains(s.b.String(), s.seen) {
		s.then()
		s.then = nil
	}
	return n, err
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
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
