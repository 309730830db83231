package cli

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/propio/propio-sandbox/internal/grants"
	"github.com/propio/propio-sandbox/internal/profile"
	"github.com/propio/propio-sandbox/internal/termsafe"
	"github.com/spf13/cobra"
)

func newGrants(a *app) *cobra.Command {
	var jsonOut, all bool
	cmd := &cobra.Command{
		Use:   "grants [list] [--json] [--all]",
		Short: "List your \"always\" decisions for this workspace (grants), remove one, or save one into a profile",
		Long: `A decision made for always (allow --for always, deny --for always, or in approve
or ui) is a grant: it is kept in a file of yours per workspace, outside the
workspace, under $XDG_CONFIG_HOME/propio-sandbox/grants/, and merged into the rules
of the workspace's allowlist sandboxes at every launch (render shows them, named
grant:FILE:N). A deny grant wins over every allow; a profile's network.deny wins
over an allow grant; what no rule can allow stays denied.

grants lists the grants of this workspace (--all: of every workspace), grants rm
removes one, grants save writes one into your profile file.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return a.grantsList(jsonOut, all) },
	}
	cmd.Flags().BoolVar(&jsonOut, "json", false, "print a JSON array, one object per grant")
	cmd.Flags().BoolVar(&all, "all", false, "list the grants of every workspace")
	list := &cobra.Command{
		Use:   "list [--json] [--all]",
		Short: "List the grants of this workspace",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return a.grantsList(jsonOut, all) },
	}
	list.Flags().BoolVar(&jsonOut, "json", false, "print a JSON array, one object per grant")
	list.Flags().BoolVar(&all, "all", false, "list the grants of every workspace")
	cmd.AddCommand(list, newGrantsAdd(a), newGrantsRm(a), newGrantsSave(a))
	return cmd
}

func newGrantsRm(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "rm N|HOST[:PORT]",
		Short: "Remove a grant of this workspace: by number, all of a host's, or a host's on one port",
		Long: `Remove grant N (as grants lists it), every grant of HOST, or the grant of HOST on
PORT (HOST:0 the one of ports 80 and 443). A sandbox that is running keeps the
rules it started with; the next launch goes without the grant.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			e, err := loadEnv()
			if err != nil {
				return err
			}
			removed, err := grants.Remove(e.dirs, e.workspace, args[0])
			if errors.Is(err, grants.ErrNoMatch) {
				return withHint(err, "`"+name+" grants` lists the grants of this workspace; run it in the workspace the grant was made in (--all lists every workspace's)")
			}
			if err != nil {
				return err
			}
			for _, g := range removed {
				fmt.Fprintf(a.stdout, "removed grant %d: %s %s\n", g.N, g.Action, g.Rule())
			}
			fmt.Fprintln(a.stdout, "a sandbox running now keeps its rules; the next launch goes without it")
			return nil
		},
	}
}

// grantJSON is a grant as grants --json prints it.
type grantJSON struct {
	N         int        `json:"n"`
	Action    string     `json:"action"`
	Host      string     `json:"host"`
	Port      int        `json:"port"`
	Rule      string     `json:"rule"`
	Decided   *time.Time `json:"decided,omitempty"`
	By        string     `json:"by,omitempty"`
	Workspace string     `json:"workspace"`
	File      string     `json:"file"`
}

// grantsList prints the grants of this workspace, or of all.
func (a *app) grantsList(jsonOut, all bool) error {
	e, err := loadEnv()
	if err != nil {
		return err
	}
	var sets []grants.Set
	if all {
		sets, err = grants.All(e.dirs)
	} else {
		var s grants.Set
		s, err = grants.Load(e.dirs, e.workspace)
		sets = []grants.Set{s}
	}
	if err != nil {
		return withHint(err, "fix the line it names, or remove the file to drop every grant of its workspace")
	}
	if jsonOut {
		return a.grantsJSON(sets)
	}
	n := 0
	for _, s := range sets {
		if len(s.Grants) == 0 {
			continue
		}
		if n > 0 {
			fmt.Fprintln(a.stdout)
		}
		n++
		a.grantsTable(s)
	}
	if n == 0 && !all {
		fmt.Fprintf(a.stdout, "no grants for %s: a decision made for always (allow --for always, deny --for always) is kept in %s\n", e.workspace, sets[0].File)
	} else if n == 0 {
		fmt.Fprintf(a.stdout, "no grants in %s\n", grants.Dir(e.dirs))
	}
	return nil
}

