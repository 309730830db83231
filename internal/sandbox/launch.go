package sandbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/ask"
	"github.com/propio/propio-sandbox/internal/backend"
	"github.com/propio/propio-sandbox/internal/decisionlog"
	"github.com/propio/propio-sandbox/internal/hostinfo"
	"github.com/propio/propio-sandbox/internal/preflight"
	"github.com/propio/propio-sandbox/internal/profile"
	"github.com/propio/propio-sandbox/internal/sshagent"
)

// Reporter is what a launch tells the user while it goes on; the command
// line says it.
type Reporter interface {
	// Warn says something the user should know and may act on.
	Warn(msg string)
	// Note says what the launch is doing that takes time, or what it did.
	Note(msg string)
	// Guarded says what the git guard put aside or cleaned, one item each,
	// and where it keeps what it put aside.
	Guarded(items []string, quarantine string)
	// Failed says an error that is not the launch's own (the launch's own
	// error, or the sandbox's exit code, stays what it returns).
	Failed(err error)
}

// Launch is one run of a sandbox: the profile's command (or Command) in the
// workspace, on the engine Engine names (the profile's when empty).
type Launch struct {
	Env     Env
	Profile *profile.Profile
	Ref     string // how the user named the profile (-p), for hints
	Engine  string
	Command []string // overrides the profile's command when not nil
	Build   bool     // build the image first
	Skip    []string // declared checks not to run
	Resume  string   // the changeset to continue, in changeset mode
	Streams Streams
	TTY     bool // allocate a terminal: the launcher's stdin and stdout are one
	Report  Reporter
	// Hint says what to do about an engine that cannot be reached, for the
	// preflight check that reaches it.
	Hint func(error) error
	// Started, when set, is called once the sandbox's container has
	// started.
	Started func()
	// Early is the connection the command line started to the engine it
	// names, before the profile was read; the launch closes it.
	Early *Early
	// Keep makes the launch a persistent sandbox's supervisor (up, start);
	// nil for a run.
	Keep *Keep
	// Cluster names the cluster and namespace when Engine is Kubernetes.
	Cluster ClusterTarget
}

// ErrAllowlistOnPodman: network.mode allowlist does not run on a Podman
// older than backend.FencedAllowlistSince.
var ErrAllowlistOnPodman = errors.New("network.mode allowlist needs Podman " + backend.FencedAllowlistSince + " or newer: Podman gives the host an address on the sandbox's internal network (it ignores com.docker.network.bridge.inhibit_ipv4 and serves DNS there), and the fence that keeps the sandbox from them is made and tested from Podman " + backend.FencedAllowlistSince + " on, rootful and rootless")

// allowlistRefused says whether the engine cannot keep an allowlist
// sandbox in: its internal networks do not keep the host out, and it is
// older than the version whose fence (generator.EngineFacts.FencedNetns)
// is tested.
func allowlistRefused(f backend.Facts) bool {
	return !f.InternalNetworks && backend.VersionLess(f.Version, backend.FencedAllowlistSince)
}

// launch is the state of one Launch while it runs.
type launch struct {
	*Launch
	report Reporter
	build  bool // build the image first: --build, or it is missing
	plan   *Plan
	rt     backend.Runtime
	facts  backend.Facts // the engine's, as it reports them
	opts   generator.Options
	adjust []func(*generator.Host)
	// gcDone is closed once the leftovers of killed launchers are removed
	// (gcRemoved), or could not be (gcErr).
	gcDone    chan struct{}
	gcRemoved []string
	gcErr     error
	// reclaimed are the leftovers of this launch's name it removed itself.
	reclaimed []string
	// mounts carries out the agent's mount requests of the current run.
	mounts *Mounts
	// values are the secrets' values, read once a launch; store is the
	// image's trust store (secrets.go).
	values map[string]string
	store  *imageStore
	// broker is what the run hands its gateway once it runs; nil when the
	// gateway opens nothing.
	broker *runBroker
	// name is the sandbox's name, held; host is where the engine listens;
	// tempEngine: it is a Podman service started for the launch.
	name       *heldName
	host       string
	tempEngine bool
	// engineGone: the engine went away during the run.
	engineGone bool
	// removeHere: the removal is not handed over (a changeset's).
	removeHere bool
	// names are the engine's sandboxes when the launch began.
	names engineNames
	// keep is how long a gateway prepared ahead is kept (0: none is);
	// adopted is the one this launch adopted; spares is the preparing of
	// the next one.
	keep    time.Duration
	adopted *adoption
	spares  sync.WaitGroup
	// alive is held open until the launcher exits: the keeper of the gateway
	// it has prepared reads its end to hear of that.
	alive *os.File
}

