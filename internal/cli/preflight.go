package cli

import (
	"github.com/propio/propio-sandbox/internal/preflight"
	"github.com/propio/propio-sandbox/internal/profile"
	"github.com/propio/propio-sandbox/internal/sandbox"
)

// preflight are the built-in checks of p in e's workspace, as run passes
// them; the engine they reach is kept in its Conn.
func (a *app) preflight(e env, p *profile.Profile, build bool) *sandbox.Preflight {
	return &sandbox.Preflight{
		Env: e.sandbox(), Profile: p, Ref: a.profile, Engine: a.engineWant(), Build: build,
		Streams: a.streams(),
		Hint:    func(err error) error { return hintError(err, nil, "") },
	}
}

// trustCheck runs the trust preflight check alone, for a build: the
// profile's trust and its build's.
func (a *app) trustCheck(e env, p *profile.Profile) preflight.Result {
	return a.preflight(e, p, true).TrustCheck()
}
