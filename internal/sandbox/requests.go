package sandbox

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/propio/propio-sandbox/internal/ask"
)

// RequestHandler carries out a request of the agent's that the user
// allowed (its kind's: port, resources, mount), and returns what the agent
// is told of it (the "result" of the answer: {"url": ...} for a port), or
// why it could not (the answer's "error"). It runs in the launcher, while
// the sandbox runs; ctx ends with the sandbox.
type RequestHandler func(ctx context.Context, req ask.Request) (result map[string]any, err error)

// Handlers are the RequestHandlers of a launch's request server, by kind.
// The zero value is empty and ready; it is safe for concurrent use.
type Handlers struct {
	mu sync.RWMutex
	m  map[string]RequestHandler
	// resolvers hold each kind's check or resolver (a check resolves a
	// request to itself).
	resolvers map[string]RequestResolver
}

// Register makes h the handler of kind, replacing any before it.
func (hs *Handlers) Register(kind string, h RequestHandler) {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if hs.m == nil {
		hs.m = map[string]RequestHandler{}
	}
	hs.m[kind] = h
}

// Lookup returns the handler of kind, if there is one.
func (hs *Handlers) Lookup(kind string) (RequestHandler, bool) {
	hs.mu.RLock()
	defer hs.mu.RUnlock()
	h, ok := hs.m[kind]
	return h, ok
}

// Kinds lists the kinds that have a handler, sorted.
func (hs *Handlers) Kinds() []string {
	hs.mu.RLock()
	defer hs.mu.RUnlock()
	kinds := make([]string, 0, len(hs.m))
	for k := range hs.m {
		kinds = append(kinds, k)
	}
	slices.Sort(kinds)
	return kinds
}

// errNoHandler is the error of a kind no handler carries out.
func errNoHandler(kind string) error {
	return fmt.Errorf("this sandbox does not carry out %s requests", kind)
}

// A RequestCheck refuses, before the user is asked, a request that its
// handler would not carry out (a resources request above the bounds): the
// agent is answered deny at once, decided by rule, with the error.
type RequestCheck func(req ask.Request) error

// Check makes c the check of kind's requests before they are asked, in
// place of any check or resolver before it.
func (hs *Handlers) Check(kind string, c RequestCheck) {
	hs.Resolve(kind, func(req ask.Request) (ask.Request, error) { return req, c(req) })
}

// A RequestResolver is a RequestCheck that also says what the request
// comes to on the host (a mount's resolved path, in Mount.Resolved): the
// request it returns is the one the user is asked, the log records and the
// handler carries out.
type RequestResolver func(req ask.Request) (ask.Request, error)

// Resolve makes r the resolver of kind's requests before they are asked,
// in place of any check or resolver before it.
func (hs *Handlers) Resolve(kind string, r RequestResolver) {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if hs.resolvers == nil {
		hs.resolvers = map[string]RequestResolver{}
	}
	hs.resolvers[kind] = r
}

// check runs the check or the resolver of req's kind, if it has one, and
// returns req as the user is to be asked it.
func (hs *Handlers) check(req ask.Request) (ask.Request, error) {
	hs.mu.RLock()
	r := hs.resolvers[req.Kind]
	hs.mu.RUnlock()
	if r == nil {
		return req, nil
	}
	return r(req)
}
