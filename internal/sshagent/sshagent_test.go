package sshagent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

const agent = "/tmp/agent.sock"

// machineConns is what podman machine leaves: a rootless default and a root
// connection, with a field this package does not know.
const machineConns = `[
 {"Name":"podman-machine-default","URI":"ssh://core@127.0.0.1:60123/run/user/501/podman/podman.sock",
  "Identity":"/Users/u/.local/share/containers/podman/machine/machine","IsMachine":true,"Default":true,"ReadWrite":true},
 {"Name":"podman-machine-default-root","URI":"ssh://root@127.0.0.1:60123/run/podman/podman.sock",
  "Identity":"/Users/u/.local/share/containers/podman/machine/machine","IsMachine":true,"Default":false,"ReadWrite":true}
]`

// config is a launch on goos with engine whose every check succeeds.
func config(goos, engine string, mode Mode, r *fakeRunner, clk *fakeClock) Config {
	if r.list == "" {
		r.list = machineConns
	}
	if r.probes == nil {
		r.probes = []bool{true}
	}
	return Config{
		Mode: mode, GOOS: goos, Engine: engine, AuthSock: agent,
		DockerDesktop: func(context.Context) (bool, error) {
			r.record("engine: docker desktop?")
			return true, nil
		},
		VMPathExists: func(_ context.Context, p string) (bool, error) {
			r.record("engine: exists " + p)
			return p == DockerDesktopSocket, nil
		},
		Run: r, Clock: clk, Stat: fakeStat(map[string]fs.FileMode{agent: fs.ModeSocket}), ID: "t1",
	}
}

// unbranded fails on links or another project's names in user-facing text.
func unbranded(t *testing.T, texts ...string) {
	t.Helper()
	for _, s := range texts {
		l := strings.ToLower(s)
		for _, bad := range []string{"http", "llxprt", "gemini", "google", "@"} {
			if strings.Contains(l, bad) && !(bad == "@" && strings.Contains(s, "core@")) {
				t.Errorf("%q mentions %q", s, bad)
			}
		}
	}
}

// wantFatal checks err is a *FatalError whose message and hints hold want.
func wantFatal(t *testing.T, err error, want ...string) *FatalError {
	t.Helper()
	var fe *FatalError
	if !errors.As(err, &fe) || !errors.Is(err, ErrFatal) {
		t.Fatalf("err = %v, want a *FatalError", err)
	}
	if len(fe.Hints()) < 2 || fe.Hints()[len(fe.Hints())-1] != hintOff {
		t.Errorf("hints %q: want remediation ending with %q", fe.Hints(), hintOff)
	}
	text := fe.Error() + "\n" + strings.Join(fe.Hints(), "\n")
	for _, w := range want {
		if !strings.Contains(text, w) {
			t.Errorf("error and hints\n%s\ndo not say %q", text, w)
		}
	}
	if !strings.HasPrefix(fe.Error(), "forwarding the SSH agent: ") {
		t.Errorf("error %q does not say what was being done", fe.Error())
	}
	unbranded(t, append(fe.Hints(), fe.Error())...)
	return fe
}

