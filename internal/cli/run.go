package cli

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/compose-spec/compose-go/v2/types"

	"github.com/moby/term"
	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/changeset/launch"
	"github.com/propio/propio-sandbox/internal/engine"
	"github.com/propio/propio-sandbox/internal/fsutil"
	"github.com/propio/propio-sandbox/internal/gatewayimage"
	"github.com/propio/propio-sandbox/internal/hostinfo"
	"github.com/propio/propio-sandbox/internal/preflight"
	"github.com/propio/propio-sandbox/internal/profile"
	"github.com/propio/propio-sandbox/internal/sshagent"
	"github.com/spf13/cobra"
)

// runFlags are the flags of run, which the root command shares (run is the default).
type runFlags struct {
	build     bool
	skip      []string
	changeset bool
	resume    string
}

func (f *runFlags) register(cmd *cobra.Command) {
	cmd.Flags().BoolVar(&f.build, "build", false, "build the profile's image first (when it has a build section)")
	cmd.Flags().StringArrayVar(&f.skip, "skip-checks", nil, "skip the profile's declared check `NAME` for this run (never a built-in one)")
	cmd.Flags().BoolVar(&f.changeset, "changeset", false, "write to a changeset instead of the workspace (workspace.mode changeset): review it with diff, then apply or discard it")
	cmd.Flags().StringVar(&f.resume, "resume", "", "with --changeset: continue the changeset `ID` (or a unique prefix) instead of starting one")
}

func newRun(a *app) *cobra.Command {
	var f runFlags
	cmd := &cobra.Command{
		Use:   "run [-p PROFILE] [--build] [--changeset [--resume ID]] [-- CMD...]",
		Short: "Run the profile's command, or CMD, in a sandbox of the current directory (the default)",
		Long: `Run the profile's command, or CMD, in a sandbox: the current directory is mounted at
/workspace and is the working directory; nothing else of the host is visible unless the
profile grants it. The sandbox's exit code becomes this command's. Every container,
network and volume of the sandbox is removed when it ends, however it ends.

With --changeset (or workspace.mode: changeset in the profile), the sandbox writes to
a changeset instead: the workspace stays as it is, and run prints the changeset's id;
review it with diff, then apply or discard it. --resume ID continues one.
PROPIO_SANDBOX_CHANGESET_MODE=overlay|copy|auto chooses how it is made.`,
		RunE: func(cmd *cobra.Command, args []string) error { return a.run(cmd, args, f) },
	}
	f.register(cmd)
	return cmd
}

// exitCode ends the process with a code and prints nothing more, as when
// the sandbox's command exits non-zero.
type exitCode int

func (c exitCode) Error() string { return fmt.Sprintf("exit status %d", int(c)) }

// withCode is an error that also sets the exit code.
type withCode struct {
	err  error
	code int
}

func (e withCode) Error() string { return e.err.Error() }
func (e withCode) Unwrap() error { return e.err }

