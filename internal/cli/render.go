package cli

import (
	"cmp"
	"fmt"
	"os"
	"strings"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/fsutil"
	"github.com/propio/propio-sandbox/internal/preflight"
	"github.com/propio/propio-sandbox/internal/profile"
	"github.com/propio/propio-sandbox/internal/sandbox"
	"github.com/spf13/cobra"
)

func newRender(a *app) *cobra.Command {
	var output, target string
	cmd := &cobra.Command{
		Use:   "render [-p PROFILE] [--target compose|kubernetes] [-o FILE] [-- CMD...]",
		Short: "Print the compose YAML of exactly the project that run would start",
		Long: `Print the compose YAML of exactly the project that run would start, for the
current directory. Environment variables passed through are named, never valued.
The output is deterministic and loads with any Compose implementation.

With --target kubernetes, print instead the Kubernetes objects that run the
sandbox on a cluster: its Pod, its NetworkPolicy, the Secret that carries the
environment (its keys, never its values) and the ConfigMap of its files.`,
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
			out, err := a.renderTarget(e, p, command, target, a.namespace)
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
	return cmd
}

// renderTarget renders p for the target named: the compose project, or
// the objects of a cluster.
func (a *app) renderTarget(e env, p *profile.Profile, command []string, target, namespace string) ([]byte, error) {
	switch target {
	case "compose", "":
		if namespace != "" {
			return nil, usageError{fmt.Errorf("--namespace is for --target kubernetes")}
		}
		project, err := a.renderProject(e, p, command)
		if err != nil {
			return nil, err
		}
		return generator.Render(project)
	case "kubernetes":
		objs, err := a.renderKubernetes(e, p, command, namespace)
		if err != nil {
			return nil, err
		}
		return generator.RenderKubernetes(objs)
	}
	return nil, usageError{fmt.Errorf("--target %q: choose compose or kubernetes", target)}
}

// renderKubernetes generates the objects run would create on a cluster
// for p here.
func (a *app) renderKubernetes(e env, p *profile.Profile, command []string, namespace string) (*generator.KubeObjects, error) {
	o := generator.Options{Project: generator.ProjectName(e.workspace, ""), Command: command}
	plan, err := sandbox.NewPlan(e.sandbox(), p)
	if err != nil {
		return nil, hintError(err, p, a.profile)
	}
	for _, w := range plan.Warnings {
		reporter{a.stderr}.Warn(w)
	}
	objs, err := plan.Kubernetes(o, generator.KubeOptions{Namespace: namespace})
	if err != nil {
		return nil, hintError(err, p, a.profile)
	}
	return objs, nil
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
		if err := sandbox.GatewayOptions(&o, e.dirs); err != nil {
			fmt.Fprintf(a.stderr, "%s: warning: %v; showing the gateway image as %s\n", name, err, generator.DefaultGatewayImage)
		}
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
