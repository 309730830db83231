//go:build linux

package e2e

// Persistent sandboxes: up, exec, down, ls, stop, start, the idle timeout
// and gc, on the real engine, observed from the host and from inside.

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// persisted is a persistent sandbox a test made: its name, and the
// launcher's world it was made in.
type persisted struct {
	s    *sandbox
	name string
}

// up runs `up -p p ARGS...` in s and returns the sandbox, removed (down) in
// the test's cleanup, before the harness looks for leftovers.
func up(t *testing.T, s *sandbox, p string, args ...string) *persisted {
	t.Helper()
	r := s.Run("", append([]string{"up", "-p", p}, args...)...)
	if r.Code != 0 {
		t.Fatalf("up failed:\n%s", r)
	}
	name := strings.TrimSpace(r.Stdout)
	if name == "" || strings.Contains(name, "\n") {
		t.Fatalf("up printed no single name:\n%s", r)
	}
	t.Cleanup(func() { s.Run("", "down", name) })
	return &persisted{s: s, name: name}
}

// exec runs `exec NAME -- ARGS...` with stdin.
func (p *persisted) exec(stdin string, args ...string) Result {
	p.s.t.Helper()
	return p.s.Run(stdin, append([]string{"exec", p.name, "--"}, args...)...)
}

// entry is the sandbox's entry in `ls --json`; ok false when there is none.
func (p *persisted) entry(t *testing.T) (e lsEntry, ok bool) {
	t.Helper()
	r := p.s.Run("", "ls", "--json")
	if r.Code != 0 && !strings.HasPrefix(r.Stdout, "[") {
		t.Fatalf("ls --json failed:\n%s", r)
	}
	var list []lsEntry
	if err := json.Unmarshal([]byte(r.Stdout), &list); err != nil {
		t.Fatalf("ls --json: %v\n%s", err, r.Stdout)
	}
	for _, e := range list {
		if e.Persistent && e.Name == p.name {
			return e, true
		}
	}
	return lsEntry{}, false
}

type lsEntry struct {
	Project    string `json:"project"`
	Name       string `json:"name"`
	Workspace  string `json:"workspace"`
	PID        int    `json:"launcher_pid"`
	Alive      bool   `json:"launcher_alive"`
	State      string `json:"state"`
	Why        string `json:"why"`
	Persistent bool   `json:"persistent"`
}

// containers are the sandbox's containers as the engine lists them: name
// and state.
func (p *persisted) containers(t *testing.T) map[string]string {
	t.Helper()
	out, err := docker("ps", "-a", "--filter", "label=dev.propio-sandbox.project=propio-"+p.name, "--format", "{{.Names}} {{.State}}")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if name, state, ok := strings.Cut(l, " "); ok {
			got[name] = state
		}
	}
	return got
}

// supervisorEnded waits (bounded) until no supervisor holds the
// sandbox's record: its lock is free.
func (p *persisted) supervisorEnded(t *testing.T, limit time.Duration) {
	t.Helper()
	lock := filepath.Join(p.s.Home, ".local", "state", "propio-sandbox", "sandboxes", p.name, "supervisor.lock")
	f, err := os.OpenFile(lock, os.O_RDWR, 0)
	if err != nil {
		t.Fatalf("the supervisor's lock: %v", err)
	}
	defer f.Close()
	done := make(chan error, 1)
	go func() { done <- syscall.Flock(int(f.Fd()), syscall.LOCK_EX) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(limit):
		t.Fatalf("the supervisor of %s still runs after %s", p.name, limit)
	}
}

