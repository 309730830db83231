package sandbox

// This file is where a launch meets a Kubernetes cluster (run --engine
// kubernetes): the same Plan as a container engine's launch, generated as
// the cluster's objects (Plan.Kubernetes over generator.Generate) instead
// of a compose project, and run through internal/kube, behind the small
// ClusterRuntime interface. backend.Runtime is a container engine's
// (compose projects, volumes, networks, helper containers): a cluster does
// none of that, so the seam is one level up, where Launch.Run picks by the
// engine named.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/moby/term"
	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/backend"
	cslaunch "github.com/propio/propio-sandbox/internal/changeset/launch"
	"github.com/propio/propio-sandbox/internal/decisionlog"
	"github.com/propio/propio-sandbox/internal/gatewayimage"
	"github.com/propio/propio-sandbox/internal/kube"
	"github.com/propio/propio-sandbox/internal/kubeapi"
	"github.com/propio/propio-sandbox/internal/preflight"
	"github.com/propio/propio-sandbox/internal/profile"
	"github.com/propio/propio-sandbox/internal/treetar"
)

// Kubernetes is the engine name of a Kubernetes cluster (--engine
// kubernetes).
const Kubernetes = "kubernetes"

// ClusterTarget names the cluster and namespace a launch runs on.
type ClusterTarget struct {
	// Kubeconfig is the kubeconfig file ("" for $KUBECONFIG's first, else
	// ~/.kube/config); Context its context ("" for its current one).
	Kubeconfig, Context string
	// Namespace is the namespace ("" for the context's).
	Namespace string
}

// ClusterRuntime is what a launch needs of a Kubernetes cluster;
// internal/kube's *kube.Cluster is one.
type ClusterRuntime interface {
	// Preflight checks the cluster's own facts for the objects.
	Preflight(ctx context.Context, objs *generator.KubeObjects) error
	// Run creates the objects, runs the sandbox with its streams, returns
	// its exit code, and removes everything it made however it ends.
	Run(ctx context.Context, s kube.RunSpec) (int, error)
}

// ConnectCluster reaches the cluster t names (its kubeconfig read, no
// request made yet).
func ConnectCluster(t ClusterTarget) (*kube.Cluster, error) {
	cfg, err := kubeapi.LoadConfig(t.Kubeconfig, t.Context)
	if err != nil {
		return nil, &EngineError{Kind: Kubernetes, Err: err}
	}
	return kube.New(kubeapi.New(cfg), t.Namespace), nil
}

// ErrClusterUnsupported: what the launch asks for has no Kubernetes
// counterpart yet.
var ErrClusterUnsupported = errors.New("not available with --engine kubernetes yet")

