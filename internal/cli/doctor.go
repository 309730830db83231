package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/engine"
	"github.com/propio/propio-sandbox/internal/preflight"
	"github.com/spf13/cobra"
)

// doctorReport is the shape `doctor --json` prints, which
// schema/doctor.schema.json describes.
type doctorReport struct {
	Profile   string             `json:"profile"`
	Workspace string             `json:"workspace"`
	OK        bool               `json:"ok"`
	Checks    []preflight.Result `json:"checks"`
}

func newDoctor(a *app) *cobra.Command {
	var asJSON, build bool
	cmd := &cobra.Command{
		Use:   "doctor [-p PROFILE] [--json]",
		Short: "Run every preflight check of the profile here, and show what passes and what fails",
		Long: `Run every preflight check that run passes before it creates anything (engine,
image, workspace, mounts, required environment variables, host ports, trust,
resources, runtime) and print each one's result, reason and hint. Unlike run, it
does not stop at the first failure. It exits 0 only when every check passes.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			e, p, err := loadSelected(a.profile)
			if err != nil {
				return err
			}
			var conn engineConn
			defer conn.close()
			ctx := context.Background()
			results := preflight.RunAll(ctx, a.preflightChecks(e, p, build, &conn, true))
			// The profile's own checks need the engine, and the agent's image.
			if len(p.Checks) > 0 && preflight.OK(results) {
				podman := func(h *generator.Host) {
					h.Podman = conn.eng.Kind == engine.Podman
					h.KeepID = h.Podman && conn.eng.Rootless
				}
				o := generator.Options{Project: generator.ProjectName(e.workspace, "")}
				if p.Network.Mode == "allowlist" {
					if err := gatewayOptions(&o, e.dirs); err != nil {
						return err
					}
				}
				gen, err := e.generate(p)
				if err != nil {
					return err
				}
				results = append(results, preflight.RunAll(ctx, a.declaredChecks(conn.eng, e, p, o, gen, podman, nil))...)
			} else {
				for _, c := range p.Checks {
					results = append(results, preflight.Result{Name: c.Name, Reason: "not run: a built-in check failed", Hints: []string{"fix the failing built-in checks first"}})
				}
			}
			rep := doctorReport{Profile: p.Meta.File, Workspace: e.workspace, OK: preflight.OK(results), Checks: results}
			if asJSON {
				enc := json.NewEncoder(a.stdout)
				enc.SetIndent("", "  ")
				if err := enc.Encode(rep); err != nil {
					return err
				}
			} else {
				tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "NAME\tRESULT\tREASON\tHINT")
				for _, r := range results {
					result := "pass"
					if !r.OK {
						result = "fail"
					}
					hint := strings.Join(r.Hints, "; ")
					if hint == "" {
						hint = "-"
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.Name, result, r.Reason, hint)
				}
				if err := tw.Flush(); err != nil {
					return err
				}
			}
			if !rep.OK {
				return exitCode(ExitFailure)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the results as JSON (see `"+name+" schema doctor`)")
	cmd.Flags().BoolVar(&build, "build", false, "check as for run --build: an image the profile can build need not be there yet")
	return cmd
}