// Run passes the preflight checks, launches the sandbox and waits for it to
// end, removing everything it created however it ends. It returns the
// sandbox's exit code; an error says why the launch failed (a
// *preflight.Failure when a check did, and nothing was created), with the
// exit code it calls for, when it has one, as the code.
func (l *Launch) Run(ctx context.Context) (int, error) {
	if l.Engine == Kubernetes {
		return l.runCluster(ctx)
	}
	if l.Keep.resuming() {
		return l.resume(ctx)
	}
	// Nothing is created before every check has passed.
	f := &Preflight{Env: l.Env, Profile: l.Profile, Ref: l.Ref, Engine: l.Engine, Build: l.Build, Streams: l.Streams, Hint: l.Hint, Early: l.Early}
	defer func() { f.Conn.Close() }() // f.Conn is set by the checks, later
	// The engine's sandboxes are listed while the other checks go on.
	listed := make(chan namesResult, 1)
	f.connected = func(c *Conn) {
		go func() {
			n, err := namesOn(ctx, c.Runtime)
			listed <- namesResult{n, err}
		}()
	}
	if err := f.Run(ctx); err != nil {
		return 0, err
	}
	if f.Conn == nil {
		return 0, errNoEngine
	}
	if err := l.checkGrants(f.Conn.Host); err != nil {
		return 0, err
	}
	keep, err := PrepareKeep(os.LookupEnv)
	if err != nil {
		return 0, err
	}
	s := &launch{keep: keep, Launch: l, report: l.Report, rt: f.Conn.Runtime, gcDone: make(chan struct{}), build: l.Build || f.Missing,
		host: f.Conn.Host, tempEngine: f.Conn.temporary}
	if f.Missing && !l.Build {
		s.report.Note(l.Profile.Image + " is not on the engine: building it first")
	}
	facts, err := s.rt.Facts(ctx) // the info preflight read
	if err != nil {
		return 0, err
	}
	s.facts = facts
	if facts.LimitsIgnored != "" {
		s.report.Warn(limitsIgnored(facts.LimitsIgnored))
	}
	if facts.Remote {
		if err := l.onRemote(facts.RemoteWhy); err != nil {
			return 0, err
		}
	}
	res := <-listed
	names, err := res.names, res.err
	if err != nil {
		return 0, err
	}
	dir, err := namesDir()
	if err != nil {
		return 0, err
	}
	s.names = names
	if err := s.prepare(); err != nil {
		return 0, err
	}
	if l.Keep != nil {
		// A persistent sandbox: its own name (up --name, or the
		// directory's), its record held; its gateway is its own.
		name, release, err := l.Keep.claim(l.Env.Dirs, l, names)
		if err != nil {
			return 0, err
		}
		defer release()
		s.opts.Project = name
		return s.run(ctx, names)
	}
	if s.adopted = s.adoptSpare(ctx); s.adopted != nil {
		s.name = s.adopted.name
		defer s.adopted.keeper.Close() // the keeper removes what is left
	} else if s.name, err = claimHeld(dir, l.Env.Workspace, func(n string) bool { return names.held[n] }); err != nil {
		return 0, err
	}
	defer s.name.release()
	defer s.spares.Wait() // the next run's gateway is handed over
	s.opts.Project = s.name.Name
	wd, err := s.startWatchdog(s.name.Name)
	if err != nil {
		s.report.Warn(fmt.Sprintf("starting the sandbox's watchdog: %v; if this launcher is killed, its sandbox runs on until gc removes it", err))
	}
	defer wd.dismiss()
	return s.run(ctx, names)
}