// runCluster is Run on a Kubernetes cluster: the built-in checks that
// look at the host (workspace, trust, required variables), the cluster's
// own (preflight check "cluster"), then the sandbox's Pod, its output and
// exit code; everything made is removed however it ends (a signal
// included; gc finds what a killed launcher left).
func (l *Launch) runCluster(ctx context.Context) (code int, err error) {
	// The launcher's signals are heard from the start: one ends what goes
	// on (the checks, the run, whose objects are then removed) with 128+N.
	ctx, heard := hearSignals(ctx)
	defer func() {
		if sig := heard(); sig != nil {
			code = 128 + int(sig.(syscall.Signal))
			if err != nil && !errors.Is(err, context.Canceled) {
				err = fmt.Errorf("%w by %v: %w", ErrInterrupted, sig, err)
			} else {
				err = fmt.Errorf("%w by %v", ErrInterrupted, sig)
			}
		}
	}()
	switch {
	case l.Keep != nil:
		return 0, fmt.Errorf("persistent sandboxes (up, start): %w", ErrClusterUnsupported)
	case l.Build:
		return 0, fmt.Errorf("--build: %w (build the image and load it into the cluster's nodes)", ErrClusterUnsupported)
	case l.Resume != "":
		return 0, fmt.Errorf("--resume: %w", ErrClusterUnsupported)
	}
	if err := preflight.Run(ctx, hostChecks(l.Env, l.Profile, l.Ref)); err != nil {
		return 0, err
	}
	plan, err := NewPlan(l.Env, l.Profile)
	if err != nil {
		return 0, err
	}
	for _, w := range plan.Warnings {
		l.Report.Warn(w)
	}
	name, err := clusterName(l.Env.Workspace)
	if err != nil {
		return 0, err
	}
	o := generator.Options{Project: name, Command: l.Command}
	if l.Profile.Network.Mode == "allowlist" {
		// The gateway's image is this executable's, as on an engine; the
		// nodes must have it (preflight says so when none does).
		if err := GatewayOptions(&o, l.Env.Dirs); err != nil {
			return 0, err
		}
	}
	objs, err := plan.Kubernetes(o, generator.KubeOptions{})
	if err != nil {
		return 0, err
	}
	host, _ := os.Hostname()
	kube.Stamp(objs, os.Getpid(), host)
	cl, err := ConnectCluster(l.Cluster)
	if err != nil {
		return 0, err
	}
	if err := preflight.Run(ctx, []preflight.Check{clusterCheck(cl, objs)}); err != nil {
		return 0, err
	}
	if l.Profile.Workspace.Mode == profile.ModeRW {
		l.Report.Warn("on Kubernetes the workspace is a copy: what the sandbox writes to it goes with its Pod (run --changeset brings it back for review)")
	}
	api := cl.API.Config()
	l.Report.Note(fmt.Sprintf("running pod %s in namespace %s of %s (context %s)", objs.Pod.Metadata.Name, cl.Namespace, api.Server, api.Context))
	ran := false
	spec := kube.RunSpec{Objects: objs, Started: func() {
		ran = true
		if l.Started != nil {
			l.Started()
		}
	}, Warn: l.Report.Warn}
	if l.TTY {
		restore, size, resize, err := rawTerminal(l.Streams)
		if err != nil {
			return 0, err
		}
		defer restore()
		spec.TTY, spec.Size, spec.Resize = true, size, resize
	}
	var cs *cslaunch.Changeset
	from, to := l.Env.Workspace, ""
	if l.Profile.Changeset() {
		if cs, err = cslaunch.Prepare(ctx, clusterChangesets{}, l.Profile, l.Env.Workspace, "", l.Streams.Err); err != nil {
			return 0, err
		}
		copies := cs.VolumeCopies()
		if len(copies) != 1 {
			cs.Abandon()
			return 0, fmt.Errorf("changeset mode on Kubernetes takes the workspace alone, not %d directories", len(copies))
		}
		from, to = copies[0].From, copies[0].To
	}
	if objs.Gateway != nil {
		// The gateway's log is in its Pod: it is copied, as it grows, to
		// the log `logs` reads, named after the sandbox.
		w, err := startClusterLog(l.Env, l.Profile, name)
		if err != nil {
			if cs != nil {
				cs.Abandon()
			}
			return 0, err
		}
		spec.GatewayLog, spec.GatewayLogFollow = w, objs.GatewayLogFollow(gatewayimage.Binary)
		defer func() {
			if cerr := w.Close(); cerr != nil {
				l.Report.Warn(cerr.Error())
			}
		}()
	}
	code, err = runOnCluster(ctx, cl, spec, l.Streams, from, to)
	switch {
	case cs == nil:
	case !ran:
		if aerr := cs.Abandon(); aerr != nil {
			l.Report.Warn("removing the changeset of a sandbox that did not run: " + aerr.Error())
		}
	default:
		// Nothing came back when the copy failed, or the run ended before
		// it (a signal, the timeout).
		failed := errors.Is(err, kube.ErrWorkspaceOut) || errors.Is(err, ErrCopyOut) || errors.Is(err, ErrTimeout) || ctx.Err() != nil
		if ferr := cs.Finish(l.Streams.Err, failed); ferr != nil {
			err = errors.Join(err, ferr)
		}
	}
	return code, err
}