// TestPersistentUpExecDown: up prints the sandbox's name and returns; ls
// shows it running, persistent, with its supervisor; exec runs commands in
// it with pipes (stdin in, stdout and stderr apart), their exit codes, in
// the workspace; it is as isolated as run's (no capability, no host file,
// the keeper read-only); up again is the same sandbox; down removes it all
// and forgets it.
func TestPersistentUpExecDown(t *testing.T) {
	t.Parallel()
	s := newSandbox(t)
	profile := s.Profile(probeOffline)
	p := up(t, s, profile)
	if e, ok := p.entry(t); !ok || e.State != "running" || !e.Alive || e.Workspace != s.Workspace || e.Project != "propio-"+p.name {
		t.Fatalf("ls --json: %+v (found %v), want it running with its supervisor", e, ok)
	}
	if r := s.Run("", "up", "-p", profile); r.Code != 0 || strings.TrimSpace(r.Stdout) != p.name {
		t.Errorf("up again: want the same sandbox:\n%s", r)
	}
	if r := s.Run("", "up", "-p", s.Profile(probeOffline)); r.Code != 1 || !strings.Contains(r.Stderr, "runs with the profile "+profile) {
		t.Errorf("up again with another profile: want it refused, naming the one it runs with:\n%s", r)
	}
	// Another, by name, beside it: exec without a name still takes the
	// directory's own.
	named := up(t, s, profile, "--name", "extra-"+randomID())
	probeOK(t, named.exec("", "/probe", "id"), "cwd=/workspace")
	if r := s.Run("", "exec", "--", "/probe", "id"); r.Code != 0 {
		t.Errorf("exec in the directory's own beside a named one:\n%s", r)
	}
	if r := s.Run("", "down", named.name); r.Code != 0 {
		t.Errorf("down %s:\n%s", named.name, r)
	}
	for _, tc := range []struct {
		name, stdin  string
		args         []string
		code         int
		stdout, serr string
	}{
		{name: "exit code", args: []string{"/probe", "exit", "7"}, code: 7},
		{name: "stdin", stdin: "from the host\n", args: []string{"/probe", "cat"}, stdout: "from the host\n"},
		{name: "stderr apart", args: []string{"/probe", "stderr", "to stderr"}, serr: "to stderr\n"},
		{name: "working directory", args: []string{"/probe", "id"}, stdout: "cwd=/workspace"},
		{name: "no terminal", args: []string{"/probe", "tty"}, stdout: "stdin=false stdout=false\n"},
		{name: "no capability", args: []string{"/probe", "read", "/proc/self/status"}, stdout: "CapEff:\t0000000000000000"},
		{name: "no new privileges", args: []string{"/probe", "read", "/proc/self/status"}, stdout: "NoNewPrivs:\t1"},
		{name: "no host file", args: []string{"/probe", "read", filepath.Join(s.Home, ".config")}, code: 1, stdout: "no such file or directory"},
		{name: "keeper read-only", args: []string{"/probe", "write", "/run/propio-sandbox-keeper", "x"}, code: 1, stdout: "read-only file system"},
		// The runtime's code: 126 on Docker, 127 on Podman.
		{name: "not found", args: []string{"/nonexistent"}, code: 126},
	} {
		r := p.exec(tc.stdin, tc.args...)
		if tc.code == 126 && r.Code == 127 {
			r.Code = 126
		}
		if r.Code != tc.code || !strings.Contains(r.Stdout, tc.stdout) || tc.serr != "" && r.Stderr != tc.serr {
			t.Errorf("%s: want exit %d, %q on stdout, %q on stderr:\n%s", tc.name, tc.code, tc.stdout, tc.serr, r)
		}
	}
	if r := p.exec("", "/probe", "write", "/workspace/made-inside", "hello"); r.Code != 0 {
		t.Fatalf("writing in the workspace:\n%s", r)
	}
	isolationHasContent(t, filepath.Join(s.Workspace, "made-inside"), "hello")
	r := s.Run("", "down")
	if r.Code != 0 || strings.TrimSpace(r.Stdout) != "removed "+p.name {
		t.Fatalf("down (this directory's): \n%s", r)
	}
	if left := s.Leftovers(); len(left) > 0 {
		t.Errorf("down left %v", left)
	}
	if e, ok := p.entry(t); ok {
		t.Errorf("ls still shows the sandbox after down: %+v", e)
	}
	if r := p.exec("", "/probe", "id"); r.Code != 125 || !strings.Contains(r.Stderr, "no persistent sandbox is named "+p.name) {
		t.Errorf("exec after down: want exit 125 and why:\n%s", r)
	}
}

