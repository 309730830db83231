package cli

import (
	"github.com/propio/propio-sandbox/internal/portrelay"
	"github.com/spf13/cobra"
)

// newPortRelay is the relay of a port the agent asked to publish: it runs
// in its own container, in the sandbox's network namespace, started by the
// launcher from the gateway's image (this very binary). Hidden: nobody
// starts it by hand.
func newPortRelay(a *app) *cobra.Command {
	var socket string
	var port int
	cmd := &cobra.Command{
		Use:    "port-relay --socket PATH --port N",
		Short:  "Relay a published sandbox port (runs inside the relay container)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return portrelay.Serve(cmd.Context(), socket, port)
		},
	}
	cmd.Flags().StringVar(&socket, "socket", "", "serve the unix socket `PATH`")
	cmd.Flags().IntVar(&port, "port", 0, "dial 127.0.0.1:`N` for each connection")
	return cmd
}
