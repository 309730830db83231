package cli

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/propio/propio-sandbox/internal/hostinfo"
	"github.com/propio/propio-sandbox/internal/preflight"
	"github.com/propio/propio-sandbox/internal/profile"
	"github.com/propio/propio-sandbox/internal/sandbox"
	"github.com/propio/propio-sandbox/internal/sshagent"
	"github.com/propio/propio-sandbox/internal/termsafe"
)

// reporter says what a launch tells the user, on stderr.
type reporter struct{ w io.Writer }

// Warn and Note print msg inert: it may name what the sandbox made.
func (r reporter) Warn(msg string) { fmt.Fprintf(r.w, "%s: warning: %s\n", name, termsafe.Inert(msg)) }
func (r reporter) Note(msg string) { fmt.Fprintf(r.w, "%s: %s\n", name, termsafe.Inert(msg)) }
func (r reporter) Failed(err error) {
	report(r.w, hintError(err, nil, ""))
}

// Guarded says what the guard did, one warning a path.
func (r reporter) Guarded(items []string, quarantine string) {
	fmt.Fprintf(r.w, "%s: warning: the sandbox left what git (or the host) would run; so that nothing runs it:\n", name)
	for _, it := range items {
		fmt.Fprintf(r.w, "%s: warning:   %s\n", name, termsafe.Inert(it))
	}
	fmt.Fprintf(r.w, "%s: hint: what was put aside is kept in %s, never run; look at it before you put anything back\n", name, termsafe.Inert(quarantine))
}

// hintError adds what to do about the errors of a launch and of the
// engine; p and ref are the profile, when there is one, and how the user
// named it.
func hintError(err error, p *profile.Profile, ref string) error {
	var (
		pf    *preflight.Failure
		guard *sandbox.GuardError
		mode  *sandbox.SSHModeError
		fatal *sshagent.FatalError
		mnts  *hostinfo.MountsError
		grant *sandbox.GrantsError
		gfile *sandbox.GrantsFileError
		sec   *sandbox.SecretError
	)
	switch {
	case err == nil:
		return nil
	case errors.As(err, &pf):
		return withCode{withHint(err, pf.Hints...), ExitPreflight}
	case errors.As(err, &guard):
		return withHint(err, "do not run git in "+guard.Where+" before you have looked at what the errors name")
	case errors.Is(err, sandbox.ErrGatewayBinary):
		return withHint(err, "build propio-sandbox for Linux (GOOS=linux CGO_ENABLED=0 go build ./cmd/propio-sandbox) and name it in "+sandbox.EnvGatewayBinary)
	case errors.Is(err, sandbox.ErrAllowlistOnPodman):
		return withHint(err, "upgrade Podman, or use Docker (--engine docker) for this profile, or a profile without an allowlist on this Podman (-p open, or -p offline)")
	case errors.As(err, &mode):
		return withHint(err, "set "+sshagent.EnvMode+" to auto, on or off")
	case errors.As(err, &fatal):
		return withHint(err, fatal.Hints()...)
	case errors.As(err, &mnts):
		return withHint(err, "write "+mnts.Var+" as SRC:DST[:ro|rw],... with absolute paths and existing sources, or unset it")
	case errors.As(err, &grant):
		return fmt.Errorf("loading %s, with the engine's socket at %s: %w", loading(ref), grant.Socket, grant.Err)
	case errors.As(err, &sec):
		return withHint(err, "make its source give the value, or drop the secret in a profile of your own: secrets: {"+sec.Name+": null}")
	case errors.As(err, &gfile):
		return withHint(err, "fix the line it names, or remove the file to drop every grant of this workspace (`"+name+" grants` lists them once it reads)")
	}
	return engineHint(err, p, ref)
}

// engineHint adds what to do about the engine's errors.
func engineHint(err error, p *profile.Profile, ref string) error {
	var ee *sandbox.EngineError
	if errors.As(err, &ee) && ee.Kind == sandbox.Kubernetes && !errors.Is(err, sandbox.ErrNotOnCluster) {
		return withHint(err, "name the cluster's kubeconfig with KUBECONFIG (default ~/.kube/config) and its context with --kube-context; its user needs a client certificate or a token")
	}
	if errors.As(err, &ee) && ee.Kind == sandbox.Podman {
		switch {
		case errors.Is(err, sandbox.ErrEngineMissing):
			return withHint(fmt.Errorf("Podman is required: %w", err), "install Podman (on Debian or Ubuntu: sudo apt-get install podman), or choose another engine with --engine")
		case errors.Is(err, sandbox.ErrEngineNotRunning):
			return withHint(err, "start Podman's API service (podman system service --time=0 &), or on macOS the machine (podman machine start), then try again")
		}
	}
	switch {
	case errors.Is(err, sandbox.ErrEngineMissing):
		return withHint(fmt.Errorf("Docker is required: %w", err),
			"install Docker Engine (on Debian or Ubuntu: sudo apt-get install docker.io), or set DOCKER_HOST to a running engine")
	case errors.Is(err, sandbox.ErrEngineNotRunning):
		return withHint(err, "start the Docker daemon (sudo systemctl start docker, or open Docker Desktop), then try again")
	case errors.Is(err, sandbox.ErrPermission):
		return withHint(err, "add your user to the docker group (sudo usermod -aG docker $USER), then log out and back in")
	case errors.Is(err, sandbox.ErrEngineTooOld):
		return withHint(err, "upgrade Docker Engine to 20.10 or newer")
	case errors.Is(err, sandbox.ErrImageMissing) && p != nil:
		pflag := ""
		if ref != "" {
			pflag = " -p " + ref
		}
		if p.Build != nil {
			return withHint(err, "build it: "+name+" build"+pflag+" (or run with --build)")
		}
		return withHint(err, "build or pull it yourself (docker pull "+p.Image+"); "+name+" never pulls images on its own")
	}
	return err
}

// diskCapped says which cap the sandbox went over, where, and where what
// it wrote is. err may join other failures to the stop (a copy back that
// failed).
func diskCapped(err error, over *sandbox.DiskCapError, p *profile.Profile) error {
	capName := fmt.Sprintf("resources.disk (%s)", profile.ByteSize(over.Cap))
	if over.Cap < int64(p.Resources.Disk) {
		capName = fmt.Sprintf("%s (%s)", hostinfo.EnvTestDisk, profile.ByteSize(over.Cap))
	}
	msg := fmt.Sprintf("the sandbox wrote more than %s to %s; stopped", capName, over.Where)
	var rest []string
	for _, line := range strings.Split(err.Error(), "\n") {
		if line != over.Error() {
			rest = append(rest, line)
		}
	}
	if len(rest) > 0 {
		msg += "\n" + strings.Join(rest, "\n")
	}
	var hints []string
	switch {
	case over.Where == sandbox.PlaceWritableLayer || over.Where == sandbox.PlaceImageVolumes:
		hints = append(hints, "what it wrote outside the workspace, /tmp and HOME is gone with its container: have the agent write its work to the workspace")
	case p.Changeset():
		hints = append(hints, "what it wrote before it was stopped is in its changeset, above: review it with "+name+" diff")
	default:
		hints = append(hints, "what it wrote before it was stopped is still there: look at it (git status) before you run it again")
	}
	hints = append(hints, fmt.Sprintf("if the task needs more room, raise resources.disk in %s (at most %s)", p.Meta.File, profile.ByteSize(profile.MaxDisk)))
	return withHint(errors.New(msg), hints...)
}