// clusterLog is the decision log of a sandbox's gateway on a cluster, in
// the user's log directory: the lines the gateway's Pod gives are written
// to it, whole entries only (decisionlog.Writer.CopyFrom).
type clusterLog struct {
	pw     *io.PipeWriter
	log    *decisionlog.Writer
	copied chan error
}

// startClusterLog starts the decision log of the sandbox project (its
// header: the workspace, the profile), as a launch on an engine does, and
// returns the writer of its gateway's lines.
func startClusterLog(e Env, p *profile.Profile, project string) (*clusterLog, error) {
	path, err := decisionlog.Start(e.Dirs.LogDir(), decisionlog.Header{Time: time.Now().UTC(), Project: project, Workspace: e.Workspace, Profile: p.Meta.File})
	if err != nil {
		return nil, err
	}
	log, err := decisionlog.Append(path)
	if err != nil {
		return nil, err
	}
	pr, pw := io.Pipe()
	c := &clusterLog{pw: pw, log: log, copied: make(chan error, 1)}
	go func() {
		err := log.CopyFrom(pr)
		pr.Close()
		c.copied <- err
	}()
	return c, nil
}

func (c *clusterLog) Write(p []byte) (int, error) { return c.pw.Write(p) }

// Close ends the log once the run has: what was copied is in, a partial
// last line left out; an error says what was left out.
func (c *clusterLog) Close() error {
	c.pw.Close()
	err := <-c.copied
	return errors.Join(err, c.log.Close())
}

// clusterChangesets is what a changeset's launch asks of the engine, for
// a cluster: no overlay of this host's directories (the Pod's node does
// not have them), so a copy; nothing to release (a changeset is not
// resumed there yet).
type clusterChangesets struct{}

func (clusterChangesets) OverlayCapable(context.Context) (backend.Overlay, error) {
	return backend.Overlay{Why: "a Kubernetes cluster's node does not have this host's directories"}, nil
}

func (clusterChangesets) ReleaseChangeset(context.Context, string) error { return nil }

// hostChecks are the built-in checks that look at the host alone, which a
// launch on a cluster passes: the workspace, its trust, the required
// variables (the engine's are the cluster's there).
func hostChecks(e Env, p *profile.Profile, ref string) []preflight.Check {
	f := &Preflight{Env: e, Profile: p, Ref: ref}
	in := f.inputs()
	in.Connect = nil
	var checks []preflight.Check
	for _, c := range preflight.Checks(in) {
		switch c.Name {
		case preflight.Workspace, preflight.Trust, preflight.EnvRequired:
			checks = append(checks, c)
		}
	}
	return checks
}

// clusterCheck is the check "cluster": the cluster's own facts
// (kube.Preflight) for objs.
func clusterCheck(cl ClusterRuntime, objs *generator.KubeObjects) preflight.Check {
	return preflight.Check{Name: preflight.Cluster, Fn: func(ctx context.Context) preflight.Result {
		err := cl.Preflight(ctx, objs)
		var pe *kube.PreflightError
		switch {
		case errors.As(err, &pe):
			return preflight.Result{Reason: strings.Join(pe.Problems, "; "),
				Hints: []string{"fix these on the cluster (or choose another namespace with -n, another context with --kube-context)"}}
		case err != nil:
			return preflight.Result{Reason: err.Error(),
				Hints: []string{"check that the cluster answers (kubectl get --raw /readyz) with the kubeconfig's credentials"}}
		}
		return preflight.Result{OK: true, Reason: "the cluster can run the sandbox"}
	}}
}

// probeBudget bounds doctor's probe of the cluster's NetworkPolicy.
const probeBudget = 2 * time.Minute

