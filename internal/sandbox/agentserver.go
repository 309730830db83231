package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/ask"
	"github.com/propio/propio-sandbox/internal/backend"
	"github.com/propio/propio-sandbox/internal/decisionlog"
	"github.com/propio/propio-sandbox/internal/fsutil"
	"github.com/propio/propio-sandbox/internal/hostinfo"
	"github.com/propio/propio-sandbox/internal/profile"
	"golang.org/x/net/netutil"
)

// AgentServer is the launcher's side of the requests the agent makes from
// inside (agent_requests): it serves request.sock in the agent's directory
// (mounted in the agent's container) and, to approvers, its Broker as
// launcher.sock in the sandbox's ask directory (never mounted in the
// agent's). A request of a kind the profile lets the agent make, that its
// kind's check lets through, is asked of the user; allowed, it is carried
// out by its kind's handler; the agent is answered with an ask.Answer, and
// each decision is written to the sandbox's decision log.
type AgentServer struct {
	// Kinds are the kinds the profile lets the agent ask for.
	Kinds    []string
	Handlers *Handlers
	Broker   *ask.Broker
	// Log is the sandbox's decision log; nil writes none.
	Log *decisionlog.Writer
	// AgentDir and AskDir are the directories the sockets are made in;
	// both exist.
	AgentDir, AskDir string

	limits  agentLimits // zero: defaultAgentLimits
	ctx     context.Context
	cancel  context.CancelFunc
	servers []*http.Server
	wg      sync.WaitGroup
}

// maxAgentBody bounds an agent's request.
const maxAgentBody = 64 << 10

// agentLimits bound the agent's socket, which is the agent's to flood: at
// most conns connections at once (the rest wait in the socket's backlog,
// costing the launcher no descriptor), each given header for its header,
// read for the whole request and idle between two requests. A request
// waiting for a decision holds its connection, and the broker denies past
// its cap (ask.DefaultCap), well below conns.
type agentLimits struct {
	conns              int
	header, read, idle time.Duration
}

var defaultAgentLimits = agentLimits{conns: 64, header: 5 * time.Second, read: 10 * time.Second, idle: 30 * time.Second}

// maxAgentHeader bounds an agent's request's header.
const maxAgentHeader = 16 << 10

// quiet is the error log of the launcher's servers: what a server would
// log (an accept that failed, a client that went away) is the agent's
// doing, and never reaches the user's terminal, which the launcher shares
// with the agent.
var quiet = log.New(io.Discard, "", 0)

// Start listens on both sockets and serves them until Close. Requests are
// carried out with ctx (the sandbox's).
func (a *AgentServer) Start(ctx context.Context) error {
	a.ctx, a.cancel = context.WithCancel(ctx)
	agent, err := fsutil.ListenUnix(a.AgentDir, ask.AgentSocketName, 0o666) // whichever user the agent is
	if err != nil {
		return fmt.Errorf("serving the agent's requests: %w", err)
	}
	launcher, err := fsutil.ListenUnix(a.AskDir, ask.LauncherSocketName, 0o600)
	if err != nil {
		agent.Close()
		return fmt.Errorf("serving the agent's requests to approvers: %w", err)
	}
	lim := a.limits
	if lim == (agentLimits{}) {
		lim = defaultAgentLimits
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/requests", a.serveAgent)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		answer(w, http.StatusNotFound, ask.Answer{Decision: ask.Deny, DecidedBy: ask.ByRule, Error: "POST a request to /v1/requests"})
	})
	for _, s := range []struct {
		l   net.Listener
		srv *http.Server
	}{
		{netutil.LimitListener(agent, lim.conns), &http.Server{
			Handler: mux, ReadHeaderTimeout: lim.header, ReadTimeout: lim.read,
			IdleTimeout: lim.idle, MaxHeaderBytes: maxAgentHeader, ErrorLog: quiet,
		}},
		// The approvers' socket is the user's: a watch is held for as
		// long as an approver runs.
		{launcher, &http.Server{Handler: a.Broker.Handler(), ReadHeaderTimeout: 10 * time.Second, ErrorLog: quiet}},
	} {
		a.servers = append(a.servers, s.srv)
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			_ = s.srv.Serve(s.l)
		}()
	}
	return nil
}

