// Package cli is propio-sandbox's command line: flags, subcommands, output,
// exit codes and hints. It is the only package that prints or chooses an
// exit code; everything below it returns errors.
package cli

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/propio/propio-sandbox/internal/hostinfo"
	"github.com/propio/propio-sandbox/internal/initgc"
	"github.com/propio/propio-sandbox/internal/profile"
	"github.com/propio/propio-sandbox/internal/sandbox"
	"github.com/propio/propio-sandbox/internal/termsafe"
	"github.com/spf13/cobra"
)

// Exit codes.
const (
	ExitOK      = 0
	ExitFailure = 1
	ExitUsage   = 2
	// ExitPreflight: a preflight check failed, and nothing was created.
	ExitPreflight = 3
	// ExitEngineGone: the engine went away during the run (125, as docker
	// run says a failure of the daemon itself).
	ExitEngineGone = sandbox.ExitEngineGone
)

const name = "propio-sandbox"

// Main runs the command line with args and returns the exit code.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	root := newRoot(&app{stdin: stdin, stdout: stdout, stderr: stderr})
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.Execute()
	if err == nil {
		return ExitOK
	}
	return report(stderr, err)
}

// launches is the annotation of the commands that launch a sandbox (run,
// and the root, which runs).
const launches = "launches"

// app is what every subcommand shares.
type app struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	profile        string // -p
	engine         string // --engine
	context        string // --context
	kubeContext    string // --kube-context
	namespace      string // -n, --namespace
}

// engineWant is the engine --engine and --context ask for: a Docker
// context's (--context beats DOCKER_HOST, as the docker CLI's flag does),
// else --engine's; "" when neither says (the profile's engine, else auto).
func (a *app) engineWant() string {
	if a.context != "" {
		return sandbox.WithContext(a.context)
	}
	return a.engine
}

// engineArgs pass --engine and --context on to a command of ours that
// carries on the launch (supervise).
func (a *app) engineArgs() []string {
	var args []string
	if a.engine != "" {
		args = append(args, "--engine", a.engine)
	}
	if a.context != "" {
		args = append(args, "--context", a.context)
	}
	return args
}

// preRun comes before every command: the collector, held off
// (internal/initgc) until a launch's sandbox has started, is given back at
// once to the other commands; the engine flags are checked.
func (a *app) preRun(cmd *cobra.Command, args []string) error {
	if cmd.Annotations[launches] == "" {
		initgc.Restore()
	}
	return a.checkEngineFlags(cmd, args)
}

// checkEngineFlags refuses --context with an engine that has no contexts,
// and a cluster's flags without a cluster.
func (a *app) checkEngineFlags(cmd *cobra.Command, _ []string) error {
	if a.context != "" && a.engine != "" && a.engine != sandbox.Auto && a.engine != sandbox.Docker {
		hint := ""
		if a.engine == sandbox.Kubernetes {
			hint = " (a kubeconfig's context is --kube-context)"
		}
		return usageError{fmt.Errorf("--context %s names a Docker context, and --engine %s is not Docker%s", a.context, a.engine, hint)}
	}
	if a.engine == sandbox.Kubernetes {
		return nil
	}
	if a.kubeContext != "" && cmd.Name() != "render" {
		return usageError{fmt.Errorf("--kube-context %s names a kubeconfig's context: give --engine kubernetes too", a.kubeContext)}
	}
	if a.namespace != "" && cmd.Name() != "render" {
		return usageError{fmt.Errorf("--namespace %s is a Kubernetes namespace: give --engine kubernetes too (or render --target kubernetes)", a.namespace)}
	}
	return nil
}

// cluster is the cluster --engine kubernetes runs on.
func (a *app) cluster() sandbox.ClusterTarget {
	return sandbox.ClusterTarget{Context: a.kubeContext, Namespace: a.namespace}
}

