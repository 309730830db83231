// Package approver holds the interactive frontends of the ask protocol: a
// Board that attaches to the sandboxes that can ask (as their approver) and
// keeps their pending and decided requests, the terminal UI of `approve` and
// the local web page of `ui`, both drawn from a Board.
//
// It talks to sandboxes only through the Asker interface (the methods of
// ask.Sandbox), and saves "always" decisions only through the Granter it is
// given. It never prints on its own: the terminal UI writes to the terminal
// it is handed, and the web page listens on 127.0.0.1 only.
package approver

import (
	"context"
	"errors"
	"fmt"
	"github.com/propio/propio-sandbox/internal/ask"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// Asker is what a frontend needs of a sandbox that can ask: the methods of
// ask.Sandbox. Tests implement it with a fake.
type Asker interface {
	Pending(ctx context.Context) ([]Request, error)
	Watch(ctx context.Context, fn func(Event)) error
	Decide(ctx context.Context, id string, d Decision) error
}

// Target is a sandbox a Board serves.
type Target struct {
	Project, Workspace string
	Asker              Asker
}

// Targets are the askable sandboxes ask.Find returns, as a Board takes them.
func Targets(sbs []Sandbox) []Target {
	out := make([]Target, len(sbs))
	for i, s := range sbs {
		out[i] = Target{Project: s.Project, Workspace: s.Workspace, Asker: s}
	}
	return out
}

// Granter saves an "always" decision for host:port (action allow or deny) in
// the user's grants of workspace, before the decision is posted.
type Granter func(workspace, host string, port int, action string) error

// Actions and scopes of a Decision.
const (
	Allow = "allow"
	Deny  = "deny"

	Once   = "once"
	Run    = "run"
	Always = "always"
)

// ErrNoGrants: an "always" decision, but nothing to save it with.
var ErrNoGrants = errors.New("decisions for always cannot be saved here yet")

// Item is a request on the board, pending or decided.
type Item struct {
	Request   Request   `json:"request"`
	Decision  *Decision `json:"decision,omitempty"`
	DecidedBy string    `json:"decided_by,omitempty"`
	Decided   time.Time `json:"decided,omitzero"`
}

// SandboxInfo names a sandbox the board is attached to.
type SandboxInfo struct {
	Project   string `json:"project"`
	Workspace string `json:"workspace"`
}

// Snapshot is the board at one moment.
type Snapshot struct {
	Version   uint64        `json:"version"`
	Sandboxes []SandboxInfo `json:"sandboxes"`
	Pending   []Item        `json:"pending"`
	Decided   []Item        `json:"decided"` // newest first
	Always    bool          `json:"always"`  // "always" can be chosen
	Error     string        `json:"error,omitempty"`
}

// keepDecided is how many decided requests a board shows.
const keepDecided = 50

// Board attaches to the sandboxes Find returns, rescanning for new ones,
// and keeps what they ask. It is safe for concurrent use.
type Board struct {
	find   func() ([]Target, error)
	grant  Granter
	rescan time.Duration
	now    func() time.Time

	mu       sync.Mutex
	targets  map[string]Target // by project, the attached ones
	pending  map[string]Item   // by project/id
	decided  []Item            // oldest first
	version  uint64
	changed  chan struct{} // closed at the next change
	lastErr  string
	watchErr map[string]string
}

// NewBoard returns a board over find; grant saves "always" decisions (nil:
// they cannot be chosen); rescan is how often find is asked for new
// sandboxes.
func NewBoard(find func() ([]Target, error), grant Granter, rescan time.Duration) *Board {
	return &Board{
		find: find, grant: grant, rescan: rescan, now: time.Now,
		targets: map[string]Target{}, pending: map[string]Item{}, changed: make(chan struct{}),
		watchErr: map[string]string{},
	}
}

func key(project, id string) string { return project + "/" + id }

// bump records a change; b.mu is held.
func (b *Board) bump() {
	b.version++
	close(b.changed)
	b.changed = make(chan struct{})
}

// Run attaches to the sandboxes until ctx ends.
func (b *Board) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	t := time.NewTicker(b.rescan)
	defer t.Stop()
	for {
		b.scan(ctx, &wg)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// scan attaches to the sandboxes find returns that are not attached yet.
func (b *Board) scan(ctx context.Context, wg *sync.WaitGroup) {
	targets, err := b.find()
	b.mu.Lock()
	defer b.mu.Unlock()
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	if msg != b.lastErr {
		b.lastErr = msg
		b.bump()
	}
	// A sandbox that is gone (its watch ended with it) is no error.
	for p := range b.watchErr {
		if !slices.ContainsFunc(targets, func(t Target) bool { return t.Project == p }) {
			delete(b.watchErr, p)
			b.bump()
		}
	}
	for _, t := range targets {
		if !b.attachLocked(t) {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			b.watch(ctx, t)
		}()
	}
}

// Serve serves t until ctx ends or its watch does, unless the board serves
// it already: a sandbox announced as it starts (ask.Registration), before
// any scan could find it.
func (b *Board) Serve(ctx context.Context, t Target) {
	b.mu.Lock()
	attach := b.attachLocked(t)
	b.mu.Unlock()
	if attach {
		b.watch(ctx, t)
	}
}

// attachLocked takes t among the attached sandboxes, unless it is one;
// b.mu is held.
func (b *Board) attachLocked(t Target) bool {
	if _, ok := b.targets[t.Project]; ok {
		return false
	}
	b.targets[t.Project] = t
	delete(b.watchErr, t.Project)
	b.bump()
	return true
}

// watch watches t, attached, until ctx or the watch ends.
func (b *Board) watch(ctx context.Context, t Target) {
	err := t.Asker.Watch(ctx, func(e Event) { b.event(t.Project, e) })
	b.detach(t.Project, err, ctx.Err() != nil)
}

// detach forgets a sandbox whose watch ended (it stopped, or ctx ended).
func (b *Board) detach(project string, err error, done bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.targets, project)
	for k := range b.pending {
		if strings.HasPrefix(k, project+"/") {
			delete(b.pending, k)
		}
	}
	if err != nil && !done {
		b.watchErr[project] = err.Error()
	}
	b.bump()
}

// event applies one event of project's watch.
func (b *Board) event(project string, e Event) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if e.Request.Project == "" {
		e.Request.Project = project
	}
	k := key(project, e.Request.ID)
	switch e.Type {
	case "pending":
		if _, ok := b.pending[k]; ok {
			return
		}
		b.pending[k] = Item{Request: e.Request}
	case "decided":
		delete(b.pending, k)
		b.addDecided(Item{Request: e.Request, Decision: e.Decision, DecidedBy: e.DecidedBy, Decided: b.now()})
	default:
		return
	}
	b.bump()
}

