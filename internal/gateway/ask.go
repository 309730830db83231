package gateway

import (
	"context"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/propio/propio-sandbox/internal/ask"
	"github.com/propio/propio-sandbox/internal/decisionlog"
	"github.com/propio/propio-sandbox/internal/egress"
)

// Asking (network.unlisted: ask). Only a connection that no rule matches
// asks: a deny rule's denial, an address no rule can allow, and a raw
// address never do. The asking connection is held until the user decides
// or the broker's timeout passes; a decision for the run (or always, which
// the frontend has saved as a grant) is remembered for the rest of the run,
// so the next connection to that host and port is decided without asking.
//
// A DNS lookup asks about the name on no port (0 in the request): allowed,
// the name may be reached on 80 and 443 (the ports of a rule without one),
// for the run, or, allowed once, for dnsOnceWindow, long enough for the
// connection that follows the lookup.

// dnsOnceWindow is how long a name allowed once by a lookup stays allowed,
// for the connections that follow it.
const dnsOnceWindow = 10 * time.Second

// askKey is a remembered decision's destination; port 0 is a name looked
// up, which stands for 80 and 443.
type askKey struct {
	host string
	port uint16
}

type askGrant struct {
	allow bool
	scope string
	until time.Time // zero: for the run
}

// remembered holds the run's decisions.
type remembered struct {
	mu sync.Mutex
	m  map[askKey]askGrant
}

// lookup returns the decision remembered for host:port: its own, or that of
// the name's lookup for 80 and 443.
func (r *remembered) lookup(host string, port uint16, now time.Time) (askGrant, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	keys := []askKey{{host, port}}
	if port == 80 || port == 443 {
		keys = append(keys, askKey{host, 0})
	}
	for _, k := range keys {
		g, ok := r.m[k]
		if ok && (g.until.IsZero() || now.Before(g.until)) {
			return g, true
		}
	}
	return askGrant{}, false
}

// name returns the decision remembered for a lookup of host: an allow for
// any of its ports allows it; a deny of its lookup, or of both 80 and 443,
// denies it.
func (r *remembered) name(host string, now time.Time) (askGrant, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	live := func(g askGrant) bool { return g.until.IsZero() || now.Before(g.until) }
	var denied askGrant
	ports := 0
	for k, g := range r.m {
		if k.host != host || !live(g) {
			continue
		}
		if g.allow {
			return g, true
		}
		if k.port == 0 {
			return g, true
		}
		if k.port == 80 || k.port == 443 {
			denied = g
			ports++
		}
	}
	return denied, ports == 2
}

func (r *remembered) add(host string, port uint16, g askGrant) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[askKey]askGrant{}
	}
	r.m[askKey{host, port}] = g
}

// askHost is host as the policy reads it: lower case, without a final dot.
func askHost(host string) string {
	return strings.TrimSuffix(strings.ToLower(strings.TrimSpace(host)), ".")
}

// askable reports whether a denial d of host may ask: no rule decided it,
// nothing makes it always denied, and host is a name.
func askable(d egress.Decision, host string) bool {
	return !d.Allowed && !d.AlwaysDenied && d.Rule == "" && !isAddress(host)
}

// decideAsk is decide, asking the user (and holding until they answer) when
// the gateway asks and no rule matches host:port. ctx ends the wait.
func (c *Config) decideAsk(ctx context.Context, client net.Addr, via, host string, port uint16) decisionlog.Entry {
	e, asks := c.decideEntry(client, via, host, port)
	if !asks {
		return e
	}
	o := c.Ask.Ask(ctx, ask.Request{Kind: ask.KindNetwork, Host: askHost(e.Host), Port: int(port), Via: via, Reason: e.Reason})
	c.applyOutcome(&e, o, port)
	return e
}

// applyOutcome puts the asked decision o about e.Host:port into e, and
// remembers what the user decided beyond this connection.
func (c *Config) applyOutcome(e *decisionlog.Entry, o ask.Outcome, port uint16) {
	e.Time = c.now().UTC() // logged when it was decided
	e.Allowed = o.Action == ask.Allow
	e.DecidedBy, e.Scope = o.DecidedBy, o.Scope
	if e.DecidedBy == "" { // the client went away before anyone answered
		e.DecidedBy = ask.ByTimeout
	}
	switch {
	case o.Why != "":
		e.Reason += "; denied: " + o.Why
	case o.DecidedBy == ask.ByTimeout:
		e.Reason += "; denied: nobody decided in time"
	case e.Allowed:
		e.Reason += "; allowed by the user"
	default:
		e.Reason += "; denied by the user"
	}
	if o.DecidedBy != ask.ByUser {
		return
	}
	switch {
	case o.Scope == ask.ScopeRun || o.Scope == ask.ScopeAlways:
		c.asked.add(askHost(e.Host), port, askGrant{allow: e.Allowed, scope: o.Scope})
	case port == 0 && e.Allowed: // a lookup allowed once: for its connections
		c.asked.add(askHost(e.Host), port, askGrant{allow: true, scope: o.Scope, until: c.now().Add(dnsOnceWindow)})
	}
}

// rememberedEntry decides e from the run's remembered decisions, if one
// covers it.
func (c *Config) rememberedEntry(e *decisionlog.Entry) bool {
	g, ok := c.asked.lookup(askHost(e.Host), e.Port, c.now())
	if !ok {
		return false
	}
	e.Allowed, e.DecidedBy, e.Scope = g.allow, ask.ByUser, g.scope
	if g.allow {
		e.Reason += "; allowed by the user"
	} else {
		e.Reason += "; denied by the user"
	}
	return true
}

// decidedBy is who decided a lookup, and the scope of a user's decision.
type decidedBy struct{ who, scope string }

// lookupAsk decides a lookup of name that the rules deny (dec) and that may
// ask: from the run's decisions, or by asking and waiting for the answer. It
// updates dec, and returns who decided.
func (c *Config) lookupAsk(name string, dec *egress.Decision) decidedBy {
	if dec.Allowed || c.Ask == nil || !askable(*dec, name) {
		return decidedBy{ask.ByRule, ""}
	}
	host := askHost(name)
	if g, ok := c.asked.name(host, c.now()); ok {
		dec.Allowed = g.allow
		dec.Reason += map[bool]string{true: "; allowed by the user", false: "; denied by the user"}[g.allow]
		return decidedBy{ask.ByUser, g.scope}
	}
	o := c.Ask.Ask(context.Background(), ask.Request{Kind: ask.KindNetwork, Host: host, Via: "dns", Reason: dec.Reason})
	e := decisionlog.Entry{Host: host, Reason: dec.Reason}
	c.applyOutcome(&e, o, 0)
	dec.Allowed, dec.Reason = e.Allowed, e.Reason
	return decidedBy{e.DecidedBy, e.Scope}
}

// allowsForRun reports whether name is allowed on port for the rest of the
// run: by the rules, or by a user's decision for the run (which the
// kernel may forward; a decision once is checked per connection).
func (c *Config) allowsForRun(name string, port uint16) bool {
	if c.Policy.Decide(name, port).Allowed {
		return true
	}
	if c.Ask == nil {
		return false
	}
	g, ok := c.asked.lookup(askHost(name), port, c.now())
	return ok && g.allow && g.until.IsZero()
}