func (a *app) run(cmd *cobra.Command, args []string, f runFlags) error {
	command, err := commandAfterDash(cmd, args)
	if err != nil {
		return err
	}
	if f.resume != "" && !f.changeset {
		return usageError{errors.New("--resume continues a changeset: give --changeset too")}
	}
	e, p, err := loadSelected(a.profile)
	if err != nil {
		return err
	}
	a.warnGrants(e.grants)
	if f.changeset {
		if err := p.ForceChangeset(); err != nil {
			return fmt.Errorf("--changeset: %w", err)
		}
	}
	if err := checkSkips(p, f.skip); err != nil {
		return err
	}
	if p.Changeset() {
		if _, err := launch.Wanted(); err != nil {
			return usageError{err}
		}
	}
	// Nothing is created before every check has passed.
	ctx := context.Background()
	var conn engineConn
	defer conn.close()
	if err := preflight.Run(ctx, a.preflightChecks(e, p, f.build, &conn, false)); err != nil {
		return preflightFailed(err)
	}
	if err := a.checkLaunchGrants(e, p, conn.host); err != nil {
		return err
	}
	var timeout time.Duration
	if p.Resources.Timeout != "" {
		timeout, _ = time.ParseDuration(p.Resources.Timeout) // Check has parsed it
	}
	o := generator.Options{Project: generator.ProjectName(e.workspace, runID()), Command: command}
	allowlist := p.Network.Mode == "allowlist"
	if allowlist {
		if err := gatewayOptions(&o, e.dirs); err != nil {
			return withHint(err, "build propio-sandbox for Linux (GOOS=linux CGO_ENABLED=0 go build ./cmd/propio-sandbox) and name it in "+envGatewayBinary)
		}
	}
	gen, plan, err := e.generate(p, a.stderr)
	if err != nil {
		return err
	}
	project, err := gen(o)
	if err != nil {
		return err
	}

	return func(ctx context.Context, eng *engine.Engine) (err error) {
		// Leftovers of launchers that were killed before they could clean
		// up, removed while this sandbox starts (gc touches only sandboxes
		// whose launcher is gone, never this one); reported at the end.
		gcDone := make(chan struct{})
		var removed []string
		var gcErr error
		go func() {
			defer close(gcDone)
			removed, gcErr = eng.GC(ctx)
		}()
		defer func() {
			<-gcDone
			if gcErr != nil {
				fmt.Fprintf(a.stderr, "%s: warning: removing leftovers of earlier sandboxes: %v\n", name, gcErr)
			} else if len(removed) > 0 {
				fmt.Fprintf(a.stderr, "%s: removed %d leftover sandbox(es) of launchers that are gone: %s\n", name, len(removed), strings.Join(removed, ", "))
			}
			// What those sandboxes left, judged now that they are gone.
			if err := a.checkPending(ctx, eng, e.dirs); err != nil {
				fmt.Fprintf(a.stderr, "%s: warning: %v\n", name, err)
			}
		}()
		if allowlist && eng.Kind == engine.Podman {
			return withHint(errors.New("network.mode allowlist does not run on Podman yet: Podman gives the host an address on the sandbox's internal network (it ignores com.docker.network.bridge.inhibit_ipv4 and serves DNS there), through which the sandbox would reach services of the host and resolve any name"),
				"use Docker for this profile (--engine docker), or a profile without an allowlist on Podman (-p open, or -p offline)")
		}
		// The SSH agent, when the profile or the environment asks for it:
		// set up before anything is created, torn down after everything is
		// removed.
		agent, err := a.forwardSSHAgent(ctx, eng, p, o.Project)
		if err != nil {
			return err
		}
		defer func() {
			if err := agent.Cleanup(); err != nil {
				fmt.Fprintf(a.stderr, "%s: warning: %v\n", name, err)
			}
		}()
		// What the launch found out: the agent, and a rootless Podman.
		withAgent := func(h *generator.Host) {
			if agent.Forward {
				h.SSHAgent = generator.SSHAgent{Source: agent.Source, Relabel: agent.Relabel}
			}
			h.Podman = eng.Kind == engine.Podman
			h.KeepID = h.Podman && eng.Rootless
		}
		// From here the sandbox may write: what it leaves that git (or the
		// host) would run is judged once it has gone, however the run ends
		// (gc does it for a launcher that is killed).
		if err := plan.Prepare(e.dirs.GuardDir(), o.Project, time.Now()); err != nil {
			return err
		}
		check := newGuardCheck(*plan, e.dirs)
		defer func() {
			gerr := a.finishGuard(check)
			switch {
			case gerr == nil:
			case err == nil:
				err = gerr
			default:
				// The run's own error (or the sandbox's exit code) stays
				// the launcher's; this one is said all the same.
				report(a.stderr, gerr)
			}
		}()
		// The profile's own checks, each in a throwaway sandbox of it (where
		// directories in changeset mode are read-only).
		if err := preflight.Run(ctx, a.declaredChecks(eng, e, p, o, gen, withAgent, f.skip)); err != nil {
			return preflightFailed(err)
		}
		// The changeset the sandbox writes to, when the profile has one:
		// kept only when the sandbox ran.
		var cs *launch.Changeset
		if p.Changeset() {
			if f.resume != "" {
				// Resuming removes the sandbox of a killed launcher that
				// still writes to the changeset, as gc does: not both at once.
				<-gcDone
			}
			if cs, err = launch.Prepare(ctx, changesetEngine{eng}, p, e.workspace, f.resume, a.stderr); err != nil {
				return err
			}
			agentOnly := withAgent
			withAgent = func(h *generator.Host) { agentOnly(h); cs.Adjust(h) }
		}
		ran := false
		defer func() {
			if ran || cs == nil {
				return
			}
			// An error after the sandbox had started: what it wrote is kept.
			if cs.Wrote() {
				if err := cs.Finish(a.stderr, false); err != nil {
					fmt.Fprintf(a.stderr, "%s: warning: %v\n", name, err)
				}
				return
			}
			if err := cs.Abandon(); err != nil {
				fmt.Fprintf(a.stderr, "%s: warning: removing the changeset of a sandbox that did not run: %v\n", name, err)
			}
		}()
		var code int
		for attempt := 1; ; attempt++ {
			if allowlist {
				if project, err = a.prepareGateway(ctx, eng, e, p, o, gen, withAgent); err != nil {
					return err
				}
			} else if agent.Forward || eng.Kind == engine.Podman || cs != nil {
				if project, err = gen(o, withAgent); err != nil {
					return err
				}
			}
			code, err = eng.Run(ctx, project, engine.RunOptions{
				TTY:         isTerminal(a.stdin) && isTerminal(a.stdout),
				Interactive: true,
				Timeout:     timeout,
				Build:       f.build,
				// The image check of preflight has just looked.
				ImageChecked: true,
				Copies:       engineCopies(cs.VolumeCopies()),
				Ran: func() {
					ran = true
					check.begin() // while the engine removes the containers
				},
			})
			// Another launcher took the same network at the same moment:
			// number it again and retry.
			if !allowlist || !errors.Is(err, engine.ErrSubnetTaken) || attempt == 3 {
				break
			}
			os.Remove(filepath.Join(e.dirs.LogDir(), generator.LogFile(o.Project)))
			o.Project = generator.ProjectName(e.workspace, runID())
		}
		if ran && cs != nil {
			if serr := cs.Finish(a.stderr, errors.Is(err, engine.ErrCopyOut)); serr != nil {
				err = errors.Join(err, serr)
			}
		}
		var over *engine.DiskCapError
		switch {
		case errors.As(err, &over):
			return withCode{diskCapped(err, over, p, cs), code}
		case err != nil && code != 0:
			return withCode{engineHint(err, p, a.profile), code}
		case err != nil:
			return engineHint(err, p, a.profile)
		case code != 0:
			return exitCode(code)
		}
		return nil
	}(ctx, conn.eng)
}

