package cli

import (
	"errors"
	"fmt"
	"net/netip"
	"os/signal"
	"syscall"
	"time"

	"github.com/propio/propio-sandbox/internal/netfence"
	"github.com/spf13/cobra"
)

// NetFenceCommand is the hidden subcommand of the container that holds an
// allowlist sandbox's network namespace on an engine whose internal
// networks do not keep the host out (Podman): it fences the namespace in
// (netfence), says so, and holds it until it is stopped; with --check, it
// says whether the namespace is fenced, for the launcher before the agent
// joins it.
const NetFenceCommand = "netns-fence"

func newNetFence(a *app) *cobra.Command {
	var gateway, virtual string
	var check bool
	var wait time.Duration
	cmd := &cobra.Command{
		Use:    NetFenceCommand + " --gateway ADDR [--virtual PREFIX] [--check [--wait DURATION]]",
		Short:  "Fence the sandbox's network namespace in to its gateway, and hold it (runs inside the netns container)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			gw, err := netip.ParseAddr(gateway)
			if err != nil {
				return usageError{fmt.Errorf("--gateway %q: %w", gateway, err)}
			}
			var v netip.Prefix
			if virtual != "" {
				if v, err = netip.ParsePrefix(virtual); err != nil {
					return usageError{fmt.Errorf("--virtual %q: %w", virtual, err)}
				}
			}
			if check {
				return checkFence(wait)
			}
			if err := netfence.Fence(gw, v); err != nil {
				return err
			}
			// PID 1 of its container: a signal without a handler would be
			// ignored, and the engine would have to kill it.
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			if v.IsValid() {
				fmt.Fprintf(a.stdout, "fenced: only loopback, %s and %s are reachable\n", gw, v)
			} else {
				fmt.Fprintf(a.stdout, "fenced: only loopback and %s are reachable\n", gw)
			}
			<-ctx.Done()
			return nil
		},
	}
	cmd.Flags().StringVar(&gateway, "gateway", "", "the gateway's `ADDR`ess, the only one reachable")
	cmd.Flags().StringVar(&virtual, "virtual", "", "the gateway's virtual addresses, `PREFIX`, reachable too")
	cmd.Flags().BoolVar(&check, "check", false, "say whether the namespace is fenced, and exit")
	cmd.Flags().DurationVar(&wait, "wait", 0, "with --check: wait up to `DURATION` for the fence")
	return cmd
}

// checkFence says whether the namespace is fenced, waiting up to
// wait for its holder, which starts with the container, to fence it (the
// kernel tells no one when a table appears: the check is repeated, every
// 10ms, bounded).
func checkFence(wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		err := netfence.Check()
		if !errors.Is(err, netfence.ErrNotFenced) || !time.Now().Before(deadline) {
			return err
		}
		time.Sleep(10 * time.Millisecond)
	}
}
