package ask

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"
)

// Broker is the gateway's side: it holds the pending requests, merges those
// for the same host and port, and serves the socket's endpoints. A request
// is denied at once when no approver is attached (no open watch) nor on its
// way (Expect), or when Cap requests already wait; otherwise it waits for a
// decision or Timeout.
type Broker struct {
	Project, Workspace string
	// Timeout is how long a request waits for a decision; then it is
	// denied, decided by timeout.
	Timeout time.Duration
	// Cap bounds the requests pending at once; the rest are denied.
	Cap int
	// Now is the clock of Created. Default: time.Now.
	Now func() time.Time
	// Prefix starts the ID of each request, so that the IDs of two brokers
	// of a sandbox (the gateway's, the launcher's "a") never meet.
	Prefix string
	// Expect reports whether an approver is on its way: one holds the
	// sandbox (Held) and has yet to attach. A request that finds no watch
	// attached then waits for it, as long as Expect says so; nil: never.
	Expect func() bool

	mu       sync.Mutex
	next     int
	pending  map[key]*pending
	watchers map[chan Event]struct{}
}

// key is what merges requests: a network request's host and port; an
// agent's request is never merged (seq).
type key struct {
	host string
	port int
	seq  int
}

func keyOf(req Request, seq int) key {
	if req.Kind == "" || req.Kind == KindNetwork {
		return key{host: req.Host, port: req.Port}
	}
	return key{seq: seq}
}

type pending struct {
	req       Request
	key       key
	seq       int
	done      chan struct{}
	decision  Decision
	decidedBy string
	why       string
}

// DefaultCap is Broker.Cap when it is 0.
const DefaultCap = 16

// Outcome is how a request was decided.
type Outcome struct {
	Decision
	DecidedBy string // user, timeout or no-approver
	// Why says more when the broker denied it itself (no approver, the
	// cap), for the log.
	Why string
}

// Ask holds until req (Kind, Host, Port, Via and Reason set) is decided,
// its timeout passes, or ctx ends (the connection went away: a deny). A
// network request for a host and port that is already pending waits for
// that one; an agent's request is always its own.
func (b *Broker) Ask(ctx context.Context, req Request) Outcome {
	b.mu.Lock()
	k := keyOf(req, b.next+1)
	p, ok := b.pending[k]
	if !ok {
		awaited := len(b.watchers) == 0
		if awaited && !b.expected() {
			b.mu.Unlock()
			return Outcome{Decision{Deny, ScopeOnce}, ByNoApprover, noApprover}
		}
		if len(b.pending) >= b.cap() {
			b.mu.Unlock()
			return Outcome{Decision{Deny, ScopeOnce}, ByNoApprover, strconv.Itoa(b.cap()) + " requests already wait for a decision"}
		}
		b.next++
		req.ID = b.Prefix + strconv.Itoa(b.next)
		req.Project, req.Workspace = b.Project, b.Workspace
		req.Created = b.now().UTC().Truncate(time.Millisecond)
		if req.Kind == "" {
			req.Kind = KindNetwork
		}
		p = &pending{req: req, key: k, seq: b.next, done: make(chan struct{})}
		if b.pending == nil {
			b.pending = map[key]*pending{}
		}
		b.pending[k] = p
		b.broadcast(Event{Type: EventPending, Request: p.req})
		timer := time.AfterFunc(b.Timeout, func() { b.settle(p, Decision{Deny, ScopeOnce}, ByTimeout, "") })
		go func() { <-p.done; timer.Stop() }()
		if awaited {
			go b.await(p)
		}
	}
	b.mu.Unlock()
	select {
	case <-p.done:
		return Outcome{Decision: p.decision, DecidedBy: p.decidedBy, Why: p.why}
	case <-ctx.Done():
		return Outcome{Decision{Deny, ScopeOnce}, "", "the connection ended before a decision"}
	}
}

// noApprover says why a request is denied when no approver is attached.
const noApprover = "no approver is attached (run `propio-sandbox requests --watch`, `approve` or `ui`)"

// expected reports whether an approver is on its way; b.mu is held.
func (b *Broker) expected() bool { return b.Expect != nil && b.Expect() }

// awaitEvery is how often a request held for an approver on its way looks
// whether it still is.
const awaitEvery = 200 * time.Millisecond

// await denies p, held for an approver on its way, when none is any more
// (it went before it attached), unless a watch has attached or p is
// decided first.
func (b *Broker) await(p *pending) {
	t := time.NewTicker(awaitEvery)
	defer t.Stop()
	for {
		select {
		case <-p.done:
			return
		case <-t.C:
		}
		b.mu.Lock()
		gone := len(b.watchers) == 0 && !b.expected()
		attached := len(b.watchers) > 0
		b.mu.Unlock()
		switch {
		case attached:
			return
		case gone:
			b.settle(p, Decision{Deny, ScopeOnce}, ByNoApprover, noApprover)
			return
		}
	}
}