// checkLaunchGrants judges the profile's mounts again with the socket the
// engine was found at (engineHost), when it is not one of the known paths
// (a Podman service started for the launch), and warns about the mounts
// PROPIO_SANDBOX_MOUNTS adds that undo the sandbox: the user's own choice
// for the launch, shown, not refused.
func (a *app) checkLaunchGrants(e env, p *profile.Profile, engineHost string) error {
	host := e.grantHost()
	if sock, ok := strings.CutPrefix(engineHost, "unix://"); ok && !slices.Contains(host.Sockets, filepath.Clean(sock)) {
		host = e.grantHost(filepath.Clean(sock))
		granted, err := p.Grants(host)
		if err != nil {
			return fmt.Errorf("loading %s, with the engine's socket at %s: %w", loading(a.profile), sock, err)
		}
		var shown []string
		for _, g := range e.grants {
			shown = append(shown, g.String())
		}
		for _, g := range granted {
			if !slices.Contains(shown, g.String()) {
				a.warnGrants([]profile.Grant{g})
			}
		}
	}
	extra, _ := hostinfo.ExtraMounts(os.LookupEnv) // a bad one is refused with the project
	for _, m := range extra {
		for _, d := range host.Dangers(m.Source) {
			fmt.Fprintf(a.stderr, "%s: warning: unsafe grant %s: %s mounts %s at %s: %s\n", name, d.Name, hostinfo.EnvMounts, m.Source, m.Target, d.What)
		}
	}
	return nil
}