// DoctorCluster runs every check run --engine kubernetes passes, for p in
// e's workspace on the cluster t names, and, when they pass, probes
// whether the cluster's CNI enforces NetworkPolicy (kube.ProbePolicy, with
// the profile's image): the check network-policy says what it found
// (failed when it does not and the profile's network is none), and
// warnings say when it does not, or when that cannot be told.
func DoctorCluster(ctx context.Context, e Env, p *profile.Profile, ref string, t ClusterTarget) ([]preflight.Result, []string, error) {
	plan, err := NewPlan(e, p)
	if err != nil {
		return nil, nil, err
	}
	objs, err := plan.Kubernetes(generator.Options{Project: generator.ProjectName(e.Workspace, "")}, generator.KubeOptions{})
	if err != nil {
		return nil, nil, err
	}
	cl, err := ConnectCluster(t)
	if err != nil {
		return nil, nil, err
	}
	results := preflight.RunAll(ctx, append(hostChecks(e, p, ref), clusterCheck(cl, objs)))
	if !results[len(results)-1].OK {
		return results, nil, nil
	}
	pctx, cancel := context.WithTimeout(ctx, probeBudget)
	defer cancel()
	enf, err := cl.ProbePolicy(pctx, p.Image)
	probe := preflight.Result{Name: preflight.NetworkPolicy, OK: true, Hints: []string{}}
	var warnings []string
	switch {
	case err != nil:
		probe.Reason = fmt.Sprintf("could not tell whether the cluster enforces NetworkPolicy: %v", err)
		warnings = append(warnings, probe.Reason)
	case !enf.Known:
		probe.Reason = "could not tell whether the cluster enforces NetworkPolicy: " + enf.Why
		warnings = append(warnings, probe.Reason)
	case !enf.Enforced:
		probe.Reason = enf.Why
		warnings = append(warnings, enf.Why+": network.mode none keeps nothing in there")
		if p.Network.Mode == "none" {
			probe.OK = false
			probe.Hints = []string{"use a CNI that enforces NetworkPolicy (Calico, Cilium, kube-router...), or run this profile on Docker or Podman"}
		}
	default:
		probe.Reason = enf.Why
	}
	results = append(results, probe)
	return results, warnings, nil
}

// runOnCluster runs objs on cl with the directory from copied in as the
// workspace and the launcher's streams, until ctx ends (a signal: the
// objects are removed); the profile's timeout ends it with 124 and
// ErrTimeout. When to is set, the
// workspace as the command left it replaces the directory to (an error
// wrapping ErrCopyOut when it cannot). spec says the objects, and whether
// the sandbox has a terminal; the rest of it is filled here.
func runOnCluster(ctx context.Context, cl ClusterRuntime, spec kube.RunSpec, s Streams, from, to string) (int, error) {
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(treetar.WriteBelow(pw, from)) }()
	defer pr.Close()
	spec.Env, spec.Workspace, spec.Streams = os.LookupEnv, pr, kube.Streams{In: s.In, Out: s.Out}
	var outw *io.PipeWriter
	copied := make(chan error, 1)
	if to != "" {
		var outr *io.PipeReader
		outr, outw = io.Pipe()
		spec.WorkspaceOut = outw
		go func() {
			err := treetar.Replace(outr, to)
			if err == nil {
				io.Copy(io.Discard, outr) // tar's padding after the archive's end
			}
			outr.CloseWithError(errors.New("copy ended"))
			if err == nil {
				// The tree's root is the Pod's volume's, made by the
				// cluster: it takes the original's owner and mode.
				err = cslaunch.LikeRoot(to, from)
			}
			if err == nil {
				err = restoreProtected(to, from, protectedPaths(spec.Objects))
			}
			copied <- err
		}()
	}
	code, err := cl.Run(ctx, spec)
	if outw != nil {
		if err != nil {
			outw.CloseWithError(err)
		} else {
			outw.Close()
		}
		if cerr := <-copied; cerr != nil && err == nil {
			err = fmt.Errorf("%w: %w", ErrCopyOut, cerr)
		}
	}
	if errors.Is(err, kube.ErrDeadline) {
		return 124, fmt.Errorf("%w: %w", ErrTimeout, err)
	}
	return code, err
}

