package cli

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/engine"
	"github.com/propio/propio-sandbox/internal/fsutil"
	"github.com/propio/propio-sandbox/internal/gatewayimage"
	"github.com/propio/propio-sandbox/internal/guard"
	"github.com/propio/propio-sandbox/internal/hostinfo"
	"github.com/propio/propio-sandbox/internal/profile"
	"github.com/spf13/cobra"
)

func newRender(a *app) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "render [-p PROFILE] [-o FILE] [-- CMD...]",
		Short: "Print the compose YAML of exactly the project that run would start",
		Long: `Print the compose YAML of exactly the project that run would start, for the
current directory. Environment variables passed through are named, never valued.
The output is deterministic and loads with any Compose implementation.`,
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
			o := generator.Options{Project: generator.ProjectName(e.workspace, ""), Command: command}
			if p.Network.Mode == "allowlist" {
				if err := gatewayOptions(&o, e.dirs); err != nil {
					fmt.Fprintf(a.stderr, "%s: warning: %v; showing the gateway image as %s\n", name, err, generator.DefaultGatewayImage)
				}
			}
			// Podman's options differ; render shows them when the engine is
			// named (it does not ask an engine which one it is).
			podman := func(h *generator.Host) { h.Podman = cmp.Or(a.engine, p.Engine) == engine.Podman }
			project, err := e.project(p, a.stderr, o, podman)
			if err != nil {
				return err
			}
			out, err := generator.Render(project)
			if err != nil {
				return err
			}
			if missing := missingRequired(p); len(missing) > 0 {
				fmt.Fprintf(a.stderr, "%s: warning: required environment variables are not set: %s; run will refuse to start\n", name, strings.Join(missing, ", "))
			}
			if output == "" || output == "-" {
				_, err := a.stdout.Write(out)
				return err
			}
			return fsutil.WriteFileAtomic(output, out, 0o644)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "write to `FILE` instead of standard output (never half-written)")
	return cmd
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

// project gathers the host facts p needs and generates its Compose project;
// adjust adds what the launch found out itself (a forwarded SSH agent).
// Warnings about the workspace rules and the guard's notes go to stderr.
func (e env) project(p *profile.Profile, stderr io.Writer, o generator.Options, adjust ...func(*generator.Host)) (*types.Project, error) {
	gen, _, err := e.generate(p, stderr)
	if err != nil {
		return nil, err
	}
	return gen(o, adjust...)
}

// generateFunc generates a project of one profile for o, from host facts
// gathered once; adjust adds what the launch found out since.
type generateFunc func(o generator.Options, adjust ...func(*generator.Host)) (*types.Project, error)

// generate gathers the host facts p needs (the workspace walk for its
// patterns, the account files, the extra mounts, the guard's scan of the
// git directories) once, for every project a launch generates: the first,
// the one with the gateway's network, those of the declared checks. It
// prints the warnings about the workspace rules (rules not followed through
// a symbolic link) and the guard's notes to stderr. The guard's plan is for
// run to prepare and check.
func (e env) generate(p *profile.Profile, stderr io.Writer) (generateFunc, *guard.Plan, error) {
	host, warnings, err := hostinfo.Gather(p, e.workspace, e.dirs)
	for _, w := range warnings {
		fmt.Fprintf(stderr, "%s: warning: %s\n", name, w)
	}
	var me *hostinfo.MountsError
	if errors.As(err, &me) {
		return nil, nil, withHint(err, "write "+me.Var+" as SRC:DST[:ro|rw],... with absolute paths and existing sources, or unset it")
	}
	if err != nil {
		return nil, nil, err
	}
	plan := hostinfo.Guard(p, &host)
	for _, n := range plan.Notes() {
		fmt.Fprintf(stderr, "%s: warning: %s\n", name, n)
	}
	return func(o generator.Options, adjust ...func(*generator.Host)) (*types.Project, error) {
		h := host // the adjustments change only fields of its own
		for _, f := range adjust {
			f(&h)
		}
		// Its errors name the profile file, line and column already.
		return generator.Generate(p, h, o)
	}, &plan, nil
}

// Environment variables that change where the allowlist gateway comes from
// and goes out through.
const (
	// envGatewayBinary names a Linux build of propio-sandbox to make the
	// gateway image from, for a launcher that is not one (macOS).
	envGatewayBinary = "PROPIO_SANDBOX_GATEWAY_BINARY"
	// envGatewayNetwork names an existing network for the gateway's way out,
	// instead of one made for each sandbox.
	envGatewayNetwork = "PROPIO_SANDBOX_GATEWAY_NETWORK"
)

// gatewayBinary is the executable the gateway image is made of: this one,
// unless PROPIO_SANDBOX_GATEWAY_BINARY names another.
func gatewayBinary() (string, error) {
	if exe := os.Getenv(envGatewayBinary); exe != "" {
		return exe, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("finding this executable for the gateway image: %w", err)
	}
	return exe, nil
}

// gatewayOptions fills in the gateway's image and outside network.
func gatewayOptions(o *generator.Options, dirs hostinfo.Dirs) error {
	o.OutsideNetwork = os.Getenv(envGatewayNetwork)
	exe, err := gatewayBinary()
	if err != nil {
		return err
	}
	if o.GatewayImage, err = gatewayimage.CachedTag(exe, filepath.Join(dirs.State, "gateway-image")); err != nil {
		return err
	}
	return nil
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