// diskCapped says which cap the sandbox went over, where, and where what
// it wrote is. err may join other failures to the stop (a copy back that
// failed).
func diskCapped(err error, over *engine.DiskCapError, p *profile.Profile, cs *launch.Changeset) error {
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
	case over.Where == engine.PlaceWritableLayer || over.Where == engine.PlaceImageVolumes:
		hints = append(hints, "what it wrote outside the workspace, /tmp and HOME is gone with its container: have the agent write its work to the workspace")
	case cs != nil:
		hints = append(hints, "what it wrote before it was stopped is in its changeset, above: review it with "+name+" diff")
	default:
		hints = append(hints, "what it wrote before it was stopped is still there: look at it (git status) before you run it again")
	}
	hints = append(hints, fmt.Sprintf("if the task needs more room, raise resources.disk in %s (at most %s)", p.Meta.File, profile.ByteSize(profile.MaxDisk)))
	return withHint(errors.New(msg), hints...)
}

// prepareGateway numbers the sandbox network apart from the engine's,
// generates the project, makes sure the gateway's image exists (building it
// from this executable when it does not) and starts the decision log.
func (a *app) prepareGateway(ctx context.Context, eng *engine.Engine, e env, p *profile.Profile, o generator.Options, gen generateFunc, adjust func(*generator.Host)) (*types.Project, error) {
	used, err := eng.UsedSubnets(ctx)
	if err != nil {
		return nil, err
	}
	if o.Subnet, err = generator.PickSubnet(o.Project, used); err != nil {
		return nil, err
	}
	project, err := gen(o, adjust)
	if err != nil {
		return nil, err
	}
	has, err := eng.HasImage(ctx, o.GatewayImage)
	if err != nil {
		return nil, err
	}
	if !has {
		exe, err := gatewayBinary()
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(a.stderr, "%s: making the gateway image %s from %s\n", name, o.GatewayImage, exe)
		bctx, err := gatewayimage.Context(exe)
		if err != nil {
			return nil, withHint(err, "build propio-sandbox for Linux (GOOS=linux CGO_ENABLED=0 go build ./cmd/propio-sandbox) and name it in "+envGatewayBinary)
		}
		if err := eng.BuildContext(ctx, o.GatewayImage, bctx); err != nil {
			return nil, err
		}
	}
	if err := writeResolvConf(e.dirs.ResolvDir(), generator.GatewayAddr(o.Subnet)); err != nil {
		return nil, err
	}
	if _, err := startLog(e.dirs.LogDir(), logHeader{Time: time.Now().UTC(), Event: "start", Project: o.Project, Workspace: e.workspace, Profile: p.Meta.File}); err != nil {
		return nil, err
	}
	return project, nil
}

// writeResolvConf writes the resolv.conf that points a sandbox at its
// gateway, unless it is there already (each gateway address has its own).
func writeResolvConf(dir string, gw netip.Addr) error {
	path := filepath.Join(dir, generator.ResolvConfName(gw))
	if err := fsutil.WriteFileIfChanged(path, []byte(generator.ResolvConf(gw)), 0o644); err != nil {
		return fmt.Errorf("writing the sandbox's resolv.conf: %w", err)
	}
	return nil
}

// forwardSSHAgent sets up SSH agent forwarding as the profile's ssh_agent,
// or PROPIO_SANDBOX_SSH_AGENT, asks, printing its warnings. Its Cleanup is
// always safe to call.
func (a *app) forwardSSHAgent(ctx context.Context, eng *engine.Engine, p *profile.Profile, id string) (sshagent.Result, error) {
	none := sshagent.Result{Cleanup: func() error { return nil }}
	mode, err := sshagent.ModeFrom(p.SSHAgent, os.LookupEnv)
	if err != nil {
		return none, withHint(err, "set "+sshagent.EnvMode+" to auto, on or off")
	}
	sock, _ := os.LookupEnv("SSH_AUTH_SOCK")
	res, err := sshagent.Setup(ctx, sshagent.Config{
		Mode:          mode,
		GOOS:          runtime.GOOS,
		Engine:        eng.Kind,
		AuthSock:      sock,
		DockerDesktop: eng.DockerDesktop,
		VMPathExists:  func(ctx context.Context, path string) (bool, error) { return eng.PathExists(ctx, p.Image, path) },
		ID:            id,
	})
	var fatal *sshagent.FatalError
	if errors.As(err, &fatal) {
		return none, withHint(err, fatal.Hints()...)
	}
	if err != nil {
		return none, err
	}
	for _, w := range res.Warnings {
		fmt.Fprintf(a.stderr, "%s: warning: %s\n", name, w)
	}
	if res.Cleanup == nil {
		res.Cleanup = none.Cleanup
	}
	return res, nil
}