// onRemote puts a workspace in mode rw in changeset mode, for an engine on
// another machine (why says how that was told): the workspace goes there
// by copy, and what the sandbox writes comes back as a changeset to review
// and apply. A workspace in mode ro is copied there, read-only; so are
// mounts in mode ro (the generator's snapshots); preflight has refused
// mounts in mode rw.
func (l *Launch) onRemote(why string) error {
	if l.Profile.Workspace.Mode != profile.ModeRW {
		return nil
	}
	if err := l.Profile.ForceChangeset(); err != nil {
		return fmt.Errorf("%s, so the workspace goes there by copy, in changeset mode: %w", why, err)
	}
	l.Report.Note(why + ": the workspace goes there by copy, and what the sandbox writes comes back as a changeset to review and apply")
	return nil
}

// namesResult is what namesOn found.
type namesResult struct {
	names engineNames
	err   error
}

// prepare makes the plan and the first project, under the name render
// shows: a mistake in the profile that only the host reveals shows before
// anything starts.
func (s *launch) prepare() error {
	p := s.Profile
	s.opts = generator.Options{Project: generator.ProjectName(s.Env.Workspace, ""), Command: s.Command}
	if s.Keep != nil {
		if err := s.Keep.options(&s.opts, s.Launch); err != nil {
			return err
		}
	}
	if p.Network.Mode == "allowlist" {
		if err := GatewayOptions(&s.opts, s.Env.Dirs); err != nil {
			return err
		}
	}
	plan, err := NewPlan(s.Env, p)
	if err != nil {
		return err
	}
	for _, w := range plan.Warnings {
		s.report.Warn(w)
	}
	s.plan = plan
	_, err = plan.Generate(s.opts)
	return err
}

// checkGrants judges the profile's mounts again with the socket the engine
// was found at (engineHost), when it is not one of the known paths (a
// Podman service started for the launch), and warns about the mounts
// PROPIO_SANDBOX_MOUNTS adds that undo the sandbox: the user's own choice
// for the launch, shown, not refused.
func (l *Launch) checkGrants(engineHost string) error {
	host := l.Env.GrantHost()
	if sock, ok := strings.CutPrefix(engineHost, "unix://"); ok && !slices.Contains(host.Sockets, filepath.Clean(sock)) {
		host = l.Env.GrantHost(filepath.Clean(sock))
		granted, err := l.Profile.Grants(host)
		if err != nil {
			return &GrantsError{Socket: sock, Err: err}
		}
		var shown []string
		for _, g := range l.Profile.Granted() {
			shown = append(shown, g.String())
		}
		for _, g := range granted {
			if !slices.Contains(shown, g.String()) {
				l.Report.Warn(g.String())
			}
		}
	}
	extra, _ := hostinfo.ExtraMounts(os.LookupEnv) // a bad one is refused with the project
	for _, m := range extra {
		for _, d := range host.MountDangers(m.Source, !m.ReadOnly) {
			l.Report.Warn(fmt.Sprintf("unsafe grant %s: %s mounts %s at %s: %s", d.Name, hostinfo.EnvMounts, m.Source, m.Target, d.What))
		}
	}
	return nil
}

// GrantsError: the profile's grants, judged again with the engine's socket
// where the launch found it, are refused.
type GrantsError struct {
	Socket string
	Err    error
}

func (e *GrantsError) Error() string { return e.Err.Error() }
func (e *GrantsError) Unwrap() error { return e.Err }

