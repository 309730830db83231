package cli

import (
	"io"

	"github.com/propio/propio-sandbox/internal/decisionlog"
	"github.com/spf13/cobra"
)

// newGatewayLog copies a gateway's decision log to standard output as it
// grows, until standard input ends: a launcher execs it in the gateway's
// Pod on a cluster (from the gateway's image, this very binary), whose
// log it cannot open itself, to keep the log where `logs` reads it.
// Hidden: nobody starts it by hand.
func newGatewayLog(a *app) *cobra.Command {
	return &cobra.Command{
		Use:    "gateway-log FILE",
		Short:  "Copy a gateway's decision log to standard output as it grows, until standard input ends (runs inside the gateway's Pod)",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			stop := make(chan struct{})
			go func() {
				io.Copy(io.Discard, a.stdin)
				close(stop)
			}()
			return decisionlog.Follow(cmd.Context(), args[0], a.stdout, stop)
		},
	}
}
