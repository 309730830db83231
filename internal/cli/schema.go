package cli

import (
	"github.com/propio/propio-sandbox/schema"
	"github.com/spf13/cobra"
)

func newSchema(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "schema",
		Short: "Print the JSON Schema of profiles (for editors: yaml-language-server)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := a.stdout.Write(schema.ProfileJSON)
			return err
		},
	}
}
