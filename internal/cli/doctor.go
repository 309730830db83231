package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/propio/propio-sandbox/internal/gitindex"
	"github.com/propio/propio-sandbox/internal/hostinfo"
	"github.com/propio/propio-sandbox/internal/preflight"
	"github.com/propio/propio-sandbox/internal/profile"
	"github.com/propio/propio-sandbox/internal/sandbox"
	"github.com/propio/propio-sandbox/internal/termsafe"
	"github.com/spf13/cobra"
)

// doctorReport is the shape `doctor --json` prints, which
// schema/doctor.schema.json describes.
type doctorReport struct {
	Profile   string             `json:"profile"`
	Workspace string             `json:"workspace"`
	OK        bool               `json:"ok"`
	Checks    []preflight.Result `json:"checks"`
	// Warnings are what does not fail a check but weakens the profile
	// here: workspace rules not followed through a symbolic link, hidden
	// files that git tracks.
	Warnings []string `json:"warnings"`
}

func newDoctor(a *app) *cobra.Command {
	var asJSON, build bool
	cmd := &cobra.Command{
		Use:   "doctor [-p PROFILE] [--json]",
		Short: "Run every preflight check of the profile here, and show what passes and what fails",
		Long: `Run every preflight check that run passes before it creates anything (engine,
image, workspace, mounts, required environment variables, host ports, trust,
resources, runtime) and print each one's result, reason and hint. With --engine
kubernetes: the workspace, trust and required variables, then the cluster's
own facts, and a probe of whether its CNI enforces NetworkPolicy (a warning
when it does not: two Pods and a policy, made and removed in the namespace). Unlike run, it
does not stop at the first failure. It exits 0 only when every check passes.
Warnings follow the table: workspace rules that are not followed through a
symbolic link, and hidden files that git tracks (the repository holds their
content, which the sandbox can read); they do not change the exit code.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			e, p, err := loadSelected(a.profile)
			if err != nil {
				return err
			}
			warnings := append([]string{}, workspaceWarnings(e, p)...) // [] in JSON when none
			var results []preflight.Result
			if a.engine == sandbox.Kubernetes {
				var more []string
				results, more, err = sandbox.DoctorCluster(context.Background(), e.sandbox(), p, a.profile, a.cluster())
				if err != nil {
					return hintError(err, p, a.profile)
				}
				warnings = append(warnings, more...)
			} else if results, err = a.doctorChecks(e, p, build); err != nil {
				return err
			}
			rep := doctorReport{Profile: p.Meta.File, Workspace: e.workspace, OK: preflight.OK(results), Checks: results, Warnings: warnings}
			if err := a.printDoctor(rep, asJSON); err != nil {
				return err
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

// workspaceWarnings are doctor's warnings about the workspace: the rules
// Match did not follow through a symbolic link, then each hidden path that
// the workspace's git repository tracks, read from its index (git itself
// is never run: the sandbox may have written its configuration).
func workspaceWarnings(e env, p *profile.Profile) []string {
	matches, warnings, err := hostinfo.Match(e.workspace, p)
	if err != nil {
		return append(warnings, fmt.Sprintf("cannot match the workspace rules: %v", err))
	}
	if len(p.Workspace.Hide) == 0 {
		return warnings
	}
	tracked, err := gitindex.Tracked(e.workspace)
	switch {
	case errors.Is(err, gitindex.ErrNoRepository):
		return warnings
	case err != nil:
		return append(warnings, fmt.Sprintf("cannot tell which hidden files git tracks: %v", err))
	}
	for _, rel := range hostinfo.HiddenTracked(p.Workspace.Hide, matches, tracked) {
		rel = printable(rel)
		warnings = append(warnings, fmt.Sprintf("%s is hidden but tracked by git: the repository holds its content, which the sandbox can read (git show :%s)", rel, rel))
	}
	return warnings
}

// printable returns s as it is when it prints as itself, else quoted: a
// path in the workspace, or in an index the sandbox wrote, may hold
// terminal escapes.
func printable(s string) string {
	if i, _ := termsafe.Find(s); i < 0 {
		return s
	}
	return strconv.Quote(s)
}

// doctorChecks runs every built-in check, then, when they all pass, the
// profile's own.
func (a *app) doctorChecks(e env, p *profile.Profile, build bool) ([]preflight.Result, error) {
	f := a.preflight(e, p, build)
	f.ChangesetMode = sandbox.DoctorChangesetMode(e.sandbox())
	f.Fresh = true
	defer func() { f.Conn.Close() }() // f.Conn is set by the checks, later
	ctx := context.Background()
	results := preflight.RunAll(ctx, f.Checks())
	if len(p.Checks) == 0 {
		return results, nil
	}
	if !preflight.OK(results) {
		for _, c := range p.Checks {
			results = append(results, preflight.Result{Name: c.Name, Reason: "not run: a built-in check failed", Hints: []string{"fix the failing built-in checks first"}})
		}
		return results, nil
	}
	plan, err := sandbox.NewPlan(e.sandbox(), p) // its warnings are in the report already
	if err != nil {
		return nil, hintError(err, p, a.profile)
	}
	declared, err := f.Declared(plan, reporter{io.Discard})
	if err != nil {
		return nil, hintError(err, p, a.profile)
	}
	return append(results, preflight.RunAll(ctx, declared)...), nil
}

// printDoctor prints doctor's report: a table and the warnings, or JSON.
func (a *app) printDoctor(rep doctorReport, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(termsafe.JSON(a.stdout))
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tRESULT\tREASON\tHINT")
	for _, r := range rep.Checks {
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
	for _, w := range rep.Warnings {
		fmt.Fprintf(a.stdout, "warning: %s\n", w)
	}
	return nil
}