// clusterName is a sandbox's name on a cluster: the workspace's project
// name and a random part, so that launchers of the same workspace, on any
// host, never share one.
func clusterName(workspace string) (string, error) {
	b := make([]byte, 3)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	base := generator.KubeName(generator.ProjectName(workspace, ""))
	if len(base) > 50 {
		base = strings.TrimRight(base[:50], "-")
	}
	return base + "-" + hex.EncodeToString(b), nil
}

// GCCluster removes, in the namespace of t, the sandboxes whose launcher
// (on this host) is gone: what a killed launcher left on the cluster. It
// returns their names.
func GCCluster(ctx context.Context, t ClusterTarget) ([]string, error) {
	cl, err := ConnectCluster(t)
	if err != nil {
		return nil, err
	}
	left, err := cl.Leftovers(ctx)
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, l := range left {
		if err := cl.Remove(ctx, l.Name); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, l.Name)
	}
	return removed, errors.Join(errs...)
}

// rawTerminal puts the launcher's terminal (its stdin) in raw mode, as a
// terminal run on Docker does, and returns how to restore it, its size, and
// its sizes as its window is resized (SIGWINCH), until restored.
func rawTerminal(s Streams) (restore func(), size *kubeapi.TermSize, resize <-chan kubeapi.TermSize, err error) {
	f, ok := s.In.(interface{ Fd() uintptr })
	if !ok || !term.IsTerminal(f.Fd()) {
		return nil, nil, nil, errors.New("a terminal was asked for, and stdin is not one")
	}
	sizeOf := func() *kubeapi.TermSize {
		if out, ok := s.Out.(interface{ Fd() uintptr }); ok {
			if ws, err := term.GetWinsize(out.Fd()); err == nil && ws.Height > 0 {
				return &kubeapi.TermSize{Width: ws.Width, Height: ws.Height}
			}
		}
		return nil
	}
	state, err := term.SetRawTerminal(f.Fd())
	if err != nil {
		return nil, nil, nil, fmt.Errorf("putting the terminal in raw mode: %w", err)
	}
	sizes := make(chan kubeapi.TermSize, 1)
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-winch:
				if sz := sizeOf(); sz != nil {
					select {
					case <-sizes: // an older size not sent yet is dropped
					default:
					}
					sizes <- *sz
				}
			case <-done:
				return
			}
		}
	}()
	return func() {
		signal.Stop(winch)
		close(done)
		term.RestoreTerminal(f.Fd(), state)
	}, sizeOf(), sizes, nil
}

// hearSignals returns ctx ended by the first of the launcher's signals
// (SIGINT, SIGTERM, SIGHUP: caught, so that none kills it before what it
// made is removed), and heard, which stops the hearing and says which
// signal ended it, if one did.
func hearSignals(ctx context.Context) (context.Context, func() os.Signal) {
	ctx, cancel := context.WithCancel(ctx)
	sigc := make(chan os.Signal, 1)
	var sigs processSignals
	sigs.Notify(sigc)
	got := make(chan os.Signal, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		select {
		case sig := <-sigc:
			got <- sig
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, func() os.Signal {
		sigs.Stop(sigc)
		cancel()
		<-done
		select {
		case sig := <-got:
			return sig
		default:
			return nil
		}
	}
}

// ListCluster lists the sandboxes in the namespace of t, oldest first, as
// ls shows an engine's: the launcher alive or not (on this host).
func ListCluster(ctx context.Context, t ClusterTarget) ([]Sandbox, error) {
	cl, err := ConnectCluster(t)
	if err != nil {
		return nil, err
	}
	list, err := cl.List(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]Sandbox, 0, len(list))
	for _, sb := range list {
		out = append(out, Sandbox{Project: sb.Name, Workspace: sb.Workspace, Profile: sb.Profile, PID: sb.PID, Host: sb.Host,
			Alive: backend.LauncherAlive(sb.PID, sb.Host), State: strings.ToLower(sb.Phase), Created: sb.Created})
	}
	return out, nil
}