func TestModeFrom(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		env     map[string]string
		profile string
		want    Mode
		wantErr []string
	}{
		{name: "nothing set", want: Auto},
		{name: "profile", profile: "off", want: Off},
		{name: "profile upper case", profile: " On ", want: On},
		{name: "profile invalid", profile: "always", wantErr: []string{"profile", `"always"`, "on, off or auto"}},
		{name: "prefixed wins", env: map[string]string{EnvMode: "off", EnvModeShort: "on"}, profile: "on", want: Off},
		{name: "unprefixed", env: map[string]string{EnvModeShort: "on"}, profile: "off", want: On},
		{name: "unprefixed over profile", env: map[string]string{EnvModeShort: "auto"}, profile: "off", want: Auto},
		{name: "empty counts as unset", env: map[string]string{EnvMode: "", EnvModeShort: "off"}, want: Off},
		{name: "case", env: map[string]string{EnvMode: "OFF"}, want: Off},
		{name: "prefixed invalid", env: map[string]string{EnvMode: "yes", EnvModeShort: "on"}, wantErr: []string{EnvMode + `="yes"`, "on, off or auto"}},
		{name: "unprefixed invalid", env: map[string]string{EnvModeShort: "1"}, wantErr: []string{EnvModeShort + `="1"`, "on, off or auto"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := ModeFrom(tt.profile, func(k string) (string, bool) { v, ok := tt.env[k]; return v, ok })
			if tt.wantErr != nil {
				if err == nil {
					t.Fatalf("ModeFrom = %q, want an error", got)
				}
				for _, w := range tt.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not say %q", err, w)
					}
				}
				if strings.Contains(err.Error(), "SANDBOX_SSH_AGENT") && tt.name == "profile invalid" {
					t.Errorf("error %q names a variable that is not set", err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("ModeFrom = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

func TestModeFromProcessEnv(t *testing.T) {
	t.Setenv(EnvMode, "off")
	if m, err := ModeFrom("on", nil); m != Off || err != nil {
		t.Errorf("ModeFrom with nil getenv = %q, %v; want off from the process", m, err)
	}
}

// TestMatrix runs every mode on every platform and engine, with
// SSH_AUTH_SOCK set and unset, every check succeeding.
func TestMatrix(t *testing.T) {
	t.Parallel()
	for _, mode := range []Mode{Auto, On, Off, ""} {
		for _, goos := range []string{"linux", "darwin", "freebsd", "windows"} {
			for _, engine := range []string{Docker, Podman} {
				for _, sock := range []bool{true, false} {
					name := fmt.Sprintf("%s/%s/%s/sock=%v", mode, goos, engine, sock)
					t.Run(name, func(t *testing.T) {
						t.Parallel()
						r := &fakeRunner{}
						c := config(goos, engine, mode, r, newClock(true))
						if !sock {
							c.AuthSock = ""
						}
						res, err := Setup(context.Background(), c)
						if res.Cleanup == nil {
							t.Fatal("Cleanup is nil")
						}
						unbranded(t, res.Warnings...)
						effective := mode
						if effective == "" {
							effective = Auto
						}
						var want Result
						switch {
						case effective == Off:
						case !sock && effective == On:
							wantFatal(t, err, "SSH_AUTH_SOCK is not set", "ssh-add", "eval \"$(ssh-agent)\"")
						case !sock:
							want.Warnings = []string{"SSH_AUTH_SOCK is not set"}
						case goos == "linux":
							want = Result{Forward: true, Source: agent, Relabel: engine == Podman}
						case goos == "darwin" && engine == Docker:
							want = Result{Forward: true, Source: DockerDesktopSocket}
						case goos == "darwin":
							want = Result{Forward: true, Source: VMSocket("t1"), Relabel: true}
						default:
							want.Warnings = []string{"unavailable: not supported on " + goos}
						}
						if err != nil && !(effective == On && !sock) {
							t.Fatalf("Setup: %v", err)
						}
						if res.Forward != want.Forward || res.Source != want.Source || res.Relabel != want.Relabel {
							t.Errorf("Setup = forward %v source %q relabel %v; want %v %q %v",
								res.Forward, res.Source, res.Relabel, want.Forward, want.Source, want.Relabel)
						}
						if len(res.Warnings) != len(want.Warnings) {
							t.Fatalf("warnings %q, want %q", res.Warnings, want.Warnings)
						}
						for i, w := range want.Warnings {
							if !strings.Contains(res.Warnings[i], w) {
								t.Errorf("warning %q does not say %q", res.Warnings[i], w)
							}
						}
						ranCommands := len(r.lines()) > 0
						if wantCmds := want.Forward && goos == "darwin"; ranCommands != wantCmds {
							t.Errorf("commands run: %q", r.lines())
						}
						if err := res.Cleanup(); err != nil {
							t.Errorf("Cleanup: %v", err)
						}
						if goos == "darwin" && engine == Podman && want.Forward {
							if r.count("kill") != 1 || !strings.HasSuffix(r.lines()[len(r.lines())-1], "rm -f "+VMSocket("t1")) {
								t.Errorf("Cleanup did not kill the tunnel and then remove its socket: %q", r.lines())
							}
						}
					})
				}
			}
		}
	}
}

func TestSetupBadConfig(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"unknown mode", func(c *Config) { c.Mode = "sometimes" }, `unknown mode "sometimes"`},
		{"unknown engine", func(c *Config) { c.Engine = "lxc" }, `unknown engine "lxc"`},
		{"no docker desktop check", func(c *Config) { c.GOOS, c.DockerDesktop = "darwin", nil }, "Config.DockerDesktop"},
		{"no vm path check", func(c *Config) { c.GOOS, c.VMPathExists = "darwin", nil }, "Config.VMPathExists"},
		{"no id", func(c *Config) { c.GOOS, c.Engine, c.ID = "darwin", Podman, "" }, "Config.ID"},
		{"id with a slash", func(c *Config) { c.GOOS, c.Engine, c.ID = "darwin", Podman, "a/../b" }, "Config.ID"},
		{"id with a space", func(c *Config) { c.GOOS, c.Engine, c.ID = "darwin", Podman, "a b" }, "Config.ID"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := &fakeRunner{}
			c := config("linux", Docker, On, r, newClock(true))
			tt.edit(&c)
			res, err := Setup(context.Background(), c)
			if err == nil || !strings.Contains(err.Error(), tt.want) || errors.Is(err, ErrFatal) {
				t.Errorf("Setup: %v; want a plain error saying %q", err, tt.want)
			}
			if res.Forward || res.Cleanup == nil || len(r.lines()) > 0 {
				t.Errorf("Setup = %+v after running %q; want nothing done", res, r.lines())
			}
		})
	}
}

// TestAgentSocketUnusable: an SSH_AUTH_SOCK that is no absolute path to a
// socket warns under auto and stops the launch under on, before any command.
func TestAgentSocketUnusable(t *testing.T) {
	t.Parallel()
	for _, sock := range []struct{ name, path, want string }{
		{"relative", "agent.sock", "not an absolute path"},
		{"missing", "/tmp/gone.sock", "stat /tmp/gone.sock"},
		{"a directory", "/tmp/dir", "not a socket"},
	} {
		for _, platform := range []struct{ goos, engine string }{{"linux", Docker}, {"linux", Podman}, {"darwin", Podman}} {
			for _, mode := range []Mode{Auto, On} {
				t.Run(fmt.Sprintf("%s/%s/%s/%s", sock.name, platform.goos, platform.engine, mode), func(t *testing.T) {
					t.Parallel()
					r := &fakeRunner{}
					c := config(platform.goos, platform.engine, mode, r, newClock(true))
					c.AuthSock = sock.path
					c.Stat = fakeStat(map[string]fs.FileMode{"/tmp/dir": fs.ModeDir, agent: fs.ModeSocket})
					res, err := Setup(context.Background(), c)
					if mode == On {
						wantFatal(t, err, sock.want, "ssh-add -l")
					} else if err != nil || len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0], sock.want) {
						t.Errorf("Setup: %v, warnings %q; want one saying %q", err, res.Warnings, sock.want)
					}
					if res.Forward || len(r.lines()) > 0 {
						t.Errorf("forward %v after running %q", res.Forward, r.lines())
					}
				})
			}
		}
	}
}

