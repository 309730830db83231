// Package sshagent decides whether a sandbox gets the user's SSH agent and
// sets up what forwarding it needs on each platform and engine:
//
//   - Linux, Docker: the host's SSH_AUTH_SOCK is bind-mounted as it is.
//   - Linux, Podman: the same, relabelled for SELinux (:z).
//   - macOS, Docker Desktop: the VM's /run/host-services/ssh-auth.sock.
//   - macOS, Podman: an ssh reverse tunnel from SSH_AUTH_SOCK to a socket
//     inside the podman machine's VM, removed again by Result.Cleanup.
//
// The launcher calls Setup before it creates the container, mounts
// Result.Source at Target and sets SSH_AUTH_SOCK=/ssh-agent inside.
//
// The package never talks to a container engine (the caller answers the two
// questions it has about one: Config.DockerDesktop and Config.VMPathExists)
// and never prints: warnings come back in Result.Warnings and errors that must
// stop the launch as *FatalError, with remediation, for the CLI to print. It
// runs host commands (podman, ssh) only through Config.Run and waits only on
// Config.Clock, so that every branch can be tested without a VM or real time.
package sshagent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strconv"
	"strings"
	"time"
)

// Target is where the agent socket is mounted in the container; the
// container's SSH_AUTH_SOCK is set to it.
const Target = "/ssh-agent"

// DockerDesktopSocket is Docker Desktop's agent socket inside its VM.
const DockerDesktopSocket = "/run/host-services/ssh-auth.sock"

// The variables that choose the Mode, the first set one winning.
const (
	EnvMode      = "PROPIO_SANDBOX_SSH_AGENT"
	EnvModeShort = "SANDBOX_SSH_AGENT"
)

// Engines Setup knows.
const (
	Docker = "docker"
	Podman = "podman"
)

// Defaults for the zero Config durations.
const (
	DefaultPollTimeout    = 10 * time.Second
	DefaultPollInterval   = 100 * time.Millisecond
	DefaultCleanupTimeout = 5 * time.Second
)

// Mode says whether to forward the agent.
type Mode string

const (
	// Auto forwards when SSH_AUTH_SOCK is set and warns when it is not. The
	// zero Mode means Auto.
	Auto Mode = "auto"
	// On forwards; an unset or unusable SSH_AUTH_SOCK is a *FatalError.
	On Mode = "on"
	// Off never forwards and never warns.
	Off Mode = "off"
)

// ModeFrom returns the mode: $PROPIO_SANDBOX_SSH_AGENT, else
// $SANDBOX_SSH_AGENT, else the profile's value, else Auto. A variable set to
// the empty string counts as unset. Values are on, off or auto in any case;
// anything else is an error naming where it came from. getenv is
// os.LookupEnv when nil.
func ModeFrom(profile string, getenv func(string) (string, bool)) (Mode, error) {
	if getenv == nil {
		getenv = os.LookupEnv
	}
	for _, name := range []string{EnvMode, EnvModeShort} {
		if v, ok := getenv(name); ok && strings.TrimSpace(v) != "" {
			return parseMode(name+"="+strconv.Quote(v), v)
		}
	}
	if strings.TrimSpace(profile) == "" {
		return Auto, nil
	}
	return parseMode("the profile's SSH agent mode "+strconv.Quote(profile), profile)
}

// parseMode reads v; what names v and where it came from in errors.
func parseMode(what, v string) (Mode, error) {
	switch m := Mode(strings.ToLower(strings.TrimSpace(v))); m {
	case Auto, On, Off:
		return m, nil
	}
	return "", fmt.Errorf("%s: want on, off or auto", what)
}

// ErrFatal matches every *FatalError with errors.Is.
var ErrFatal = errors.New("SSH agent forwarding failed")

// FatalError is a failure that must stop the launch: the container is not to
// be created. Remediation holds what the user can do about it, one hint a line.
type FatalError struct {
	Msg         string
	Remediation []string
	Err         error // the cause, if any
}

func (e *FatalError) Error() string {
	if e.Err != nil {
		return e.Msg + ": " + e.Err.Error()
	}
	return e.Msg
}

func (e *FatalError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrFatal) true.
func (e *FatalError) Is(target error) bool { return target == ErrFatal }