// grantsTable prints the grants of one workspace.
func (a *app) grantsTable(s grants.Set) {
	fmt.Fprintf(a.stdout, "grants of %s (%s):\n", s.Workspace, s.File)
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "N\tACTION\tRULE\tDECIDED\tBY")
	for _, g := range s.Grants {
		decided := "-"
		if !g.Decided.IsZero() {
			decided = g.Decided.UTC().Format("2006-01-02 15:04 UTC")
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", g.N, g.Action, g.Rule(), decided, orDash(g.By))
	}
	tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// grantsJSON prints every grant of sets as one JSON array.
func (a *app) grantsJSON(sets []grants.Set) error {
	out := []grantJSON{}
	for _, s := range sets {
		for _, g := range s.Grants {
			j := grantJSON{N: g.N, Action: g.Action, Host: g.Host, Port: g.Port, Rule: g.Rule(), By: g.By, Workspace: s.Workspace, File: s.File}
			if !g.Decided.IsZero() {
				d := g.Decided.UTC()
				j.Decided = &d
			}
			out = append(out, j)
		}
	}
	enc := json.NewEncoder(termsafe.JSON(a.stdout))
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

func newGrantsSave(a *app) *cobra.Command {
	var yes bool
	cmd := &cobra.Command{
		Use:   "save N|HOST[:PORT] [-p PROFILE] [--yes]",
		Short: "Write a grant into your profile file (network.allow, or network.deny), after showing the diff",
		Long: `Write a grant of this workspace into the profile file run uses here (or -p's):
an allow grant into network.allow, a deny grant into network.deny, as a patch at
the right line that keeps the file's comments and layout. It shows the diff and
asks before it writes (--yes: without asking; with no answer on standard input it
refuses). Never a built-in profile; a repository profile (.propio/sandbox.yaml) only
when it is yours and trusted as it is now, and then it is trusted again with the
patch, in the same step. The grant stays in your grants: grants rm removes it.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error { return a.grantsSave(args[0], yes) },
	}
	cmd.Flags().BoolVarP(&yes, "yes", "y", false, "write without asking")
	return cmd
}

// grantsSave writes the grant sel names into the selected profile's file.
func (a *app) grantsSave(sel string, yes bool) error {
	e, p, err := loadSelected(a.profile)
	if err != nil {
		return err
	}
	gs, err := grants.For(e.dirs, e.workspace)
	if err != nil {
		return withHint(err, "fix the line it names, or remove the file to drop every grant of this workspace")
	}
	g, err := grants.Select(gs, sel)
	if errors.Is(err, grants.ErrNoMatch) {
		return withHint(err, "`"+name+" grants` lists the grants of this workspace")
	}
	if err != nil {
		return err
	}
	store := profile.TrustStore{Dir: e.dirs.State}
	s, err := grants.PlanSave(p, e.workspace, store, g)
	if err != nil {
		return saveHint(err, p)
	}
	fmt.Fprint(a.stdout, s.Diff())
	if !yes {
		if err := a.confirm(fmt.Sprintf("write this to %s?", s.File)); err != nil {
			return err
		}
	}
	reload := func() (*profile.Profile, error) { return e.loadProfile(a.profile) }
	if err := s.Apply(reload, store); err != nil {
		return err
	}
	fmt.Fprintf(a.stdout, "saved grant %d (%s) to %s:%d (%s)\n", g.N, g.Rule(), s.File, s.Line(), s.List)
	if s.Trust {
		fmt.Fprintf(a.stdout, "trusted %s as it is now\n", s.File)
	}
	fmt.Fprintf(a.stdout, "the grant stays in your grants too: `%s grants rm %d` removes it\n", name, g.N)
	return nil
}

// saveHint says what to do about a profile grants save cannot edit.
func saveHint(err error, p *profile.Profile) error {
	switch {
	case errors.Is(err, grants.ErrBuiltin):
		base := strings.TrimPrefix(p.Meta.File, "builtin:")
		return withHint(err, "make a profile of your own that extends it, `"+name+" init --extends "+base+"`, and save the grant there; or name a file of yours with -p")
	case errors.Is(err, grants.ErrAlreadyThere):
		return withHint(err, "nothing to save; `"+name+" grants rm` removes the grant, if you want the profile's rule alone")
	case errors.Is(err, grants.ErrNotEditable):
		return withHint(err, "name a profile file of yours with -p, or add the rule by hand")
	}
	return err
}

// confirm asks question on standard error and reads the answer from
// standard input: only y or yes goes on.
func (a *app) confirm(question string) error {
	fmt.Fprintf(a.stderr, "%s [y/N] ", question)
	var answer string
	if a.stdin != nil {
		line, err := bufio.NewReader(a.stdin).ReadString('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		answer = strings.ToLower(strings.TrimSpace(line))
	}
	fmt.Fprintln(a.stderr)
	switch answer {
	case "y", "yes":
		return nil
	case "":
		return withHint(errors.New("not confirmed: nothing was written"), "answer y on standard input, or pass --yes")
	}
	return errors.New("not confirmed: nothing was written")
}

func newGrantsAdd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "add allow|deny HOST[:PORT]",
		Short: "Make a grant for this workspace without waiting for a sandbox to ask",
		Long: `Make a grant for this workspace, as allow --for always or deny --for always would:
HOST is a name, *.name or an address, as network.allow takes them; without :PORT
the grant is for ports 80 and 443. It replaces a grant of the same HOST and PORT.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			e, err := loadEnv()
			if err != nil {
				return err
			}
			host, port, err := grants.SplitRule(args[1])
			if err != nil {
				return usageError{err}
			}
			g, err := grants.Put(e.dirs, e.workspace, grants.Grant{Action: args[0], Host: host, Port: port, By: "grants add"})
			if err != nil {
				return usageError{err}
			}
			fmt.Fprintf(a.stdout, "grant %d: %s %s, for the sandboxes of %s from their next launch\n", g.N, g.Action, g.Rule(), e.workspace)
			return nil
		},
	}
}