// run starts what the sandbox needs and the sandbox itself, and tears it
// all down.
func (s *launch) run(ctx context.Context, names engineNames) (code int, err error) {
	if err := s.reclaim(ctx, names); err != nil {
		return 0, err
	}
	s.collectLeftovers(ctx, names)
	defer s.reportLeftovers(ctx)
	if s.Profile.Network.Mode == "allowlist" && allowlistRefused(s.facts) {
		return 0, fmt.Errorf("%w (this engine: Podman %s)", ErrAllowlistOnPodman, cmp.Or(s.facts.Version, "of an unknown version"))
	}
	if s.build {
		if code, err := s.buildFirst(ctx); err != nil {
			return code, err
		}
	}
	// The SSH agent, when the profile or the environment asks for it:
	// set up before anything is created, torn down after everything is
	// removed.
	agent, err := s.forwardSSHAgent(ctx)
	if err != nil {
		return 0, err
	}
	defer func() {
		if err := agent.Cleanup(); err != nil {
			s.report.Warn(err.Error())
		}
	}()
	s.adjust = append(s.adjust, func(h *generator.Host) {
		if agent.Forward {
			h.SSHAgent = generator.SSHAgent{Source: agent.Source, Relabel: agent.Relabel}
		}
		if s.facts.Remote {
			h.RemoteLogs = remoteLogs(s.Env.Dirs)
		}
	}, s.engineFacts)
	return s.guarded(func(check *guardCheck) (int, error) {
		// The profile's own checks, each in a throwaway sandbox of it
		// (where directories in changeset mode are read-only).
		if err := preflight.Run(ctx, s.declaredChecks()); err != nil {
			return 0, err
		}
		return s.runSandbox(ctx, check)
	})
}

// guarded runs fn once the guard is prepared: from then the sandbox may
// write, and what it leaves that git (or the host) would run is judged
// once it has gone (or stopped), however fn ends (gc does it for a
// launcher that is killed).
func (s *launch) guarded(fn func(*guardCheck) (int, error)) (code int, err error) {
	if err := s.plan.Guard.Prepare(s.Env.Dirs.GuardDir(), s.opts.Project, time.Now()); err != nil {
		return 0, err
	}
	check := newGuardCheck(s.plan.Guard, s.Env.Dirs)
	defer func() {
		if s.engineGone {
			// The sandbox may run on where the engine left it: what it
			// leaves is judged once it is gone (the next run, or gc).
			return
		}
		gerr := check.finish(s.report)
		switch {
		case gerr == nil:
		case err == nil:
			err = gerr
		default:
			s.report.Failed(gerr)
		}
	}()
	return fn(check)
}

// collectLeftovers removes, while this sandbox starts, what launchers that
// were killed before they could clean up left, among the sandboxes the
// engine listed for the names (gc touches only sandboxes whose launcher is
// gone, never this one; reclaim has removed those of this launch's name);
// reportLeftovers says what.
func (s *launch) collectLeftovers(ctx context.Context, names engineNames) {
	var others []backend.Sandbox
	for _, sb := range names.list {
		if sb.Project != s.opts.Project {
			others = append(others, sb)
		}
	}
	go func() {
		defer close(s.gcDone)
		s.gcRemoved, s.gcErr = removeLeftovers(ctx, s.rt, others)
	}()
}

func (s *launch) reportLeftovers(ctx context.Context) {
	<-s.gcDone
	if s.engineGone {
		return // the engine's errors are not news: it is gone, and the run says so
	}
	removed := append(s.reclaimed, s.gcRemoved...)
	if s.gcErr != nil {
		s.report.Warn(fmt.Sprintf("removing leftovers of earlier sandboxes: %v", s.gcErr))
	} else if len(removed) > 0 {
		s.report.Note(fmt.Sprintf("removed %d leftover sandbox(es) of launchers that are gone: %s", len(removed), strings.Join(removed, ", ")))
	}
	// What those sandboxes left, judged now that they are gone.
	if err := CheckPending(ctx, s.report, s.rt, s.Env.Dirs); err != nil {
		s.report.Warn(err.Error())
	}
}

