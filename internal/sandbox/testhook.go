package sandbox

import (
	"context"

	"github.com/propio/propio-sandbox/internal/ask"
)

// serveTestRequests serves a launch's request handlers, by kind, to the
// end-to-end tests, with no one asked, until the stop it returns is called.
// It does nothing but in the tests' build (tag e2ehooks: testhook_e2e.go),
// so that the tests can drive a handler before the agent's channel exists.
var serveTestRequests = func(map[string]func(context.Context, ask.Request) (map[string]any, error)) (stop func()) {
	return func() {}
}
