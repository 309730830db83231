package approver

// The ask protocol's types and client are internal/ask's: the frontends
// take them under these names, and use a sandbox only through the Asker
// interface (board.go), which ask.Sandbox satisfies and tests fake.

import "github.com/propio/propio-sandbox/internal/ask"

type (
	Request  = ask.Request
	Decision = ask.Decision
	Event    = ask.Event
	Sandbox  = ask.Sandbox
)

var (
	// Find returns the askable sandboxes of a workspace, or all the user's.
	Find = ask.Find
	// ErrGone: the request is no longer pending.
	ErrGone = ask.ErrGone
)