// runSandbox runs the sandbox in its changeset, when the profile has one,
// numbering its network again when another launcher took it at the same
// moment.
func (s *launch) runSandbox(ctx context.Context, check *guardCheck) (code int, err error) {
	cs, err := s.changeset(ctx)
	if err != nil {
		return 0, err
	}
	// A changeset's volumes are removed before the launcher returns: the
	// removal settles its overlay, and the next run may resume it.
	s.removeHere = cs != nil
	ran := false
	defer func() {
		if !ran {
			// An error after the sandbox had started: what it wrote is kept.
			s.dropChangeset(cs)
		}
	}()
	allowlist := s.Profile.Network.Mode == "allowlist"
	for attempt := 1; ; attempt++ {
		var project *types.Project
		lookup := os.LookupEnv
		switch {
		case s.adopted != nil:
			project, lookup, err = s.adoptedProject(ctx, s.opts, s.adjustAll)
		case allowlist:
			project, lookup, err = s.prepareGateway(ctx, s.opts, s.adjustAll)
		default:
			project, err = s.plan.Generate(s.opts, s.adjustAll)
		}
		if err != nil {
			return 0, err
		}
		code, err = s.runProject(ctx, project, lookup, check, &ran)
		// Another launcher took the same network at the same moment:
		// number it again (prepareGateway picks among the subnets free now)
		// and retry.
		if !allowlist || s.adopted != nil || !errors.Is(err, backend.ErrSubnetTaken) || attempt == 3 {
			break
		}
		os.Remove(decisionlog.Path(s.Env.Dirs.LogDir(), s.opts.Project))
	}
	if ran && cs != nil && !s.Keep.Kept() {
		if serr := cs.Finish(s.Streams.Err, errors.Is(err, ErrCopyOut)); serr != nil {
			err = errors.Join(err, serr)
		}
	}
	return code, err
}

// runProject runs the sandbox of project, serving the agent's requests
// and its ports while it runs; ran is set once its command has run.
func (s *launch) runProject(ctx context.Context, project *types.Project, lookup func(string) (string, bool), check *guardCheck, ran *bool) (code int, err error) {
	allowlist := s.Profile.Network.Mode == "allowlist"
	ports := s.newPorts(project)
	stopRequests, err := s.serveAgentRequests(ctx, project, ports)
	if err != nil {
		ports.Close()
		if allowlist {
			dropRunDirs(s.opts.Project)
		}
		return 0, err
	}
	hangup := announce(project.Name)
	stopHook := serveTestRequests(map[string]func(context.Context, ask.Request) (map[string]any, error){"port": ports.Handle})
	var handBroker func(context.Context) error
	if s.broker != nil {
		handBroker = s.handBroker
	}
	code, err = Run(ctx, s.rt, project, RunOptions{
		TTY:         s.TTY,
		Interactive: true,
		Build:       s.build,
		LookupEnv:   lookup,
		// The image check of preflight has just looked.
		ImageChecked: true,
		Ran: func() {
			*ran = true
			check.begin() // while the engine removes the containers
			if werr := copyBackWrites(s.mounts); werr != nil {
				s.report.Warn(werr.Error())
			}
		},
		Keep:    s.Keep,
		Started: s.started,
		Release: s.handOff,
		Host:    s.host,
		Broker:  handBroker,
	})
	var gone *EngineGoneError
	if s.engineGone = errors.As(err, &gone); s.engineGone && s.adopted != nil {
		gone.also(s.adopted.spare) // its keeper's gateway and networks, left too
	}
	hangup()
	stopHook()
	stopRequests()
	if werr := s.mounts.FinishWrites(s.report); werr != nil {
		s.report.Warn(werr.Error())
	}
	s.mounts = nil
	if perr := ports.Close(); perr != nil && !s.engineGone {
		s.report.Warn(fmt.Sprintf("removing the published ports: %v", perr))
	}
	if allowlist {
		dropRunDirs(s.opts.Project)
		if s.facts.Remote {
			if lerr := settleRemoteLog(s.Env.Dirs, s.opts.Project); lerr != nil {
				s.report.Warn(lerr.Error())
			}
		}
	}
	return code, err
}

