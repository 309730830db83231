//go:build e2ehooks

package cli

import (
	"os"
	"time"
)

// EnvTestRescan sets, in a launcher built with the tag e2ehooks, how often
// an approver looks for sandboxes it was not announced (rescan).
const EnvTestRescan = "PROPIO_SANDBOX_E2E_RESCAN"

func init() {
	if d, err := time.ParseDuration(os.Getenv(EnvTestRescan)); err == nil && d > 0 {
		rescan = func(time.Duration) time.Duration { return d }
	}
}