// Close stops serving; requests waiting for a decision are answered deny.
func (a *AgentServer) Close() {
	a.cancel()
	for _, s := range a.servers {
		s.Close()
	}
	a.wg.Wait()
	os.Remove(filepath.Join(a.AgentDir, ask.AgentSocketName))
	os.Remove(filepath.Join(a.AskDir, ask.LauncherSocketName))
}

func (a *AgentServer) serveAgent(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxAgentBody))
	if err != nil {
		answer(w, http.StatusBadRequest, ask.Answer{Decision: ask.Deny, DecidedBy: ask.ByRule, Error: "reading the request: " + err.Error()})
		return
	}
	req, err := ask.ParseAgentAsk(body)
	if err != nil {
		answer(w, http.StatusBadRequest, ask.Answer{Decision: ask.Deny, DecidedBy: ask.ByRule, Error: err.Error()})
		return
	}
	answer(w, http.StatusOK, a.Decide(req.Request()))
}

// Decide asks the user about req, an agent's request, carries it out when
// it is allowed, logs the decision and returns the agent's answer.
func (a *AgentServer) Decide(req ask.Request) ask.Answer {
	refuse := func(err error) ask.Answer {
		a.log(req, ask.Outcome{Decision: ask.Decision{Action: ask.Deny}, DecidedBy: ask.ByRule}, err)
		return ask.Answer{Decision: ask.Deny, DecidedBy: ask.ByRule, Error: err.Error()}
	}
	if !slices.Contains(a.Kinds, req.Kind) {
		return refuse(fmt.Errorf("this sandbox's profile does not let the agent ask for %s (agent_requests: %s)", req.Kind, strings.Join(a.Kinds, ", ")))
	}
	h, ok := a.Handlers.Lookup(req.Kind)
	if !ok {
		return refuse(errNoHandler(req.Kind))
	}
	req, err := a.Handlers.check(req)
	if err != nil {
		return refuse(err)
	}
	o := a.Broker.Ask(a.ctx, req)
	if o.DecidedBy == "" { // the sandbox ended first
		o.DecidedBy = ask.ByNoApprover
	}
	ans := ask.Answer{Decision: o.Action, DecidedBy: o.DecidedBy}
	if o.Action != ask.Allow {
		if o.Why != "" {
			ans.Error = o.Why
		}
		a.log(req, o, nil)
		return ans
	}
	result, err := h(a.ctx, req)
	if err != nil {
		ans.Error = err.Error()
	} else {
		ans.Result = result
	}
	a.log(req, o, err)
	return ans
}

// log writes the decision of req to the sandbox's decision log: allowed
// only when it was allowed and carried out.
func (a *AgentServer) log(req ask.Request, o ask.Outcome, err error) {
	if a.Log == nil {
		return
	}
	e := decisionlog.Entry{
		Time: time.Now().UTC(), Via: "agent", Kind: req.Kind, Asked: strings.TrimPrefix(req.What(), req.Kind+" "),
		Allowed: o.Action == ask.Allow && err == nil, Reason: req.Reason, DecidedBy: o.DecidedBy, Scope: o.Scope,
	}
	if req.Kind == ask.KindPort {
		e.Port = uint16(req.Port)
	}
	switch {
	case err != nil:
		e.Error = err.Error()
	case o.Why != "":
		e.Error = o.Why
	}
	_ = a.Log.Write(e)
}

func answer(w http.ResponseWriter, status int, a ask.Answer) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(a)
}

