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
