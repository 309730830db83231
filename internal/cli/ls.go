package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/propio/propio-sandbox/internal/hostinfo"
	"github.com/propio/propio-sandbox/internal/sandbox"
	"github.com/propio/propio-sandbox/internal/termsafe"
	"github.com/spf13/cobra"
)

func newLs(a *app) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "ls [--json] [--engine kubernetes [-n NAMESPACE]]",
		Short: "List the sandboxes on the engine, and the persistent ones: project, name, workspace, profile, launcher, state",
		Long: `List the sandboxes on the engine, and your persistent sandboxes (up) as their records
say, stopped and gone ones too. When the engine does not answer, the persistent
sandboxes are listed from their records, and ls fails with the engine's error.
With --engine kubernetes: the sandboxes in the cluster's namespace.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return a.ls(asJSON) },
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func (a *app) ls(asJSON bool) error {
	if a.engine == sandbox.Kubernetes {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		list, err := sandbox.ListCluster(ctx, a.cluster())
		if err != nil {
			return hintError(err, nil, "")
		}
		return a.lsPrint(list, asJSON)
	}
	dirs, err := hostinfo.UserDirs()
	if err != nil {
		return err
	}
	var list []sandbox.Sandbox
	err = a.withEngine(func(ctx context.Context, c *sandbox.Conn) (err error) {
		list, err = sandbox.List(ctx, c, dirs)
		return err
	})
	if err != nil {
		// The persistent sandboxes, as their records say, then the error.
		if list, rerr := sandbox.ListRecords(dirs); rerr == nil && len(list) > 0 {
			a.lsPrint(list, asJSON)
		}
		return err
	}
	return a.lsPrint(list, asJSON)
}

// lsPrint prints the sandboxes as JSON or as a table.
func (a *app) lsPrint(list []sandbox.Sandbox, asJSON bool) error {
	if !asJSON {
		return a.lsTable(list)
	}
	if list == nil {
		list = []sandbox.Sandbox{}
	}
	enc := json.NewEncoder(termsafe.JSON(a.stdout))
	enc.SetIndent("", "  ")
	return enc.Encode(list)
}

// lsTable prints the sandboxes as a table: a persistent sandbox's NAME,
// its supervisor as its launcher, and why it is as it is.
func (a *app) lsTable(list []sandbox.Sandbox) error {
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PROJECT\tNAME\tWORKSPACE\tPROFILE\tLAUNCHER\tSTATE\tCREATED")
	for _, s := range list {
		launcher, nm := strconv.Itoa(s.PID), "-"
		switch {
		case s.Persistent && s.PID == 0:
			launcher = "-"
		case !s.Alive:
			launcher += " (gone)"
		}
		if s.Persistent {
			nm = s.Name
		}
		state := s.State
		if s.Why != "" {
			state += " (" + s.Why + ")"
		}
		tableRow(tw, s.Project, nm, s.Workspace, s.Profile, launcher, state, s.Created.Format(time.DateTime))
	}
	return tw.Flush()
}

func newGC(a *app) *cobra.Command {
	var prepared bool
	cmd := &cobra.Command{
		Use:   "gc [--prepared] [--engine kubernetes [-n NAMESPACE]]",
		Short: "Remove what sandboxes of killed launchers left behind (containers, networks, volumes); stop persistent sandboxes whose supervisor was killed",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return a.gc(prepared) },
	}
	cmd.Flags().BoolVar(&prepared, "prepared", false, "also remove the gateways prepared ahead for the next runs (of all your workspaces)")
	return cmd
}

// gc removes what killed launchers left, stops the persistent sandboxes
// whose supervisor was killed, and, with prepared, the gateways prepared
// ahead.
func (a *app) gc(prepared bool) error {
	if a.engine == sandbox.Kubernetes {
		return a.gcCluster(prepared)
	}
	dirs, err := hostinfo.UserDirs()
	if err != nil {
		return err
	}
	var done sandbox.Collected
	var ahead []string
	err = a.withEngine(func(ctx context.Context, c *sandbox.Conn) (err error) {
		if prepared {
			ahead, err = sandbox.DiscardPrepared(ctx, dirs)
			for _, p := range ahead {
				fmt.Fprintf(a.stdout, "removed %s (prepared ahead)\n", p)
			}
			if err != nil {
				return err
			}
		}
		done, err = sandbox.GC(ctx, reporter{a.stderr}, c, dirs)
		return err
	})
	for _, p := range done.Removed {
		fmt.Fprintf(a.stdout, "removed %s\n", p)
	}
	for _, n := range done.Stopped {
		fmt.Fprintf(a.stdout, "stopped %s (its supervisor was gone; start resumes it)\n", n)
	}
	if err == nil && len(done.Removed)+len(done.Stopped)+len(ahead) == 0 {
		fmt.Fprintln(a.stdout, "nothing to remove")
	}
	return err
}

// gcCluster removes what killed launchers of this host left in the
// cluster's namespace.
func (a *app) gcCluster(prepared bool) error {
	if prepared {
		return usageError{errors.New("--prepared: no gateway is prepared ahead on a cluster")}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	removed, err := sandbox.GCCluster(ctx, a.cluster())
	for _, n := range removed {
		fmt.Fprintf(a.stdout, "removed %s\n", n)
	}
	if err == nil && len(removed) == 0 {
		fmt.Fprintln(a.stdout, "nothing to remove")
	}
	return hintError(err, nil, "")
}