// serveAgentRequests serves the agent's requests of the sandbox project,
// when its profile lets the agent make any, until the returned stop is
// called: it makes the agent's directory (and the ask directory, when the
// gateway does not ask: prepareGateway made it then), starts the decision
// log when there is no gateway to, and serves both sockets.
func (s *launch) serveAgentRequests(ctx context.Context, proj *types.Project, ports *Ports) (stop func(), err error) {
	project := proj.Name
	if len(s.Profile.AgentRequests) == 0 {
		return func() {}, nil
	}
	askBase, err := ask.BaseDir()
	if err != nil {
		return nil, err
	}
	agentBase, err := ask.AgentBaseDir()
	if err != nil {
		return nil, err
	}
	if !s.Profile.Network.Asks() {
		if _, err := ask.Make(askBase, project, s.Env.Workspace); err != nil {
			return nil, err
		}
	}
	agentDir, err := ask.MakeAgentDir(agentBase, project)
	if err == nil && slices.Contains(s.Profile.AgentRequests, ask.KindMount) {
		// The mount point of the mounts volume, in the agent's directory,
		// which is read-only inside: the engine could not make it there.
		err = os.Mkdir(filepath.Join(agentDir, filepath.Base(generator.MountsTarget)), 0o755)
		if err == nil {
			err = os.Mkdir(filepath.Join(agentDir, filepath.Base(generator.WritesTarget)), 0o755)
		}
	}
	if err != nil {
		dropRunDirs(project)
		return nil, err
	}
	logDir := s.Env.Dirs.LogDir()
	if s.Profile.Network.Mode != "allowlist" {
		_, err = decisionlog.Start(logDir, decisionlog.Header{Time: time.Now().UTC(), Project: project, Workspace: s.Env.Workspace, Profile: s.Profile.Meta.File})
	}
	var log *decisionlog.Writer
	if err == nil {
		log, err = decisionlog.Append(decisionlog.Path(logDir, project))
	}
	if err != nil {
		dropRunDirs(project)
		return nil, err
	}
	srv := &AgentServer{
		Kinds:    s.Profile.AgentRequests,
		Handlers: s.requestHandlers(proj, ports, generator.AskDir(askBase, project)),
		Broker: &ask.Broker{Project: project, Workspace: s.Env.Workspace, Timeout: time.Duration(s.Profile.Network.AskTimeoutOrDefault()), Prefix: "a",
			Expect: func() bool { return ask.Held(generator.AskDir(askBase, project)) }},
		Log:      log,
		AgentDir: agentDir,
		AskDir:   generator.AskDir(askBase, project),
	}
	if err := srv.Start(ctx); err != nil {
		log.Close()
		dropRunDirs(project)
		return nil, err
	}
	return func() {
		srv.Close()
		log.Close()
		dropRunDirs(project)
	}, nil
}

// requestHandlers are the handlers of the agent's requests of the sandbox
// project, by kind.
func (s *launch) requestHandlers(proj *types.Project, ports *Ports, askDir string) *Handlers {
	project := proj.Name
	hs := &Handlers{}
	host := hostinfo.Limits()
	r := s.Profile.Resources
	z := NewResizer(
		backend.Resources{CPUs: r.CPUs, Memory: int64(r.Memory), PIDs: r.Pids},
		backend.Resources{CPUs: host.CPUs, Memory: host.Memory, PIDs: profile.MaxPids},
		func(ctx context.Context, up backend.Resources) error {
			return s.rt.UpdateResources(ctx, project, generator.Service, up)
		})
	hs.Register(ask.KindResources, z.Handle)
	hs.Check(ask.KindResources, z.Check)
	hs.Register(ask.KindPort, ports.Handle)
	hs.Check(ask.KindPort, ports.Check)
	if m, ok := LaunchMounts(s.rt, proj, s.Env, s.Profile, askDir); ok {
		s.mounts = m
		hs.Register(ask.KindMount, m.Handle)
		hs.Resolve(ask.KindMount, m.Resolve)
	}
	return hs
}

// announce announces the sandbox project, when it can ask (it has an ask
// directory), to the approvers attached to its workspace before it starts:
// each holds it, so that what it asks in its first instant waits for them
// rather than being denied for want of an approver. The function returned
// ends the announcements, once the sandbox has ended.
func announce(project string) (hangup func()) {
	base, err := ask.BaseDir()
	if err != nil {
		return func() {}
	}
	sb, err := ask.Open(generator.AskDir(base, project))
	if err != nil {
		return func() {} // it asks nothing
	}
	_, hangup = ask.Announce(sb)
	return hangup
}