func TestRealStatDefault(t *testing.T) {
	t.Parallel()
	// A regular file is no socket: the real os.Stat sees that.
	file := filepath.Join(t.TempDir(), "agent")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	res, err := Setup(context.Background(), Config{GOOS: "linux", Engine: Docker, AuthSock: file})
	if err != nil || res.Forward || len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0], "not a socket") {
		t.Errorf("Setup = %+v, %v; want a not-a-socket warning", res, err)
	}
}

// TestDockerDesktop: Docker on macOS forwards only Docker Desktop's socket
// and otherwise warns, under on as under auto.
func TestDockerDesktop(t *testing.T) {
	t.Parallel()
	boom := errors.New("engine unreachable")
	tests := []struct {
		name       string
		desktop    bool
		desktopErr error
		exists     bool
		existsErr  error
		warn       string
		askedPath  bool
	}{
		{name: "docker desktop with the socket", desktop: true, exists: true, askedPath: true},
		{name: "not docker desktop", warn: "not Docker Desktop"},
		{name: "docker desktop check fails", desktopErr: boom, warn: "checking for Docker Desktop: engine unreachable"},
		{name: "no socket in the vm", desktop: true, warn: "Docker Desktop has no " + DockerDesktopSocket, askedPath: true},
		{name: "socket check fails", desktop: true, existsErr: boom, warn: "checking for " + DockerDesktopSocket + " in Docker Desktop: engine unreachable", askedPath: true},
	}
	for _, tt := range tests {
		for _, mode := range []Mode{Auto, On} {
			t.Run(tt.name+"/"+string(mode), func(t *testing.T) {
				t.Parallel()
				asked := false
				c := config("darwin", Docker, mode, &fakeRunner{}, newClock(true))
				c.DockerDesktop = func(context.Context) (bool, error) { return tt.desktop, tt.desktopErr }
				c.VMPathExists = func(_ context.Context, p string) (bool, error) {
					asked = true
					if p != DockerDesktopSocket {
						t.Errorf("VMPathExists(%q)", p)
					}
					return tt.exists, tt.existsErr
				}
				res, err := Setup(context.Background(), c)
				if err != nil {
					t.Fatalf("Setup: %v", err)
				}
				if asked != tt.askedPath {
					t.Errorf("asked for the VM path: %v, want %v", asked, tt.askedPath)
				}
				if tt.warn == "" {
					if !res.Forward || res.Source != DockerDesktopSocket || res.Relabel || len(res.Warnings) > 0 {
						t.Errorf("Setup = %+v, want %s forwarded", res, DockerDesktopSocket)
					}
					return
				}
				if res.Forward || len(res.Warnings) != 1 ||
					!strings.HasPrefix(res.Warnings[0], "SSH agent forwarding unavailable: ") || !strings.Contains(res.Warnings[0], tt.warn) {
					t.Errorf("Setup = %+v; want no forwarding and a warning saying %q", res, tt.warn)
				}
			})
		}
	}
}