// TestPersistentExecSignals: the launcher's SIGTERM, SIGINT and SIGHUP
// reach the command exec runs (docker exec forwards none), which exits
// with its own code for it; the sandbox goes on.
func TestPersistentExecSignals(t *testing.T) {
	t.Parallel()
	s := newSandbox(t)
	p := up(t, s, s.Profile(probeOffline))
	for _, tc := range []struct {
		sig  syscall.Signal
		code int
		said string
	}{
		{syscall.SIGTERM, 143, "got terminated"},
		{syscall.SIGINT, 130, "got interrupt"},
		{syscall.SIGHUP, 129, "got hangup"},
	} {
		l := cleanupStart(t, s, "exec", p.name, "--", "/probe", "sleep", "1m")
		l.waitStdout(t, "ready", time.Minute)
		l.signal(t, tc.sig)
		r := l.wait(t, time.Minute)
		if r.Code != tc.code || !strings.Contains(r.Stdout, tc.said) {
			t.Errorf("exec after %v: want exit %d and %q:\n%s", tc.sig, tc.code, tc.said, r)
		}
	}
	if r := p.exec("", "/probe", "id"); r.Code != 0 {
		t.Errorf("the sandbox after the signals:\n%s", r)
	}
}

// TestPersistentExecTTY: from a terminal, exec gives the command one, the
// terminal's size, in raw mode (a line typed reaches cat, echoed by the
// sandbox's terminal), and follows the terminal's resizes.
func TestPersistentExecTTY(t *testing.T) {
	t.Parallel()
	s := newSandbox(t)
	p := up(t, s, s.Profile(probeOffline))
	t.Run("size", func(t *testing.T) {
		term := terminalStart(t, s, "exec", p.name, "--", "/probe", "winch", "30x100")
		// The terminal's size: at once where the engine takes it with the
		// exec (API 1.42), else right after the start (docker exec too).
		term.waitFor("size=24x80", time.Minute)
		if err := terminalControl(term.master, func(fd int) {
			setWinsize(fd, 30, 100)
		}); err != nil {
			t.Fatal(err)
		}
		term.waitFor("resized size=30x100", time.Minute)
		if err := term.wait(time.Minute); err != nil {
			t.Fatalf("exec: %v\n%s", err, term.output())
		}
	})
	t.Run("cat", func(t *testing.T) {
		term := terminalStart(t, s, "exec", p.name, "--", "/probe", "cat")
		term.waitRaw(time.Minute)
		term.write("ping\n")
		term.waitForCount("ping", 2, time.Minute)
		term.write("\x04")
		if err := term.wait(time.Minute); err != nil {
			t.Fatalf("exec after Ctrl-D: %v\n%s", err, term.output())
		}
	})
}

// TestPersistentSurvivesTerminal: up run from a terminal returns, the
// terminal closes (its session gets SIGHUP), and the sandbox still runs:
// its supervisor is in a session of its own.
func TestPersistentSurvivesTerminal(t *testing.T) {
	t.Parallel()
	s := newSandbox(t)
	term := terminalStart(t, s, "up", "-p", s.Profile(probeOffline))
	term.waitFor(" is up", 2*time.Minute)
	if err := term.wait(time.Minute); err != nil {
		t.Fatalf("up on a terminal: %v\n%s", err, term.output())
	}
	out := term.output()
	m := regexp.MustCompile(`sandbox (\S+) is up`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("up did not say the sandbox is up:\n%s", out)
	}
	name := m[1]
	p := &persisted{s: s, name: name}
	t.Cleanup(func() { s.Run("", "down", name) })
	// The terminal goes: its session (up's) is hung up.
	syscall.Kill(-term.cmd.Process.Pid, syscall.SIGHUP)
	term.master.Close()
	if e, ok := p.entry(t); !ok || e.State != "running" || !e.Alive {
		t.Fatalf("after the terminal closed: %+v (found %v)\n%s", e, ok, out)
	}
	probeOK(t, p.exec("", "/probe", "id"), "cwd=/workspace")
}

