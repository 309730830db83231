package cli

import "time"

// rescan is how often an approver (requests --watch, approve, ui) looks
// for sandboxes it was not announced, given its own interval d: d, but in
// the tests' build (tag e2ehooks: rescan_e2e.go), where
// PROPIO_SANDBOX_E2E_RESCAN may lengthen it, so that a test sees what the
// announcements alone serve.
var rescan = func(d time.Duration) time.Duration { return d }