func (b *Broker) cap() int {
	if b.Cap > 0 {
		return b.Cap
	}
	return DefaultCap
}

func (b *Broker) now() time.Time {
	if b.Now != nil {
		return b.Now()
	}
	return time.Now()
}

// settle decides p unless it is decided already; it reports whether it did.
func (b *Broker) settle(p *pending, d Decision, by, why string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.pending[p.key] != p {
		return false
	}
	delete(b.pending, p.key)
	p.decision, p.decidedBy, p.why = d, by, why
	close(p.done)
	b.broadcast(Event{Type: EventDecided, Request: p.req, Decision: &d, DecidedBy: by})
	return true
}

// Decide answers the pending request id, as the user; ErrGone when it is
// not pending.
func (b *Broker) Decide(id string, d Decision) error {
	if err := d.Validate(); err != nil {
		return err
	}
	b.mu.Lock()
	var p *pending
	for _, q := range b.pending {
		if q.req.ID == id {
			p = q
		}
	}
	b.mu.Unlock()
	if p == nil || !b.settle(p, d, ByUser, "") {
		return ErrGone
	}
	return nil
}

// Pending returns the pending requests, oldest first.
func (b *Broker) Pending() []Request {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.pendingLocked()
}

func (b *Broker) pendingLocked() []Request {
	ps := make([]*pending, 0, len(b.pending))
	for _, p := range b.pending {
		ps = append(ps, p)
	}
	slices.SortFunc(ps, func(x, y *pending) int { return x.seq - y.seq })
	reqs := make([]Request, len(ps))
	for i, p := range ps {
		reqs[i] = p.req
	}
	return reqs
}

// broadcast sends ev to every watcher; one that does not keep up is
// dropped (its stream ends). b.mu is held.
func (b *Broker) broadcast(ev Event) {
	for w := range b.watchers {
		select {
		case w <- ev:
		default:
			delete(b.watchers, w)
			close(w)
		}
	}
}

// attach registers a watcher and returns it with the pending requests it
// must be sent first.
func (b *Broker) attach() (chan Event, []Request) {
	w := make(chan Event, 256)
	b.mu.Lock()
	defer b.mu.Unlock()
	reqs := b.pendingLocked()
	if b.watchers == nil {
		b.watchers = map[chan Event]struct{}{}
	}
	b.watchers[w] = struct{}{}
	return w, reqs
}

func (b *Broker) detach(w chan Event) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.watchers[w]; ok {
		delete(b.watchers, w)
		close(w)
	}
}

// Attach attaches an approver in this process (a test's, or a frontend's
// that runs in the gateway): it gets every new request and decision on
// the channel, which is closed by detach (or when it does not keep up).
func (b *Broker) Attach() (events <-chan Event, detach func()) {
	w, _ := b.attach()
	return w, func() { b.detach(w) }
}

// Attached reports whether an approver is attached.
func (b *Broker) Attached() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.watchers) > 0
}

// Handler serves the socket's endpoints.
func (b *Broker) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/requests", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(b.Pending())
	})
	mux.HandleFunc("GET /v1/watch", b.serveWatch)
	mux.HandleFunc("POST /v1/requests/{id}", func(w http.ResponseWriter, r *http.Request) {
		var d Decision
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096)).Decode(&d); err != nil {
			http.Error(w, "a decision: "+err.Error(), http.StatusBadRequest)
			return
		}
		switch err := b.Decide(r.PathValue("id"), d); {
		case err == ErrGone:
			http.Error(w, err.Error(), http.StatusNotFound)
		case err != nil:
			http.Error(w, err.Error(), http.StatusBadRequest)
		default:
			w.WriteHeader(http.StatusNoContent)
		}
	})
	return mux
}

func (b *Broker) serveWatch(w http.ResponseWriter, r *http.Request) {
	ch, reqs := b.attach()
	defer b.detach(ch)
	w.Header().Set("Content-Type", "application/x-ndjson")
	enc := json.NewEncoder(w)
	flush := func() {
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
	}
	w.WriteHeader(http.StatusOK) // the client knows it is attached
	for _, req := range reqs {
		if enc.Encode(Event{Type: EventPending, Request: req}) != nil {
			return
		}
	}
	flush()
	for {
		select {
		case ev, ok := <-ch:
			if !ok || enc.Encode(ev) != nil {
				return
			}
			flush()
		case <-r.Context().Done():
			return
		}
	}
}