func newRoot(a *app) *cobra.Command {
	var rootRun runFlags
	root := &cobra.Command{
		Use:   name,
		Short: "Run a coding agent, or any command, in a container sandbox described by a YAML profile",
		Long: name + ` runs a command inside a container that sees only the directory it was
started in (mounted at /workspace) and what its profile grants: mounts, network,
environment variables, resources.

Profiles: -p NAME looks in $XDG_CONFIG_HOME/propio-sandbox/profiles/NAME.yaml, then the
built-ins; -p PATH reads a file. Without -p, ./.propio/sandbox.yaml is used when
present, otherwise the built-in "` + profile.DefaultBuiltin + `".`,
		SilenceErrors: true,
		SilenceUsage:  true,
		// run is the default subcommand: `propio-sandbox [-p X] [-- CMD...]`.
		// Words before -- can only be a mistyped subcommand.
		Args:                       unknownCommand,
		RunE:                       func(cmd *cobra.Command, args []string) error { return a.run(cmd, args, rootRun) },
		SuggestionsMinimumDistance: 2,
	}
	root.PersistentFlags().StringVarP(&a.profile, "profile", "p", "", "profile `NAME` or PATH")
	root.PersistentFlags().StringVar(&a.engine, "engine", "", "container `ENGINE`: auto, docker, podman, or kubernetes (run, gc and doctor on a cluster; default: the profile's engine, else auto)")
	root.PersistentFlags().StringVar(&a.context, "context", "", "Docker `CONTEXT` to run on, as docker --context (default: DOCKER_HOST, else DOCKER_CONTEXT, else the docker CLI's current context)")
	root.PersistentFlags().StringVar(&a.kubeContext, "kube-context", "", "with --engine kubernetes: the kubeconfig's `CONTEXT` (default: its current context; the kubeconfig is $KUBECONFIG's first file, else ~/.kube/config)")
	root.PersistentFlags().StringVarP(&a.namespace, "namespace", "n", "", "with --engine kubernetes (or render --target kubernetes): the `NAMESPACE` (default: the context's)")
	root.PersistentPreRunE = a.preRun
	root.Annotations = map[string]string{launches: "yes"}
	rootRun.register(root)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.AddCommand(
		newRun(a),
		newUp(a), newExec(a), newDown(a), newStop(a), newStart(a),
		newSupervise(a), newKeeper(a),
		newBuild(a),
		newDoctor(a),
		newLs(a),
		newGC(a),
		newRender(a),
		newValidate(a),
		newProfiles(a),
		newSchema(a),
		newInit(a),
		newTrust(a),
		newGateway(a), newGatewayLog(a), newPortRelay(a), newNetFence(a),
		newLogs(a),
		newRequests(a), newAllow(a), newDeny(a),
		newGrants(a),
		newApprove(a), newUI(a),
		newChanges(a), newDiff(a), newApply(a), newDiscard(a),
		newVersion(a),
		newBackground(a),
	)
	return root
}

// unknownCommand refuses the arguments of a command that only groups
// subcommands: they can only be a mistyped subcommand.
func unknownCommand(cmd *cobra.Command, args []string) error {
	if len(args) == 0 || cmd.ArgsLenAtDash() == 0 {
		return nil
	}
	err := usageError{fmt.Errorf("unknown command %q for %q", args[0], cmd.CommandPath())}
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		return withHint(err, "did you mean "+strings.Join(s, " or ")+"?")
	}
	return err
}

// usageError marks a mistake in how the command was called (exit 2).
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// hinted carries remediation, printed as hint: lines after the error.
type hinted struct {
	err   error
	hints []string
}

func (e hinted) Error() string { return e.err.Error() }
func (e hinted) Unwrap() error { return e.err }

// Hints are what to do about the error.
func (e hinted) Hints() []string { return e.hints }

func withHint(err error, hints ...string) error { return hinted{err, hints} }

// report prints err as `propio-sandbox: error: ...` lines with hints, and
// returns the exit code it calls for.
func report(w io.Writer, err error) int {
	var ec exitCode
	if errors.As(err, &ec) {
		return int(ec) // the sandbox's own exit code: it has said what it had to
	}
	code := ExitFailure
	var wc withCode
	if errors.As(err, &wc) {
		code = wc.code
	}
	var ue usageError
	if errors.As(err, &ue) || isCobraUsage(err) {
		code = ExitUsage
	}
	var hints []string
	var list profile.List
	if errors.As(err, &list) {
		prefix := strings.TrimSuffix(err.Error(), list.Error())
		prefix = strings.TrimSuffix(strings.TrimSpace(prefix), ":")
		if prefix != "" {
			fmt.Fprintf(w, "%s: error: %s:\n", name, termsafe.Inert(prefix))
		}
		for _, e := range list {
			fmt.Fprintf(w, "%s: error: %s\n", name, termsafe.Inert(e.Error()))
		}
		hints = list.Hints()
	} else {
		// One line a line of the error, each inert: an error may name
		// what a sandbox made (a path, a name).
		for _, line := range strings.Split(err.Error(), "\n") {
			fmt.Fprintf(w, "%s: error: %s\n", name, termsafe.Inert(line))
		}
	}
	hints = append(hints, hintsOf(err)...)
	if code == ExitUsage {
		hints = append(hints, "run `"+name+" help` for usage")
	}
	for _, hint := range hints {
		fmt.Fprintf(w, "%s: hint: %s\n", name, termsafe.Inert(hint))
	}
	return code
}

