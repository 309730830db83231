package sandbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"time"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/daemon"
	"github.com/propio/propio-sandbox/internal/decisionlog"
	"github.com/propio/propio-sandbox/internal/fsutil"
	"github.com/propio/propio-sandbox/internal/hostinfo"
)

// Gateways prepared ahead. Creating an allowlist sandbox's networks and
// starting its gateway take most of its launch: so, once a sandbox's
// command runs, its launcher has the next one's prepared in the background,
// under the next free name of the workspace, by a keeper process (keeper.go)
// that keeps it for a while (PROPIO_SANDBOX_PREPARE, 10 minutes by
// default) and removes it unless a run adopts it. A run of the same
// workspace adopts it when it is, byte for byte, what the run would make
// under that name and subnet (render's truth holds: a run that goes cold
// makes exactly what it holds), and only creates and starts its own
// container. A prepared gateway has never served a sandbox, and serves
// one: it goes with the run that adopted it.

// EnvPrepare turns preparing ahead off (0 or off), or says how long a
// gateway prepared ahead is kept for the next run (a duration).
const EnvPrepare = "PROPIO_SANDBOX_PREPARE"

// Bounds of the time a gateway prepared ahead is kept.
const (
	DefaultKeep = 10 * time.Minute
	maxKeep     = 24 * time.Hour
)

// keeperAnswer bounds how long a launch waits for a keeper's answer; a
// keeper still preparing its gateway may take this long to say it is
// ready.
const keeperAnswer = 30 * time.Second

