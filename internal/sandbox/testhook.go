package sandbox

import (
	"context"
	"time"

	"github.com/propio/propio-sandbox/internal/ask"
)

// serveTestRequests serves a launch's request handlers, by kind, to the
// end-to-end tests, with no one asked, until the stop it returns is called.
// It does nothing but in the tests' build (tag e2ehooks: testhook_e2e.go),
// so that the tests can drive a handler before the agent's channel exists.
var serveTestRequests = func(map[string]func(context.Context, ask.Request) (map[string]any, error)) (stop func()) {
	return func() {}
}

// engineWait is how long a persistent sandbox's supervisor waits for an
// engine that went away: EngineWait, but in the tests' build, where
// PROPIO_SANDBOX_E2E_ENGINE_WAIT may shorten it.
var engineWait = func() time.Duration { return EngineWait }