// buildFirst builds the image (--build, or it is missing) before anything
// of the run is made: the declared checks run it too. A signal stops the
// build, and the launch, with 128+N.
func (s *launch) buildFirst(ctx context.Context) (int, error) {
	project, err := s.plan.Generate(s.opts)
	if err != nil {
		return 0, err
	}
	sigc := make(chan os.Signal, 1)
	var sigs processSignals
	sigs.Notify(sigc)
	defer sigs.Stop(sigc)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	heard := make(chan os.Signal, 1)
	go func() {
		select {
		case sig := <-sigc:
			heard <- sig
			cancel()
		case <-ctx.Done():
		}
	}()
	err = buildImage(ctx, s.rt, project, generator.Service)
	cancel()
	select {
	case sig := <-heard:
		return 128 + int(sig.(syscall.Signal)), fmt.Errorf("%w by %v while building %s", ErrInterrupted, sig, s.Profile.Image)
	default:
	}
	if err != nil {
		return 0, err
	}
	s.build = false // built: the run only looks
	return 0, nil
}

// started is told the sandbox's container has been started: the next
// run's gateway may be prepared now.
func (s *launch) started(string) {
	if s.Started != nil {
		s.Started()
	}
	s.prepareNext()
}

// adjustAll applies what the launch found out to the host facts.
func (s *launch) adjustAll(h *generator.Host) {
	for _, f := range s.adjust {
		f(h)
	}
}

// forwardSSHAgent sets up SSH agent forwarding as the profile's ssh_agent,
// or PROPIO_SANDBOX_SSH_AGENT, asks, saying its warnings. Its Cleanup is
// always safe to call. A bad PROPIO_SANDBOX_SSH_AGENT is an
// *SSHModeError; a refusal a *sshagent.FatalError.
func (s *launch) forwardSSHAgent(ctx context.Context) (sshagent.Result, error) {
	none := sshagent.Result{Cleanup: func() error { return nil }}
	mode, err := sshagent.ModeFrom(s.Profile.SSHAgent, os.LookupEnv)
	if err != nil {
		return none, &SSHModeError{err}
	}
	sock, _ := os.LookupEnv("SSH_AUTH_SOCK")
	res, err := sshagent.Setup(ctx, sshagent.Config{
		Mode:          mode,
		GOOS:          runtime.GOOS,
		Engine:        s.facts.Kind,
		AuthSock:      sock,
		Remote:        s.facts.RemoteWhy,
		DockerDesktop: func(context.Context) (bool, error) { return s.facts.DockerDesktop, nil },
		VMPathExists: func(ctx context.Context, path string) (bool, error) {
			return s.rt.PathExists(ctx, s.Profile.Image, path)
		},
		ID: s.opts.Project,
	})
	if err != nil {
		return none, err
	}
	for _, w := range res.Warnings {
		s.report.Warn(w)
	}
	if res.Cleanup == nil {
		res.Cleanup = none.Cleanup
	}
	return res, nil
}

// SSHModeError: PROPIO_SANDBOX_SSH_AGENT (or the profile's ssh_agent) is
// not a mode.
type SSHModeError struct{ Err error }

func (e *SSHModeError) Error() string { return e.Err.Error() }
func (e *SSHModeError) Unwrap() error { return e.Err }

// engineFacts puts what differs on the launch's engine, as the engine
// reports it, into the host facts.
func (s *launch) engineFacts(h *generator.Host) { h.Engine = hostFacts(s.facts) }

// limitsIgnored is the warning of a launch on an engine that does not
// enforce the profile's resource limits (why).
func limitsIgnored(why string) string {
	return "the sandbox's memory, pids and CPU limits are not enforced: " + why + "; a process inside can exhaust this machine's memory and processes (Docker, rootful Podman, or a rootless engine on cgroups v2 enforce them)"
}