// PrepareKeep reads PROPIO_SANDBOX_PREPARE: how long a gateway prepared
// ahead is kept, zero when preparing ahead is off.
func PrepareKeep(lookup func(string) (string, bool)) (time.Duration, error) {
	v, ok := lookup(EnvPrepare)
	switch v = strings.TrimSpace(v); {
	case !ok || v == "":
		return DefaultKeep, nil
	case v == "0" || strings.EqualFold(v, "off"):
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 || d > maxKeep {
		return 0, fmt.Errorf("%s=%q: want 0 or off to prepare nothing ahead, or how long to keep a gateway prepared for the next run, such as 10m (at most %s)", EnvPrepare, v, maxKeep)
	}
	return d, nil
}

// spareOf is what a gateway prepared ahead holds of project: the gateway
// and the networks, as generated; and its render's digest, which tells
// whether a run would make the same.
func spareOf(project *types.Project) (spare *types.Project, render []byte, digest string, err error) {
	if _, ok := project.Services[generator.GatewayService]; !ok {
		return nil, nil, "", fmt.Errorf("project %s has no gateway", project.Name)
	}
	p := gatewayOnly(project)
	render, err = generator.Render(p)
	if err != nil {
		return nil, nil, "", err
	}
	sum := sha256.Sum256(render)
	return p, render, hex.EncodeToString(sum[:]), nil
}

// gatewayOnly is project's gateway and networks, which start before the
// sandbox (a gateway prepared ahead, or one that the run hands its
// brokering before the sandbox is made).
func gatewayOnly(project *types.Project) *types.Project {
	p := *project
	p.Services = types.Services{generator.GatewayService: project.Services[generator.GatewayService]}
	p.Volumes = nil
	return &p
}

// agentOnly is the project of a sandbox whose gateway runs already (a
// run's that adopted it, or started it first): its own container alone, on
// the gateway's networks (external).
func agentOnly(project *types.Project) *types.Project {
	p := *project
	p.Services = types.Services{}
	for name, svc := range project.Services {
		if name == generator.GatewayService {
			continue
		}
		deps := types.DependsOnConfig{}
		for d, c := range svc.DependsOn {
			if d != generator.GatewayService {
				deps[d] = c
			}
		}
		if len(deps) == 0 {
			deps = nil
		}
		svc.DependsOn = deps
		p.Services[name] = svc
	}
	p.Networks = types.Networks{}
	used := map[string]bool{}
	for _, svc := range p.Services {
		for key := range svc.Networks {
			used[key] = true
		}
	}
	for key, n := range project.Networks {
		if !used[key] {
			continue // the gateway's way out
		}
		n.External = true
		n.Driver, n.DriverOpts, n.Ipam, n.Internal, n.Labels = "", nil, types.IPAMConfig{}, false, nil
		p.Networks[key] = n
	}
	return &p
}

// keeperRequest is what a launch asks a keeper, one JSON line.
type keeperRequest struct {
	// Op: hello (what it keeps), adopt (for this run: its name's lock
	// comes with the answer), remove (the run that adopted it is over),
	// discard (remove it unused).
	Op     string `json:"op"`
	Digest string `json:"digest,omitempty"` // adopt: what the run would make
	PID    int    `json:"pid,omitempty"`    // adopt: the launcher's
}

// keeperReply is a keeper's answer, one JSON line.
type keeperReply struct {
	Project   string `json:"project"`
	Subnet    string `json:"subnet"`
	Workspace string `json:"workspace"`
	State     string `json:"state"` // preparing, ready, adopted, failed
	OK        bool   `json:"ok,omitempty"`
	Why       string `json:"why,omitempty"`
}

// keeperLink is a launch's connection to a keeper.
type keeperLink struct {
	c *net.UnixConn
	r []byte // read past the last answer
}

// dialKeeper connects to the keeper whose socket is name in dir.
func dialKeeper(ctx context.Context, dir, name string) (*keeperLink, error) {
	c, err := fsutil.DialUnix(ctx, dir, name)
	if err != nil {
		return nil, err
	}
	return &keeperLink{c: c.(*net.UnixConn)}, nil
}

// ask sends req and reads the answer, and a file when one comes with it,
// within limit.
func (k *keeperLink) ask(req keeperRequest, limit time.Duration) (keeperReply, *os.File, error) {
	k.c.SetDeadline(time.Now().Add(limit))
	defer k.c.SetDeadline(time.Time{})
	b, _ := json.Marshal(req)
	if _, err := k.c.Write(append(b, '\n')); err != nil {
		return keeperReply{}, nil, err
	}
	var file *os.File
	buf := make([]byte, 4096)
	oob := make([]byte, syscall.CmsgSpace(4))
	for !strings.Contains(string(k.r), "\n") {
		n, oobn, _, _, err := k.c.ReadMsgUnix(buf, oob)
		if oobn > 0 {
			if f := receivedFile(oob[:oobn]); f != nil {
				file = f
			}
		}
		k.r = append(k.r, buf[:n]...)
		if err != nil {
			if file != nil {
				file.Close()
			}
			return keeperReply{}, nil, err
		}
	}
	line, rest, _ := strings.Cut(string(k.r), "\n")
	k.r = []byte(rest)
	var a keeperReply
	if err := json.Unmarshal([]byte(line), &a); err != nil {
		if file != nil {
			file.Close()
		}
		return keeperReply{}, nil, fmt.Errorf("the keeper's answer: %w", err)
	}
	return a, file, nil
}

// receivedFile is the file descriptor a control message carried, if one.
func receivedFile(oob []byte) *os.File {
	msgs, err := syscall.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	for _, m := range msgs {
		if fds, err := syscall.ParseUnixRights(&m); err == nil && len(fds) > 0 {
			for _, extra := range fds[1:] {
				syscall.Close(extra)
			}
			return os.NewFile(uintptr(fds[0]), "name lock")
		}
	}
	return nil
}

func (k *keeperLink) Close() error { return k.c.Close() }

// adoption is a gateway prepared ahead that this launch adopted: its name
// (the lock the keeper shares with it), subnet and keeper.
type adoption struct {
	name   *heldName
	subnet netip.Prefix
	keeper *keeperLink
	spare  *types.Project // what it holds, as this launch makes it
}

// spareable reports whether this launch may adopt a gateway prepared
// ahead, and have the next one prepared: an allowlist that asks nothing
// (an ask socket would show approvers a sandbox that is not there), on an
// engine whose networks keep the host out and that outlives the launcher.
func (s *launch) spareable() bool {
	p := s.Profile
	return s.keep > 0 && s.Keep == nil && p.Network.Mode == "allowlist" && !p.Network.Asks() &&
		s.facts.InternalNetworks && !s.tempEngine && !s.facts.Remote
}

// adoptSpare adopts a gateway prepared ahead for this workspace that is
// exactly what this launch would make under its name and subnet, and has
// those that are not (another profile's, an older binary's) removed. nil
// when there is none to adopt.
func (s *launch) adoptSpare(ctx context.Context) *adoption {
	if !s.spareable() {
		return nil
	}
	dir, err := backgroundDir(s.Env.Dirs)
	if err != nil {
		return nil
	}
	for _, sock := range keeperSockets(dir, s.Env.Workspace) {
		if a := s.tryAdopt(ctx, dir, sock); a != nil {
			return a
		}
	}
	return nil
}

// keeperSockets are the sockets of the keepers that may hold a gateway for
// workspace, by the names its sandboxes take.
func keeperSockets(dir, workspace string) []string {
	base := generator.ProjectName(workspace, "")
	var out []string
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".sock")
		if ok && (name == base || strings.HasPrefix(name, base+"-")) {
			out = append(out, e.Name())
		}
	}
	return out
}

