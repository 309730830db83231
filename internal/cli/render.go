package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/fsutil"
	"github.com/propio/propio-sandbox/internal/kube"
	"github.com/propio/propio-sandbox/internal/preflight"
	"github.com/propio/propio-sandbox/internal/profile"
	"github.com/propio/propio-sandbox/internal/sandbox"
	"github.com/spf13/cobra"
)

func newRender(a *app) *cobra.Command {
	var output, target string
	var kr kubeRender
	cmd := &cobra.Command{
		Use:   "render [-p PROFILE] [--target compose|kubernetes] [-o FILE] [-- CMD...]",
		Short: "Print the compose YAML of exactly the project that run would start",
		Long: `Print the compose YAML of exactly the project that run would start, for the
current directory. Environment variables passed through are named, never valued.
The output is deterministic and loads with any Compose implementation.

With --target kubernetes, print instead the Kubernetes objects that run the
sandbox on a cluster: its Pod, its NetworkPolicy, the Secret that carries the
environment (its keys, never its values) and the ConfigMap of its files.
With --as sandbox, the Pod is carried by a Sandbox of kubernetes-sigs/agent-sandbox
(agents.x-k8s.io/v1alpha1); with --as template, by a SandboxTemplate and a
SandboxClaim of it: their pod template is the Pod's labels, annotations and
spec, unchanged. With --server-dry-run, the cluster's API server (the
kubeconfig's, --kube-context, -n) admits every object by its server-side dry
run, storing nothing, before anything is printed.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			command, err := commandAfterDash(cmd, args)
			if err != nil {
				return err
			}
			e, p, err := loadSelected(a.profile)
			if err != nil {
				return err
			}
			a.warnGrants(e.grants)
			kr.namespace = a.namespace
			out, err := a.renderTarget(cmd.Context(), e, p, command, target, kr)
			if err != nil {
				return err
			}
			if missing := missingRequired(p); len(missing) > 0 {
				fmt.Fprintf(a.stderr, "%s: warning: required environment variables are not set: %s; run will refuse to start\n", name, strings.Join(missing, ", "))
			}
			missing, _ := preflight.MissingMounts(p, e.sandbox().BuildHost(p), os.Stat)
			for _, m := range missing {
				fmt.Fprintf(a.stderr, "%s: warning: %s; run will refuse to start\n", name, m)
			}
			if output == "" || output == "-" {
				_, err := a.stdout.Write(out)
				return err
			}
			return fsutil.WriteFileAtomic(output, out, 0o644)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "write to `FILE` instead of standard output (never half-written)")
	cmd.Flags().StringVar(&target, "target", "compose", "what to render: compose, or kubernetes (the objects of a cluster)")
	cmd.Flags().StringVar(&kr.as, "as", "", "with --target kubernetes: what carries the sandbox's Pod: pod (default), sandbox (an agent-sandbox Sandbox) or template (a SandboxTemplate and a SandboxClaim)")
	cmd.Flags().BoolVar(&kr.dryRun, "server-dry-run", false, "with --target kubernetes: have the cluster's API server admit every object (server-side dry run, nothing stored) before printing them")
	return cmd
}

// kubeRender are render's choices for --target kubernetes.
type kubeRender struct {
	namespace string // -n
	as        string // --as
	dryRun    bool   // --server-dry-run
}

// renderTarget renders p for the target named: the compose project, or
// the objects of a cluster.
func (a *app) renderTarget(ctx context.Context, e env, p *profile.Profile, command []string, target string, kr kubeRender) ([]byte, error) {
	switch target {
	case "compose", "":
		switch {
		case kr.namespace != "":
			return nil, usageError{fmt.Errorf("--namespace is for --target kubernetes")}
		case kr.as != "":
			return nil, usageError{fmt.Errorf("--as is for --target kubernetes")}
		case kr.dryRun:
			return nil, usageError{fmt.Errorf("--server-dry-run is for --target kubernetes")}
		case a.kubeContext != "":
			return nil, usageError{fmt.Errorf("--kube-context %s names a kubeconfig's context: give --engine kubernetes too (or render --target kubernetes --server-dry-run)", a.kubeContext)}
		}
		project, err := a.renderProject(e, p, command)
		if err != nil {
			return nil, err
		}
		return generator.Render(project)
	case "kubernetes":
		switch kr.as {
		case "", generator.KubeAsPod, generator.KubeAsSandbox, generator.KubeAsTemplate:
		default:
			return nil, usageError{fmt.Errorf("--as %q: choose pod, sandbox or template", kr.as)}
		}
		if a.kubeContext != "" && !kr.dryRun {
			return nil, usageError{fmt.Errorf("--kube-context %s names a kubeconfig's context: render asks a cluster only with --server-dry-run", a.kubeContext)}
		}
		objs, err := a.renderKubernetes(e, p, command, kr)
		if err != nil {
			return nil, err
		}
		out, err := generator.RenderKubernetes(objs)
		if err != nil {
			return nil, err
		}
		if kr.dryRun {
			if err := a.serverDryRun(ctx, p, objs); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	return nil, usageError{fmt.Errorf("--target %q: choose compose or kubernetes", target)}
}

// renderKubernetes generates the objects run would create on a cluster
// for p here.
func (a *app) renderKubernetes(e env, p *profile.Profile, command []string, kr kubeRender) (*generator.KubeObjects, error) {
	o := generator.Options{Project: generator.ProjectName(e.workspace, ""), Command: command}
	if p.Network.Mode == "allowlist" {
		a.gatewayImage(e, &o)
	}
	plan, err := sandbox.NewPlan(e.sandbox(), p)
	if err != nil {
		return nil, hintError(err, p, a.profile)
	}
	for _, w := range plan.Warnings {
		reporter{a.stderr}.Warn(w)
	}
	objs, err := plan.Kubernetes(o, generator.KubeOptions{Namespace: kr.namespace, As: kr.as})
	if err != nil {
		return nil, hintError(err, p, a.profile)
	}
	return objs, nil
}

// serverDryRun has the cluster's API server admit objs by its server-side
// dry run.
func (a *app) serverDryRun(ctx context.Context, p *profile.Profile, objs *generator.KubeObjects) error {
	c, err := sandbox.ConnectCluster(a.cluster())
	if err != nil {
		return engineHint(err, p, a.profile)
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err = c.DryRun(ctx, objs.List())
	if errors.Is(err, kube.ErrKindNotServed) {
		return withHint(err,
			"install the CustomResourceDefinitions of kubernetes-sigs/agent-sandbox (k8s/crds in its release, v0.1.0 or later) on the cluster, or render the bare Pod without --as")
	}
	return err
}

// gatewayImage names in o the gateway's image run would use (this
// executable's), or warns and leaves the default.
func (a *app) gatewayImage(e env, o *generator.Options) {
	if err := sandbox.GatewayOptions(o, e.dirs); err != nil {
		fmt.Fprintf(a.stderr, "%s: warning: %v; showing the gateway image as %s\n", name, err, generator.DefaultGatewayImage)
	}
}

// commandAfterDash returns the arguments after --, and refuses any before it.
func commandAfterDash(cmd *cobra.Command, args []string) ([]string, error) {
	dash := cmd.ArgsLenAtDash()
	switch {
	case len(args) == 0:
		return nil, nil
	case dash != 0:
		return nil, usageError{fmt.Errorf("unexpected argument %q: put the command after --, as in `%s -- CMD...`", args[0], cmd.CommandPath())}
	}
	return args, nil
}

// missingRequired lists the required variables the launcher's environment lacks.
func missingRequired(p *profile.Profile) []string {
	var missing []string
	for _, name := range p.Env.Required {
		if _, ok := os.LookupEnv(name); !ok {
			missing = append(missing, name)
		}
	}
	return missing
}

// renderProject generates the project run would start for p here, with
// the engine the user names (it does not ask an engine which one it is).
func (a *app) renderProject(e env, p *profile.Profile, command []string) (*types.Project, error) {
	o := generator.Options{Project: generator.ProjectName(e.workspace, ""), Command: command}
	if p.Network.Mode == "allowlist" {
		a.gatewayImage(e, &o)
	}
	plan, err := sandbox.NewPlan(e.sandbox(), p)
	if err != nil {
		return nil, hintError(err, p, a.profile)
	}
	for _, w := range plan.Warnings {
		reporter{a.stderr}.Warn(w)
	}
	// Podman's options differ; render shows them when the engine is named.
	kind := cmp.Or(a.engine, p.Engine)
	if a.context != "" {
		kind = sandbox.Docker // a Docker context's engine, whatever the profile says
	}
	facts := func(h *generator.Host) { h.Engine = sandbox.EngineFactsOf(kind) }
	return plan.Generate(o, facts)
}