// TestPersistentStopStart: stop stops the sandbox's containers and its
// supervisor ends (nothing of it holds CPU or memory), keeping what it
// wrote in its writable layer; exec says it is stopped; start runs it
// again, as it was.
func TestPersistentStopStart(t *testing.T) {
	t.Parallel()
	s := newSandbox(t)
	// /scratch is in the image, writable by anyone: in the writable layer.
	p := up(t, s, s.Profile("image: "+diskProbe(t, "ADD scratch.tar /")+"\n"+probeOffline))
	probeOK(t, p.exec("", "/probe", "write", "/scratch/layer.txt", "kept in the layer"), "wrote")
	before, _ := p.entry(t)
	if r := s.Run("", "stop", p.name); r.Code != 0 || !strings.Contains(r.Stdout, "stopped "+p.name) {
		t.Fatalf("stop:\n%s", r)
	}
	for c, state := range p.containers(t) {
		if state != "exited" {
			t.Errorf("after stop, container %s is %s", c, state)
		}
	}
	if len(p.containers(t)) == 0 {
		t.Error("stop removed the containers")
	}
	if !processEnds(before.PID, 10*time.Second) {
		t.Errorf("the supervisor (pid %d) still runs after stop", before.PID)
	}
	if e, ok := p.entry(t); !ok || e.State != "stopped" {
		t.Errorf("ls after stop: %+v", e)
	}
	if r := p.exec("", "/probe", "id"); r.Code != 125 || !strings.Contains(r.Stderr, "is stopped") || !strings.Contains(r.Stderr, "start "+p.name) {
		t.Errorf("exec in a stopped sandbox: want 125, why and the hint:\n%s", r)
	}
	if r := s.Run("", "gc"); r.Code != 0 || len(p.containers(t)) == 0 {
		t.Errorf("gc removed a stopped sandbox:\n%s", r)
	}
	if r := s.Run("", "start", p.name); r.Code != 0 {
		t.Fatalf("start:\n%s", r)
	}
	probeOK(t, p.exec("", "/probe", "read", "/scratch/layer.txt"), "kept in the layer")
	if e, ok := p.entry(t); !ok || e.State != "running" || !e.Alive || e.PID == before.PID {
		t.Errorf("ls after start: %+v, want it running with a new supervisor", e)
	}
	// Stopped again, down removes it itself: no supervisor runs.
	if r := s.Run("", "stop", p.name); r.Code != 0 {
		t.Fatalf("stop:\n%s", r)
	}
	if r := s.Run("", "down", p.name); r.Code != 0 || !strings.Contains(r.Stdout, "removed "+p.name) {
		t.Fatalf("down of a stopped sandbox:\n%s", r)
	}
	if left := s.Leftovers(); len(left) > 0 {
		t.Errorf("down of a stopped sandbox left %v", left)
	}
}

// TestPersistentIdle: a sandbox that runs no command for resources.idle
// is removed by its supervisor, all of it; a command that runs longer than
// that keeps it; exec then says it is gone, and why.
func TestPersistentIdle(t *testing.T) {
	t.Parallel()
	s := newSandbox(t)
	p := up(t, s, s.Profile(probeOffline+"resources: {idle: 3s}\n"))
	// Longer than the idle timeout: it runs to its end.
	if r := p.exec("", "/probe", "sleep", "5s"); r.Code != 0 || !strings.Contains(r.Stdout, "slept") {
		t.Fatalf("a command longer than resources.idle:\n%s", r)
	}
	p.supervisorEnded(t, time.Minute)
	if left := s.Leftovers(); len(left) > 0 {
		t.Errorf("idle left %v", left)
	}
	if e, ok := p.entry(t); !ok || e.State != "gone" || !strings.Contains(e.Why, "resources.idle (3s)") {
		t.Errorf("ls after idle: %+v (found %v), want it gone and why", e, ok)
	}
	if r := p.exec("", "/probe", "id"); r.Code != 125 || !strings.Contains(r.Stderr, "resources.idle") || !strings.Contains(r.Stderr, "down "+p.name) {
		t.Errorf("exec in an idle-removed sandbox:\n%s", r)
	}
}