// tryAdopt adopts the keeper's gateway when it is this workspace's and
// what this launch would make; discards it when it is this workspace's and
// not.
func (s *launch) tryAdopt(ctx context.Context, dir, sock string) *adoption {
	k, err := dialKeeper(ctx, dir, sock)
	if err != nil {
		return nil // gone
	}
	hello, _, err := k.ask(keeperRequest{Op: "hello"}, keeperAnswer)
	if err != nil || hello.Workspace != s.Env.Workspace || hello.State == "adopted" || hello.State == "failed" {
		k.Close()
		return nil
	}
	subnet, err := netip.ParsePrefix(hello.Subnet)
	var spare *types.Project
	digest := ""
	if err == nil {
		spare, digest, err = s.spareFor(hello.Project, subnet)
	}
	if err != nil {
		k.ask(keeperRequest{Op: "discard"}, keeperAnswer)
		k.Close()
		return nil
	}
	a, lock, err := k.ask(keeperRequest{Op: "adopt", Digest: digest, PID: os.Getpid()}, keeperAnswer)
	if err != nil || !a.OK || lock == nil {
		if lock != nil {
			lock.Close()
		}
		k.Close()
		return nil
	}
	return &adoption{name: &heldName{Name: hello.Project, file: lock}, subnet: subnet, keeper: k, spare: spare}
}

// spareFor is the gateway and networks this launch would make under name
// and subnet, and their digest.
func (s *launch) spareFor(name string, subnet netip.Prefix) (*types.Project, string, error) {
	o := s.opts
	o.Project, o.Subnet = name, subnet
	project, err := s.plan.Generate(o, s.engineFacts)
	if err != nil {
		return nil, "", err
	}
	spare, _, digest, err := spareOf(project)
	return spare, digest, err
}

// adoptedProject is the project of a run on the gateway it adopted: the
// sandbox alone, on the keeper's networks; and how its variables are
// filled in (its brokering, handed to the gateway as the sandbox starts).
// What it would make cold must be what the keeper holds, still.
func (s *launch) adoptedProject(ctx context.Context, o generator.Options, adjust func(*generator.Host)) (*types.Project, func(string) (string, bool), error) {
	o.Subnet = s.adopted.subnet
	project, err := s.plan.Generate(o, adjust)
	if err != nil {
		return nil, nil, err
	}
	held := s.adopted.spare
	if !reflect.DeepEqual(project.Services[generator.GatewayService], held.Services[generator.GatewayService]) || !reflect.DeepEqual(project.Networks, held.Networks) {
		return nil, nil, fmt.Errorf("the gateway prepared for sandbox %s is not the one this run makes", o.Project)
	}
	dirs := s.plan.Env.Dirs
	if err := writeResolvConf(dirs.ResolvDir(), generator.GatewayAddr(o.Subnet)); err != nil {
		return nil, nil, err
	}
	if err := decisionlog.Begin(dirs.LogDir(), decisionlog.Header{Time: time.Now().UTC(), Project: o.Project, Workspace: s.plan.Env.Workspace, Profile: s.plan.Profile.Meta.File}); err != nil {
		return nil, nil, err
	}
	lookup, err := s.prepareBroker(ctx, project, false)
	if err != nil {
		return nil, nil, err
	}
	return agentOnly(project), lookup, nil
}

// release tells the keeper the run is over: it removes everything of the
// sandbox, its gateway and what the run made. false when the keeper is
// gone.
func (a *adoption) release() bool {
	_, _, err := a.keeper.ask(keeperRequest{Op: "remove"}, keeperAnswer)
	a.keeper.Close()
	return err == nil
}

// prepareNext has the next run's gateway prepared, in the background:
// called once the sandbox's container has started, so that it takes
// nothing from its start.
func (s *launch) prepareNext() {
	if !s.spareable() {
		return
	}
	s.spares.Add(1)
	go func() {
		defer s.spares.Done()
		ctx, cancel := context.WithTimeout(context.Background(), keeperAnswer)
		defer cancel()
		if err := s.prepareSpare(ctx); err != nil {
			s.backgroundNote("not preparing a gateway ahead for %s: %v", s.Env.Workspace, err)
		}
	}()
}