// withEngine connects to the engine --engine names (else the one auto
// finds) with the launcher's streams, calls fn, and closes the connection.
func (a *app) withEngine(fn func(context.Context, *engine.Engine) error) error {
	return a.withEngineOf("", fn)
}

// withEngineOf is withEngine for a profile that names an engine (--engine
// still wins). A Podman API service started for the launch is stopped after
// fn.
func (a *app) withEngineOf(want string, fn func(context.Context, *engine.Engine) error) error {
	ctx := context.Background()
	want = cmp.Or(a.engine, want, engine.Auto)
	loc, err := engine.Locate(ctx, want, os.Getenv)
	if err != nil {
		return engineHint(err, nil, "", want)
	}
	if loc.Stop != nil {
		defer loc.Stop()
	}
	eng, err := connect(ctx, a, loc)
	if err != nil {
		return err
	}
	defer eng.Close()
	return fn(ctx, eng)
}

// connect reaches the engine at loc, with the launcher's streams.
func connect(ctx context.Context, a *app, loc engine.Location) (*engine.Engine, error) {
	var in io.ReadCloser
	if rc, ok := a.stdin.(io.ReadCloser); ok {
		in = rc
	} else if a.stdin != nil {
		in = io.NopCloser(a.stdin)
	}
	eng, err := engine.Connect(ctx, loc.Host, engine.Streams{In: in, Out: a.stdout, Err: a.stderr})
	if err != nil {
		return nil, engineHint(err, nil, "", loc.Kind)
	}
	return eng, nil
}

// engineHint adds what to do about the engine's errors.
func engineHint(err error, p *profile.Profile, ref string, kind ...string) error {
	if len(kind) > 0 && kind[0] == engine.Podman {
		switch {
		case errors.Is(err, engine.ErrEngineMissing):
			return withHint(fmt.Errorf("Podman is required: %w", err), "install Podman (on Debian or Ubuntu: sudo apt-get install podman), or choose another engine with --engine")
		case errors.Is(err, engine.ErrEngineNotRunning):
			return withHint(err, "start Podman's API service (podman system service --time=0 &), or on macOS the machine (podman machine start), then try again")
		}
	}
	switch {
	case errors.Is(err, engine.ErrEngineMissing):
		return withHint(fmt.Errorf("Docker is required: %w", err),
			"install Docker Engine (on Debian or Ubuntu: sudo apt-get install docker.io), or set DOCKER_HOST to a running engine")
	case errors.Is(err, engine.ErrEngineNotRunning):
		return withHint(err, "start the Docker daemon (sudo systemctl start docker, or open Docker Desktop), then try again")
	case errors.Is(err, engine.ErrPermission):
		return withHint(err, "add your user to the docker group (sudo usermod -aG docker $USER), then log out and back in")
	case errors.Is(err, engine.ErrEngineTooOld):
		return withHint(err, "upgrade Docker Engine to 20.10 or newer")
	case errors.Is(err, engine.ErrImageMissing) && p != nil:
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

func isTerminal(v any) bool {
	f, ok := v.(*os.File)
	return ok && term.IsTerminal(f.Fd())
}

// runID makes a run's project name unique, so several sandboxes can run in
// one directory at once.
func runID() string {
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		return fmt.Sprintf("%x", time.Now().UnixNano())
	}
	return hex.EncodeToString(b)
}