// TestPersistentGC: a supervisor killed leaves its sandbox running with
// nothing to watch it: ls says so, exec refuses, gc stops it (kept), and
// start resumes it. A sandbox whose record is gone is a leftover gc
// removes; a run in the same workspace takes another name and leaves a
// persistent sandbox alone.
//
// Not parallel: the sandbox it leaves without a supervisor is a leftover
// that any other test's launch on a shared engine may remove first (as it
// should).
func TestPersistentGC(t *testing.T) {
	s := newSandbox(t)
	p := up(t, s, s.Profile(probeOffline))
	e, _ := p.entry(t)
	if err := syscall.Kill(e.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	p.supervisorEnded(t, time.Minute)
	if e, _ := p.entry(t); !strings.Contains(e.Why, "was killed") {
		t.Errorf("ls after the supervisor was killed: %+v", e)
	}
	if r := p.exec("", "/probe", "id"); r.Code != 125 || !strings.Contains(r.Stderr, "start "+p.name) {
		t.Errorf("exec without a supervisor:\n%s", r)
	}
	// A run meanwhile takes another name, and leaves the sandbox alone.
	probeOK(t, s.Run("", "run", "-p", s.Profile(probeOffline), "--", "exit", "0"), "")
	if r := s.Run("", "gc"); r.Code != 0 || !strings.Contains(r.Stdout, "stopped "+p.name) {
		t.Fatalf("gc: want it stopped:\n%s", r)
	}
	for c, state := range p.containers(t) {
		if state != "exited" {
			t.Errorf("after gc, %s is %s", c, state)
		}
	}
	if r := s.Run("", "start", p.name); r.Code != 0 {
		t.Fatalf("start after gc:\n%s", r)
	}
	probeOK(t, p.exec("", "/probe", "id"), "cwd=/workspace")
	// Forgotten: its record removed by hand.
	os.RemoveAll(filepath.Join(s.Home, ".local", "state", "propio-sandbox", "sandboxes", p.name))
	if r := s.Run("", "gc"); r.Code != 0 || !strings.Contains(r.Stdout, "removed propio-"+p.name) {
		t.Fatalf("gc of a forgotten sandbox:\n%s\n%s", r, s.Run("", "ls", "--json"))
	}
	if left := s.Leftovers(); len(left) > 0 {
		t.Errorf("gc left %v", left)
	}
}

// TestPersistentChangeset: in changeset mode (an overlay, or a copy in the
// engine's volume) the sandbox writes to a changeset, kept across stop and
// start; down seals it for review, from a running sandbox (its supervisor)
// or a stopped one (down itself copies it back), and the workspace is
// untouched until apply.
func TestPersistentChangeset(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		mode            string
		downWhenStopped bool
	}{{"overlay", false}, {"copy", true}} {
		t.Run(tc.mode, func(t *testing.T) {
			t.Parallel()
			s := newSandbox(t)
			s.Env = append(s.Env, "PROPIO_SANDBOX_CHANGESET_MODE="+tc.mode)
			isolationWriteFile(t, filepath.Join(s.Workspace, "notes.txt"), "original\n")
			p := up(t, s, s.Profile(probeOffline), "--changeset")
			probeOK(t, p.exec("", "/probe", "write", "/workspace/notes.txt", "changed inside\n"), "wrote")
			isolationHasContent(t, filepath.Join(s.Workspace, "notes.txt"), "original\n")
			if r := s.Run("", "stop", p.name); r.Code != 0 {
				t.Fatalf("stop:\n%s", r)
			}
			if r := s.Run("", "start", p.name); r.Code != 0 {
				t.Fatalf("start:\n%s", r)
			}
			probeOK(t, p.exec("", "/probe", "read", "/workspace/notes.txt"), "changed inside")
			if tc.downWhenStopped {
				if r := s.Run("", "stop", p.name); r.Code != 0 {
					t.Fatalf("stop:\n%s", r)
				}
			}
			r := s.Run("", "down", p.name)
			if r.Code != 0 || !strings.Contains(r.Stderr, "changeset ") {
				t.Fatalf("down: want the changeset to review:\n%s", r)
			}
			diff := s.Run("", "diff")
			if diff.Code != 0 || !strings.Contains(diff.Stdout, "+changed inside") {
				t.Fatalf("diff after down:\n%s", diff)
			}
			isolationHasContent(t, filepath.Join(s.Workspace, "notes.txt"), "original\n")
		})
	}
}

