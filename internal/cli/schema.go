package cli

import (
	"fmt"

	"github.com/propio/propio-sandbox/schema"
	"github.com/spf13/cobra"
)

func newSchema(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "schema [profile|doctor]",
		Short: "Print the JSON Schema of profiles (for editors: yaml-language-server), or of doctor --json",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			doc := schema.ProfileJSON
			if len(args) == 1 {
				switch args[0] {
				case "profile":
				case "doctor":
					doc = schema.DoctorJSON
				default:
					return usageError{fmt.Errorf("no schema %q: there are profile and doctor", args[0])}
				}
			}
			_, err := a.stdout.Write(doc)
			return err
		},
	}
}
