// Command propio-sandbox runs a coding agent, or any command, inside a
// container sandbox described by a YAML profile.
package main

import (
	"os"

	"github.com/propio/propio-sandbox/internal/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