// TestPersistentChecks: up passes the profile's declared checks first; one
// that fails stops it with exit 3, and nothing is left (no sandbox, no
// record).
func TestPersistentChecks(t *testing.T) {
	t.Parallel()
	s := newSandbox(t)
	p := s.Profile(probeOffline + "checks:\n  - {name: never, run: [exit, \"4\"]}\n")
	r := s.Run("", "up", "-p", p)
	if r.Code != 3 || !strings.Contains(r.Stderr, "never failed: [exit 4] exited 4") {
		t.Fatalf("up with a failing check: want exit 3 and the check named:\n%s", r)
	}
	if r := s.Run("", "ls", "--json"); strings.Contains(r.Stdout, `"workspace": "`+s.Workspace+`"`) {
		t.Errorf("a sandbox that never ran is listed:\n%s", r)
	}
	// One that passes lets it up; the sandbox runs the keeper, not the
	// check's command.
	ok := up(t, s, s.Profile(probeOffline+"checks:\n  - {name: fine, run: [exit, \"0\"]}\n"))
	probeOK(t, ok.exec("", "/probe", "id"), "cwd=/workspace")
}

// TestPersistentUpInterrupted: Ctrl+C on up while its supervisor makes
// the sandbox (here, during a declared check) stops it, as it stops a run:
// exit 130, and nothing is left, not even a record.
func TestPersistentUpInterrupted(t *testing.T) {
	t.Parallel()
	s := newSandbox(t)
	l := cleanupStart(t, s, "up", "-p", s.Profile(probeOffline+"checks:\n  - {name: slow, run: [sleep, 1m]}\n"))
	deadline := time.Now().Add(time.Minute)
	for len(cleanupProjects(t, s)) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the check's sandbox never ran:\n%s", l.result())
		}
		time.Sleep(100 * time.Millisecond) // the engine says nothing to the test
	}
	l.signal(t, syscall.SIGINT)
	if r := l.wait(t, 2*time.Minute); r.Code != 130 {
		t.Errorf("up after Ctrl+C: want exit 130:\n%s", r)
	}
	if r := s.Run("", "ls", "--json"); strings.Contains(r.Stdout, `"workspace": "`+s.Workspace+`"`) {
		t.Errorf("an interrupted up is listed:\n%s", r)
	}
	if entries, _ := os.ReadDir(filepath.Join(s.Home, ".local", "state", "propio-sandbox", "sandboxes")); len(entries) > 1 {
		t.Errorf("an interrupted up left records: %v", entries)
	}
}

// TestPersistentAllowlist: a persistent sandbox's gateway is run's: an
// allowed name is reached, a denied one is not, both logged; stopped with
// the sandbox, started again with it.
func TestPersistentAllowlist(t *testing.T) {
	t.Parallel()
	requireEngine(t)
	s := newSandbox(t)
	in := newInternet(t)
	s.Env = append(s.Env, "PROPIO_SANDBOX_GATEWAY_NETWORK="+in.Network)
	p := up(t, s, s.Profile("network: {mode: allowlist, allow: [allowed.test]}\n"))
	check := func(when string) {
		t.Helper()
		if r := p.exec("", "/probe", "fetch", "http://allowed.test/"); !strings.Contains(r.Stdout, "status 200") {
			t.Errorf("%s: an allowed name:\n%s", when, r)
		}
		if r := p.exec("", "/probe", "fetch", "http://denied.test/"); strings.Contains(r.Stdout, "status 200") {
			t.Errorf("%s: a denied name was reached:\n%s", when, r)
		}
	}
	check("after up")
	if r := s.Run("", "stop", p.name); r.Code != 0 {
		t.Fatalf("stop:\n%s", r)
	}
	for c, state := range p.containers(t) {
		if state != "exited" {
			t.Errorf("after stop, %s is %s", c, state)
		}
	}
	if r := s.Run("", "start", p.name); r.Code != 0 {
		t.Fatalf("start:\n%s", r)
	}
	check("after start")
	entries := decisions(t, s, false)
	if !logged(entries, "http", "allowed.test", true) || !logged(entries, "http", "denied.test", false) {
		t.Errorf("the decision log lacks the requests:\n%v", entries)
	}
}