// spareSpec is what a launcher hands the keeper of a gateway prepared
// ahead: the gateway and networks to make, as render shows them.
type spareSpec struct {
	Project   string        `json:"project"`
	Render    string        `json:"render"`
	Digest    string        `json:"digest"`
	Subnet    string        `json:"subnet"`
	Workspace string        `json:"workspace"`
	WorkDir   string        `json:"workdir"`
	Host      string        `json:"host"`
	Keep      time.Duration `json:"keep"`
	State     string        `json:"state"` // the user's propio-sandbox state directory
	// Broker is the directory of the broker directories, when the gateway
	// opens connections: the keeper makes the gateway's before it starts
	// it (where the gateway writes its CA's certificate).
	Broker string `json:"broker,omitempty"`
}

// prepareSpare takes the next free name of the workspace, makes the project
// its gateway needs, and starts its keeper, which takes the name (and the
// workspace's busy lock, until the gateway is up) over.
func (s *launch) prepareSpare(ctx context.Context) error {
	names, err := namesDir()
	if err != nil {
		return err
	}
	held, err := claimHeld(names, s.Env.Workspace, func(n string) bool { return s.names.held[n] || len(s.names.left[n]) > 0 })
	if err != nil {
		return err
	}
	defer held.release() // the keeper has its own
	used, err := s.rt.UsedSubnets(ctx)
	if err != nil {
		return err
	}
	o := s.opts
	o.Project = held.Name
	if o.Subnet, err = generator.PickSubnet(o.Project, used); err != nil {
		return err
	}
	project, err := s.plan.Generate(o, s.adjustAll)
	if err != nil {
		return err
	}
	_, render, digest, err := spareOf(project)
	if err != nil {
		return err
	}
	dir, err := backgroundDir(s.Env.Dirs)
	if err != nil {
		return err
	}
	spec := spareSpec{Project: o.Project, Render: string(render), Digest: digest, Subnet: o.Subnet.String(), Workspace: s.Env.Workspace,
		WorkDir: project.WorkingDir, Host: s.host, Keep: s.keep, State: s.Env.Dirs.State}
	if generator.Opens(s.Profile, s.plan.host) {
		spec.Broker = s.plan.host.BrokerDir
	}
	file := filepath.Join(dir, o.Project+".spare.json")
	b, _ := json.Marshal(spec)
	if err := os.WriteFile(file, b, 0o600); err != nil {
		return err
	}
	busy, err := holdBusy(dir, s.Env.Workspace)
	if err != nil {
		os.Remove(file)
		return err
	}
	defer busy.Close()
	// The keeper hears of this launcher's exit on a pipe whose other end
	// this process holds until it exits.
	exited, alive, err := os.Pipe()
	if err != nil {
		os.Remove(file)
		return err
	}
	defer exited.Close()
	s.alive = alive
	_, err = daemon.Spawn(daemon.Spec{Args: []string{BackgroundArg, "keep", "--spec", file}, Log: backgroundLog(dir), Dir: "/", Files: []*os.File{held.file, busy, exited}})
	if err != nil {
		os.Remove(file)
	}
	return err
}

// backgroundNote writes a line to the background log (what the launcher
// does not tell the user: work ahead that did not happen).
func (s *launch) backgroundNote(format string, args ...any) {
	dir, err := backgroundDir(s.Env.Dirs)
	if err != nil {
		return
	}
	f, err := os.OpenFile(backgroundLog(dir), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return
	}
	defer f.Close()
	fmt.Fprintf(f, "%s [%d] %s\n", time.Now().Format(time.RFC3339Nano), os.Getpid(), fmt.Sprintf(format, args...))
}

// DiscardPrepared removes the gateways the user's keepers hold prepared
// ahead, of every workspace (gc --prepared), and returns their names.
func DiscardPrepared(ctx context.Context, dirs hostinfo.Dirs) ([]string, error) {
	dir := filepath.Join(dirs.State, "background")
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".sock") {
			continue
		}
		k, err := dialKeeper(ctx, dir, e.Name())
		if err != nil {
			continue // gone
		}
		hello, _, err := k.ask(keeperRequest{Op: "hello"}, keeperAnswer)
		if err == nil && hello.State != "adopted" {
			var a keeperReply
			if a, _, err = k.ask(keeperRequest{Op: "discard"}, removeBudget); err == nil && a.OK {
				removed = append(removed, hello.Project)
			}
		}
		k.Close()
		if err != nil {
			errs = append(errs, fmt.Errorf("removing the gateway prepared as %s: %w", strings.TrimSuffix(e.Name(), ".sock"), err))
		}
	}
	return removed, errors.Join(errs...)
}
