package cli

import (
	"fmt"
	"strings"

	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/buildinputs"
	"github.com/propio/propio-sandbox/internal/profile"
	"github.com/propio/propio-sandbox/internal/termsafe"
	"github.com/spf13/cobra"
)

func newTrust(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "trust [-p PATH]",
		Short: "Show what a repository profile grants, and trust it (and its build) as it is now",
		Long: `A profile checked in at .propio/sandbox.yaml lives in a workspace the agent can
write, so it must not widen its own sandbox: run refuses a repository profile that is
new or changed since it was last trusted. trust prints what the profile grants beyond
what it builds on outside the workspace (a built-in or a profile of yours, else the
defaults), a line per field, and records the hash of every file of its chain under
$XDG_STATE_HOME/propio-sandbox/.

A build whose Dockerfile or context is in the workspace (whatever profile it comes
from) reads files the agent can change: trust also records the Dockerfile, the
.dockerignore files and the files the Dockerfile copies by name, and build and
run --build refuse a build that changed since.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			e, p, err := loadSelected(a.profile)
			if err != nil {
				return err
			}
			a.warnGrants(e.grants)
			build, err := e.buildInputs(p)
			if err != nil {
				return err
			}
			needsTrust := profile.NeedsTrust(p, e.workspace)
			if !needsTrust && build == nil {
				fmt.Fprintf(a.stdout, "%s is not a repository profile: it needs no trust\n", p.Meta.File)
				return nil
			}
			var trusted *profile.Profile
			var records []profile.Record
			if needsTrust {
				if err := a.showGrants(p, e.workspace); err != nil {
					return err
				}
				for _, w := range p.WritesOutside(e.sandbox().GrantHost()) {
					fmt.Fprintf(a.stderr, "%s: warning: %s\n", name, w)
				}
				trusted = p
			}
			if build != nil {
				if needsTrust {
					fmt.Fprintln(a.stdout)
				}
				a.showBuild(p, build)
				records = append(records, profile.Record{Key: build.Key(), Digest: build.Digest(), Text: build.Manifest()})
			}
			if err := (profile.TrustStore{Dir: e.dirs.State}).Trust(trusted, records...); err != nil {
				return err
			}
			a.trusted(p, needsTrust, build != nil)
			return nil
		},
	}
}

// trusted says what trust recorded.
func (a *app) trusted(p *profile.Profile, profileToo, build bool) {
	switch {
	case profileToo && build:
		fmt.Fprintf(a.stdout, "\ntrusted %s and its build as they are now; any change to them needs trust again\n", p.Meta.File)
	case profileToo:
		fmt.Fprintf(a.stdout, "\ntrusted %s as it is now; any change to it needs trust again\n", p.Meta.File)
	default:
		fmt.Fprintf(a.stdout, "\ntrusted the build of %s as it is now; any change to it needs trust again\n", p.Meta.File)
	}
}

// showGrants prints what p grants beyond what it builds on outside the
// workspace (a built-in or a user profile, else the defaults), a line per
// field, and where to see the whole of it.
func (a *app) showGrants(p *profile.Profile, workspace string) error {
	base, err := p.TrustedBase(workspace)
	if err != nil {
		return err
	}
	lines, err := profile.Delta(base, p)
	if err != nil {
		return err
	}
	if len(lines) == 0 {
		fmt.Fprintf(a.stdout, "%s grants nothing beyond %s\n", p.Meta.File, base.Meta.File)
	} else {
		fmt.Fprintf(a.stdout, "%s grants, beyond %s:\n\n", p.Meta.File, base.Meta.File)
		for _, line := range lines {
			fmt.Fprintln(a.stdout, "    "+termsafe.Inert(line)) // a repository's words
		}
	}
	fmt.Fprintf(a.stdout, "\nthe whole profile, after extends (%s): `%s profiles show %s`\n", chainComment(p), name, p.Meta.File)
	return nil
}

// showBuild prints what p's build reads of the workspace.
func (a *app) showBuild(p *profile.Profile, build *buildinputs.Inputs) {
	fmt.Fprintf(a.stdout, "the build of %s reads, of the workspace (context %s):\n\n", p.Meta.File, build.Context)
	for _, f := range build.Files {
		fmt.Fprintf(a.stdout, "    %s\n", termsafe.Inert(build.Show(f)))
	}
	fmt.Fprintln(a.stdout, "\n(files it copies as a directory or by a wildcard are not recorded: a step that runs one runs what is there at build time)")
}

// buildInputs collects what p's build reads that trust covers, when its
// Dockerfile or context is in the workspace; nil when p has no build or it
// reads nothing of the workspace.
func (e env) buildInputs(p *profile.Profile) (*buildinputs.Inputs, error) {
	if p.Build == nil {
		return nil, nil
	}
	ctx, df := generator.BuildPaths(p, e.sandbox().BuildHost(p))
	paths := buildinputs.Paths{Context: ctx, Dockerfile: df}
	if !paths.InWorkspace(e.workspace) {
		return nil, nil
	}
	in, err := buildinputs.Collect(paths)
	if err != nil {
		return nil, withHint(err, "the build reads it from the workspace, where a sandbox may have made it: remove it, or make it a regular file")
	}
	return in, nil
}

// chainComment describes an extends chain: leaf, then what it extends.
func chainComment(p *profile.Profile) string {
	files := make([]string, len(p.Meta.Chain))
	for i, s := range p.Meta.Chain {
		files[i] = s.File
	}
	return strings.Join(files, " extends ")
}