// TestPersistentErrors: what exec, up and down say to a mistake, with the
// exit codes they document.
func TestPersistentErrors(t *testing.T) {
	t.Parallel()
	s := newSandbox(t)
	for _, tc := range []struct {
		args     []string
		code     int
		err, hnt string
	}{
		{[]string{"exec", "--", "/probe", "id"}, 125, "no persistent sandbox is of " + s.Workspace, "up"},
		{[]string{"exec", "nosuch", "--", "/probe", "id"}, 125, "no persistent sandbox is named nosuch", "ls"},
		{[]string{"exec", "/probe", "id"}, 2, "put the command after --", "help"},
		{[]string{"up", "--name", "Bad Name"}, 2, "a sandbox's name is", "help"},
		{[]string{"down", "nosuch"}, 1, "no persistent sandbox is named nosuch", "ls"},
		{[]string{"start"}, 1, "no persistent sandbox is of", "up"},
	} {
		r := s.Run("", tc.args...)
		errorsCheck(t, r, tc.code, []string{tc.err}, []string{tc.hnt})
	}
}

// TestPersistentWrapper: bin/propio-sandbox-sh, given to an agent as its
// shell, runs each `-c COMMAND` in the directory's persistent sandbox with
// sh, in the same directory below the workspace, with the command's
// arguments, stdin and exit code.
func TestPersistentWrapper(t *testing.T) {
	t.Parallel()
	s := newSandbox(t)
	requireAgentImage(t)
	up(t, s, s.Profile("image: propio-sandbox/agent:latest\nnetwork: {mode: none}\n"))
	sub := filepath.Join(s.Workspace, "src", "pkg")
	if err := os.MkdirAll(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	wrapper := filepath.Join(repoRoot(), "bin", "propio-sandbox-sh")
	for _, tc := range []struct {
		args        []string
		stdin, want string
		code        int
	}{
		{args: []string{"-c", "echo $((1+2)); exit 4"}, want: "3\n", code: 4},
		{args: []string{"-lc", "pwd"}, want: "/workspace/src/pkg\n"},
		{args: []string{"-c", `echo "$0:$1:$2"`, "zero", "one two", "three"}, want: "zero:one two:three\n"},
		{args: []string{"-ec", "false; echo not reached"}, code: 1},
		{args: []string{"-c", "wc -l"}, stdin: "a\nb\n", want: "2\n"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		cmd := s.Command(ctx, tc.args...)
		cmd.Path, cmd.Args = wrapper, append([]string{wrapper}, tc.args...)
		cmd.Dir = sub
		cmd.Env = append(cmd.Env, "PROPIO_SANDBOX_BIN="+launcher)
		cmd.Stdin = strings.NewReader(tc.stdin)
		r := runCmd(t, ctx, cmd)
		cancel()
		if r.Code != tc.code || r.Stdout != tc.want {
			t.Errorf("propio-sandbox-sh %q: want exit %d and %q:\n%s", tc.args, tc.code, tc.want, r)
		}
	}
}

// processEnds reports whether the process pid has ended (or ends within
// limit: it may be letting go of its last files), awaited through a pidfd.
func processEnds(pid int, limit time.Duration) bool {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return errors.Is(err, unix.ESRCH)
	}
	defer unix.Close(fd)
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, int(limit.Milliseconds()))
	return err == nil && n == 1
}

// setWinsize sets the size of the terminal whose master is fd: the kernel
// sends SIGWINCH to its foreground process group.
func setWinsize(fd int, rows, cols uint16) {
	unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols})
}