// hintsOf are the hints err carries: withHint's, else those of a domain
// error that has a Hints method (a profile.List's are printed with its
// errors).
func hintsOf(err error) []string {
	var h hinted
	if errors.As(err, &h) {
		return h.hints
	}
	var d interface{ Hints() []string }
	if errors.As(err, &d) {
		if _, list := d.(profile.List); !list {
			return d.Hints()
		}
	}
	return nil
}

// isCobraUsage recognises the argument errors cobra returns itself.
func isCobraUsage(err error) bool {
	msg := err.Error()
	// Cobra's own messages start so; an engine's error that quotes a
	// command's usage message somewhere inside is not a usage error of ours.
	for _, s := range []string{"unknown command", "unknown flag", "unknown shorthand flag", "accepts ", "requires at least", "requires at most", "flag needs an argument", "invalid argument"} {
		if strings.HasPrefix(msg, s) {
			return true
		}
	}
	return false
}

// env holds the directories and facts most subcommands need.
type env struct {
	dirs      hostinfo.Dirs
	workspace string
	locs      profile.Locations
	// grants are the unsafe grants of the profile loadSelected loaded,
	// which a user profile named in unsafe: run, render and trust show them.
	grants []profile.Grant
}

func loadEnv() (env, error) {
	se, err := sandbox.LoadEnv()
	if err != nil {
		return env{}, err
	}
	return env{dirs: se.Dirs, workspace: se.Workspace, locs: se.Locs}, nil
}

// sandbox is the environment as the launch package takes it.
func (e env) sandbox() sandbox.Env {
	return sandbox.Env{Dirs: e.dirs, Workspace: e.workspace, Locs: e.locs}
}

// loadSelected gathers the environment and loads the profile ref selects.
func loadSelected(ref string) (env, *profile.Profile, error) {
	e, err := loadEnv()
	if err != nil {
		return env{}, nil, err
	}
	p, err := e.loadProfile(ref)
	if err != nil {
		return e, nil, err
	}
	e.grants = p.Granted()
	return e, p, nil
}

// grantHost are the host facts that mount sources are judged on.
func (e env) grantHost() profile.GrantHost { return e.sandbox().GrantHost() }

// warnGrants prints a warning for each unsafe grant.
func (a *app) warnGrants(grants []profile.Grant) {
	for _, g := range grants {
		fmt.Fprintf(a.stderr, "%s: warning: %s\n", name, termsafe.Inert(g.String()))
	}
}

// loadProfile loads the profile a subcommand was pointed at, with every
// problem and a hint for a missing one.
func (e env) loadProfile(ref string) (*profile.Profile, error) {
	p, err := e.sandbox().Load(ref)
	if errors.Is(err, profile.ErrNotFound) {
		return nil, hintLoad(err)
	}
	if err != nil {
		return nil, hintLoad(fmt.Errorf("loading %s: %w", loading(ref), err))
	}
	return p, nil
}

// loading names the profile ref selects, for errors.
func loading(ref string) string {
	if ref == "" {
		return "the default profile"
	}
	return fmt.Sprintf("profile %q", ref)
}

// hintLoad adds what to do about a profile that could not be found or read.
func hintLoad(err error) error {
	var re *profile.ReadError
	switch {
	case errors.Is(err, profile.ErrNotFound):
		return withHint(err, "run `"+name+" profiles` to list the profiles there are")
	case errors.As(err, &re):
		return withHint(err, "a profile is a regular YAML file; if you did not make "+re.File+" what it is, a sandbox may have: remove it, and look at what else changed in the workspace")
	}
	return err
}