// TestNoRealWaits: the longest waits (a 10s poll timeout at the defaults)
// pass on the fake clock, not the wall clock, and only SystemClock waits.
func TestNoRealWaits(t *testing.T) {
	t.Parallel()
	start := time.Now()
	clk := newClock(true)
	r := &fakeRunner{probes: []bool{false}}
	c := config("darwin", Podman, Auto, r, clk)
	_, err := Setup(context.Background(), c)
	wantFatal(t, err, "did not appear")
	if waited := clk.Now().Sub(epoch); waited < DefaultPollTimeout {
		t.Errorf("fake time passed %s, want the %s poll timeout", waited, DefaultPollTimeout)
	}
	if real := time.Since(start); real > 2*time.Second {
		t.Errorf("a %s virtual wait took %s of real time", DefaultPollTimeout, real)
	}

	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	waits := regexp.MustCompile(`time\.(Sleep|After|AfterFunc|NewTimer|NewTicker|Tick)\(`)
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(src), "\n") {
			if waits.MatchString(line) && !strings.HasPrefix(line, "func (SystemClock) ") {
				t.Errorf("%s waits on the real clock: %s", f, strings.TrimSpace(line))
			}
		}
	}
}

func TestRealImplementations(t *testing.T) {
	t.Parallel()
	var _ Runner = ExecRunner{}
	var _ Clock = SystemClock{}
	if now := (SystemClock{}).Now(); now.IsZero() {
		t.Error("SystemClock.Now is zero")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := (ExecRunner{}).Start(ctx, "ssh"); err == nil {
		t.Error("ExecRunner.Start with a done ctx started something")
	}
	var tl tail
	big := strings.Repeat("x", tailMax) + "end"
	tl.Write([]byte(big))
	if s := tl.String(); len(s) != tailMax || !strings.HasSuffix(s, "end") {
		t.Errorf("tail kept %d bytes ending %q", len(s), s[len(s)-3:])
	}
	err := commandError("ssh", errors.New("exit status 255"), &tl)
	if !strings.HasPrefix(err.Error(), "ssh: exit status 255: x") {
		t.Errorf("commandError = %q", err)
	}
	if !slices.Contains([]string{"ssh: boom"}, commandError("ssh", errors.New("boom"), &tail{}).Error()) {
		t.Error("commandError without stderr")
	}
}

// TestRemoteEngine: an engine on another machine gets no agent: on is
// fatal, saying why; auto warns when there is an agent to forward; nothing
// runs either way.
func TestRemoteEngine(t *testing.T) {
	t.Parallel()
	const why = "the engine at ssh://far.test is reached over the network"
	for _, tc := range []struct {
		mode     Mode
		sock     string
		warnings int
	}{{On, agent, 0}, {Auto, agent, 1}, {Auto, "", 0}} {
		t.Run(fmt.Sprintf("%s/%q", tc.mode, tc.sock), func(t *testing.T) {
			t.Parallel()
			r := &fakeRunner{}
			c := config("linux", Docker, tc.mode, r, newClock(true))
			c.AuthSock, c.Remote = tc.sock, why
			c.Stat = fakeStat(map[string]fs.FileMode{agent: fs.ModeSocket})
			res, err := Setup(context.Background(), c)
			if tc.mode == On {
				wantFatal(t, err, why+": the agent's socket cannot be mounted into a sandbox on another machine", "engine on this host")
			} else if err != nil || len(res.Warnings) != tc.warnings || tc.warnings > 0 && !strings.Contains(res.Warnings[0], why) {
				t.Errorf("Setup: %v, warnings %q; want %d saying %q", err, res.Warnings, tc.warnings, why)
			}
			if res.Forward || len(r.lines()) > 0 {
				t.Errorf("forward %v after running %q", res.Forward, r.lines())
			}
		})
	}
}