// addDecided adds it, or updates the same request decided already; b.mu is
// held.
func (b *Board) addDecided(it Item) {
	for i := range b.decided {
		d := &b.decided[i]
		if d.Request.Project == it.Request.Project && d.Request.ID == it.Request.ID {
			if it.Decision != nil {
				d.Decision = it.Decision
			}
			if it.DecidedBy != "" {
				d.DecidedBy = it.DecidedBy
			}
			return
		}
	}
	b.decided = append(b.decided, it)
	if len(b.decided) > keepDecided {
		b.decided = b.decided[len(b.decided)-keepDecided:]
	}
}

// Decide answers request id of sandbox project: for "always", the grant is
// saved first.
func (b *Board) Decide(ctx context.Context, project, id string, d Decision) error {
	if err := checkDecision(d); err != nil {
		return err
	}
	b.mu.Lock()
	t, ok := b.targets[project]
	it, pending := b.pending[key(project, id)]
	b.mu.Unlock()
	if !ok || !pending {
		return fmt.Errorf("request %s of sandbox %s: %w", id, project, ErrGone)
	}
	if d.Scope == Always && !ask.Grantable(it.Request) {
		return fmt.Errorf("request %s of sandbox %s: %w", id, project, ask.ErrNotGrantable)
	}
	if d.Scope == Always {
		if b.grant == nil {
			return ErrNoGrants
		}
		if err := b.grant(t.Workspace, it.Request.Host, it.Request.Port, d.Action); err != nil {
			return fmt.Errorf("saving the grant for %s: %w", it.Request.Host, err)
		}
	}
	err := t.Asker.Decide(ctx, id, d)
	if err != nil && !errors.Is(err, ErrGone) {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.pending, key(project, id))
	if err == nil {
		b.addDecided(Item{Request: it.Request, Decision: &d, DecidedBy: "user", Decided: b.now()})
	}
	b.bump()
	return err
}

func checkDecision(d Decision) error {
	if d.Action != Allow && d.Action != Deny {
		return fmt.Errorf("action %q: want allow or deny", d.Action)
	}
	if d.Scope != Once && d.Scope != Run && d.Scope != Always {
		return fmt.Errorf("scope %q: want once, run or always", d.Scope)
	}
	return nil
}

// Snapshot returns the board now, and a channel closed at its next change.
func (b *Board) Snapshot() (Snapshot, <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := Snapshot{Version: b.version, Always: b.grant != nil, Error: b.lastErr,
		Sandboxes: []SandboxInfo{}, Pending: []Item{}, Decided: []Item{}}
	for _, t := range b.targets {
		s.Sandboxes = append(s.Sandboxes, SandboxInfo{Project: t.Project, Workspace: t.Workspace})
	}
	sort.Slice(s.Sandboxes, func(i, j int) bool { return s.Sandboxes[i].Project < s.Sandboxes[j].Project })
	for _, it := range b.pending {
		s.Pending = append(s.Pending, it)
	}
	sort.Slice(s.Pending, func(i, j int) bool {
		a, c := s.Pending[i].Request, s.Pending[j].Request
		if !a.Created.Equal(c.Created) {
			return a.Created.Before(c.Created)
		}
		return key(a.Project, a.ID) < key(c.Project, c.ID)
	})
	for i := len(b.decided) - 1; i >= 0; i-- {
		s.Decided = append(s.Decided, b.decided[i])
	}
	if s.Error == "" {
		for p, e := range b.watchErr {
			s.Error = "sandbox " + p + ": " + e
			break
		}
	}
	return s, b.changed
}