// Hints returns Remediation.
func (e *FatalError) Hints() []string { return e.Remediation }

// hintOff is the way out every fatal error offers.
const hintOff = "or launch without the agent: " + EnvMode + "=off"

func fatal(err error, msg string, hints ...string) *FatalError {
	return &FatalError{Msg: "forwarding the SSH agent: " + msg, Remediation: append(hints, hintOff), Err: err}
}

// Config is what Setup needs to know about the launch. Zero durations take
// the defaults; a nil Run, Clock or Stat the real ones (ExecRunner,
// SystemClock, os.Stat).
type Config struct {
	Mode     Mode
	GOOS     string // runtime.GOOS of the launcher
	Engine   string // Docker or Podman
	AuthSock string // the launcher's SSH_AUTH_SOCK; "" when unset
	// Remote, when set, says why the engine is on another machine: the
	// agent's socket cannot be mounted there, so On is refused and Auto
	// forwards nothing, saying so.
	Remote string

	// DockerDesktop says whether the engine is Docker Desktop (its info's
	// OperatingSystem or Name). Required for Docker on macOS.
	DockerDesktop func(ctx context.Context) (bool, error)
	// VMPathExists says whether path exists inside the engine's VM (say, by
	// creating a container that bind-mounts it). Required for Docker on macOS.
	VMPathExists func(ctx context.Context, path string) (bool, error)

	Run   Runner
	Clock Clock
	Stat  func(name string) (fs.FileInfo, error)

	PollTimeout    time.Duration // how long the tunnel's socket may take to appear
	PollInterval   time.Duration // how often to look for it
	CleanupTimeout time.Duration // bound on removing the socket in Cleanup

	// ID is unique to this launch; it names the socket in the podman machine,
	// so it may hold only letters, digits, '.', '_' and '-'. Required for
	// Podman on macOS.
	ID string
}

func (c Config) withDefaults() Config {
	if c.Mode == "" {
		c.Mode = Auto
	}
	if c.Run == nil {
		c.Run = ExecRunner{}
	}
	if c.Clock == nil {
		c.Clock = SystemClock{}
	}
	if c.Stat == nil {
		c.Stat = os.Stat
	}
	if c.PollTimeout <= 0 {
		c.PollTimeout = DefaultPollTimeout
	}
	if c.PollInterval <= 0 {
		c.PollInterval = DefaultPollInterval
	}
	if c.CleanupTimeout <= 0 {
		c.CleanupTimeout = DefaultCleanupTimeout
	}
	return c
}

// Result is what the launcher does with the agent.
type Result struct {
	// Forward is whether to mount Source at Target and set
	// SSH_AUTH_SOCK=/ssh-agent in the container.
	Forward bool
	// Source is the socket to bind-mount: a host path on Linux, a path
	// inside the engine's VM on macOS.
	Source string
	// Relabel asks for the :z mount option (Podman: SELinux).
	Relabel bool
	// Warnings are for the launcher to print; the launch goes on.
	Warnings []string
	// Cleanup undoes what Setup set up (on macOS with Podman: kills the
	// tunnel, then removes its socket in the VM). It is never nil, runs its
	// work exactly once however many goroutines call it however often (every
	// call waits for that one run and returns its error), takes at most about
	// CleanupTimeout, and its error is only to be reported: there is nothing
	// left to retry.
	Cleanup func() error
}

func noCleanup() error { return nil }

// Setup decides whether to forward the agent and sets up the forwarding.
//
// Under Off it does nothing. Under Auto an unset SSH_AUTH_SOCK, or one that
// is not an absolute path to a socket, is a warning and no forwarding; under
// On it is a *FatalError. Docker on macOS without Docker Desktop or without
// its agent socket is a warning and no forwarding under On too, as it is
// under Auto: no other Docker on macOS can forward the agent, and failing
// would not help. So is any platform but Linux and macOS. On macOS with
// Podman, every failure to set up the tunnel is a *FatalError, under Auto as
// under On, and leaves nothing running.
//
// ctx bounds the commands Setup runs (podman, ssh) but not the tunnel it
// leaves running, which lives until Result.Cleanup.
func Setup(ctx context.Context, c Config) (Result, error) {
	c = c.withDefaults()
	res := Result{Cleanup: noCleanup}
	switch c.Mode {
	case Off:
		return res, nil
	case Auto, On:
	default:
		return res, fmt.Errorf("forwarding the SSH agent: unknown mode %q", c.Mode)
	}
	if c.Engine != Docker && c.Engine != Podman {
		return res, fmt.Errorf("forwarding the SSH agent: unknown engine %q", c.Engine)
	}
	if c.Remote != "" {
		problem := c.Remote + ": the agent's socket cannot be mounted into a sandbox on another machine (forwarding over the engine's connection is not done)"
		if c.Mode == On {
			return res, fatal(nil, problem, "run it with an engine on this host")
		}
		if c.AuthSock != "" {
			res.Warnings = append(res.Warnings, "SSH agent forwarding skipped: "+problem)
		}
		return res, nil
	}
	if c.AuthSock == "" {
		if c.Mode == On {
			return res, fatal(nil, "SSH_AUTH_SOCK is not set and forwarding is on",
				"start an agent and add your key: `eval \"$(ssh-agent)\"` then `ssh-add`")
		}
		res.Warnings = append(res.Warnings, "SSH agent forwarding skipped: SSH_AUTH_SOCK is not set "+
			"(start an agent with `eval \"$(ssh-agent)\"` and `ssh-add`, or set "+EnvMode+"=off to silence this)")
		return res, nil
	}
	switch {
	case c.GOOS == "darwin" && c.Engine == Docker:
		return dockerDesktop(ctx, c, res)
	case c.GOOS == "linux", c.GOOS == "darwin":
		if problem := c.agentProblem(); problem != "" {
			if c.Mode == On {
				return res, fatal(nil, problem,
					"check that SSH_AUTH_SOCK names a running agent's socket: `ssh-add -l`")
			}
			res.Warnings = append(res.Warnings, "SSH agent forwarding skipped: "+problem)
			return res, nil
		}
		if c.GOOS == "darwin" {
			return podmanMachine(ctx, c, res)
		}
		res.Forward, res.Source, res.Relabel = true, c.AuthSock, c.Engine == Podman
		return res, nil
	default:
		res.Warnings = append(res.Warnings, fmt.Sprintf("SSH agent forwarding unavailable: not supported on %s", c.GOOS))
		return res, nil
	}
}

// agentProblem says what makes c.AuthSock unusable as a bind-mount source,
// or "". (A missing source could otherwise be created as a directory.)
func (c Config) agentProblem() string {
	if !path.IsAbs(c.AuthSock) {
		return fmt.Sprintf("SSH_AUTH_SOCK=%q is not an absolute path", c.AuthSock)
	}
	fi, err := c.Stat(c.AuthSock)
	if err != nil {
		return "SSH_AUTH_SOCK: " + err.Error()
	}
	if fi.Mode().Type() != fs.ModeSocket {
		return fmt.Sprintf("SSH_AUTH_SOCK=%s is not a socket", c.AuthSock)
	}
	return ""
}

// dockerDesktop forwards Docker Desktop's own agent socket, when there is one.
func dockerDesktop(ctx context.Context, c Config, res Result) (Result, error) {
	if c.DockerDesktop == nil || c.VMPathExists == nil {
		return res, errors.New("forwarding the SSH agent: Config.DockerDesktop and Config.VMPathExists are required for Docker on macOS")
	}
	const prefix = "SSH agent forwarding unavailable: "
	ok, err := c.DockerDesktop(ctx)
	switch {
	case err != nil:
		res.Warnings = append(res.Warnings, prefix+"checking for Docker Desktop: "+err.Error())
		return res, nil
	case !ok:
		res.Warnings = append(res.Warnings, prefix+"the engine is not Docker Desktop, the only Docker on macOS that forwards the agent")
		return res, nil
	}
	ok, err = c.VMPathExists(ctx, DockerDesktopSocket)
	switch {
	case err != nil:
		res.Warnings = append(res.Warnings, prefix+"checking for "+DockerDesktopSocket+" in Docker Desktop: "+err.Error())
		return res, nil
	case !ok:
		res.Warnings = append(res.Warnings, prefix+"Docker Desktop has no "+DockerDesktopSocket)
		return res, nil
	}
	res.Forward, res.Source = true, DockerDesktopSocket
	return res, nil
}
