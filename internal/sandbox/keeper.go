package sandbox

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/backend"
	"github.com/propio/propio-sandbox/internal/broker"
	"github.com/propio/propio-sandbox/internal/daemon"
	"github.com/propio/propio-sandbox/internal/decisionlog"
	"github.com/propio/propio-sandbox/internal/fsutil"
	"github.com/propio/propio-sandbox/internal/hostinfo"
)

// GatewayKeeper is the background process that keeps a gateway prepared ahead:
// it makes it (under the name its launcher took and handed over), answers
// the launches of the workspace that look for one on its socket, and
// removes it: unused, once its time is up or a launch finds it is not what
// it would make; used, once the run that adopted it is over (or its
// launcher is gone). It holds the name until all of it is removed.
type GatewayKeeper struct {
	Spec    string  // the file its launcher wrote (spareSpec)
	Streams Streams // the background log
}

// keeper is a GatewayKeeper at work.
type keeper struct {
	spec    spareSpec
	dir     string // the background directory, where its socket is
	name    *os.File
	project *types.Project // as it made it, labelled
	rt      backend.Runtime
	say     func(format string, args ...any)

	mu      sync.Mutex
	state   string // preparing, ready, adopted, failed
	why     string // why it failed
	busy    *os.File
	adopter int
	ready   chan struct{} // closed once prepared, or failed
	end     chan string   // why to remove it (the first only)
	removed chan struct{} // closed once removed
	// answering are the answers that wait for the removal: the keeper
	// exits once they are given (exiting: no more are waited for).
	answering sync.WaitGroup
	exiting   bool
}

// Run keeps the gateway until it is removed; its error says why it could
// not make it, or remove it (what is left is gc's: its pid is gone with
// it).
func (kp GatewayKeeper) Run(ctx context.Context) error {
	b, err := os.ReadFile(kp.Spec)
	if err != nil {
		return fmt.Errorf("reading what to prepare: %w", err)
	}
	os.Remove(kp.Spec)
	k := &keeper{dir: filepath.Dir(kp.Spec), state: "preparing", ready: make(chan struct{}), end: make(chan string, 1), removed: make(chan struct{})}
	if err := json.Unmarshal(b, &k.spec); err != nil {
		return fmt.Errorf("reading what to prepare: %w", err)
	}
	k.say = func(format string, args ...any) {
		fmt.Fprintf(kp.Streams.Err, "%s [%d] %s: %s\n", time.Now().Format(time.RFC3339Nano), os.Getpid(), k.spec.Project, fmt.Sprintf(format, args...))
	}
	if k.name, k.busy = daemon.File(0, "name lock"), daemon.File(1, "busy lock"); k.name == nil || k.busy == nil {
		return errors.New("a keeper is started by a launcher, which hands it the sandbox's name")
	}
	// What it makes carries its pid: it answers for that.
	if err := k.held().answerFor(os.Getpid()); err != nil {
		return err
	}
	sock := k.spec.Project + ".sock"
	ln, err := fsutil.ListenUnix(k.dir, sock, 0o600)
	if err != nil {
		return fmt.Errorf("serving the launches' requests: %w", err)
	}
	defer os.Remove(filepath.Join(k.dir, sock))
	defer ln.Close()
	go k.serve(ln)
	k.await(daemon.File(2, "launcher"))
	start := time.Now()
	c, err := k.prepare(ctx)
	if c != nil {
		defer c.Close()
	}
	k.mu.Lock()
	if err != nil {
		k.state, k.why = "failed", err.Error()
	} else {
		k.state = "ready"
	}
	k.busy.Close() // ready: the workspace's background work is done, for now
	k.busy = nil
	k.mu.Unlock()
	close(k.ready)
	if err != nil {
		k.say("preparing: %v", err)
		if c != nil {
			k.remove(c.Runtime)
		}
		return err
	}
	k.say("prepared in %s; kept %s", time.Since(start).Round(time.Millisecond), k.spec.Keep)
	why := k.wait()
	err = k.remove(c.Runtime)
	k.mu.Lock()
	k.exiting = true
	k.mu.Unlock()
	k.answering.Wait()
	k.say("removed (%s): %v", why, err)
	return err
}

// launcherGrace is how long a keeper lets its launcher's sandbox start and
// run before it makes its gateway, unless the launcher exits first: the
// engine, and the machine, are busy with that sandbox meanwhile.
const launcherGrace = time.Second

// await waits until the launcher has exited (its end of the pipe closed),
// or launcherGrace has passed.
func (k *keeper) await(launcher *os.File) {
	if launcher == nil {
		return
	}
	exited := make(chan struct{})
	go func() {
		io.Copy(io.Discard, launcher) // until the launcher's end closes
		launcher.Close()
		close(exited)
	}()
	select {
	case <-exited:
	case <-time.After(launcherGrace):
	}
}

// held is the name it holds.
func (k *keeper) held() *heldName { return &heldName{Name: k.spec.Project, file: k.name} }

// prepare makes the gateway and its networks: the decision log the gateway
// writes (empty until a run begins it), the sandbox's resolv.conf, then the
// engine's part.
func (k *keeper) prepare(ctx context.Context) (*Conn, error) {
	c, err := connectHost(ctx, k.spec.Host, Streams{Out: io.Discard, Err: io.Discard})
	if err != nil {
		return nil, err
	}
	k.rt = c.Runtime
	loaded, err := loader.LoadWithContext(ctx, types.ConfigDetails{
		WorkingDir:  k.spec.WorkDir,
		ConfigFiles: []types.ConfigFile{{Filename: "compose.yaml", Content: []byte(k.spec.Render)}},
		Environment: types.Mapping{},
	}, func(o *loader.Options) { o.SetProjectName(k.spec.Project, true) })
	if err != nil {
		return c, fmt.Errorf("loading the gateway's project: %w", err)
	}
	if again, err := generator.Render(loaded); err != nil || digestOf(again) != k.spec.Digest {
		return c, fmt.Errorf("the gateway's project does not load back as it was made (%v)", err)
	}
	k.project = prepared(loaded)
	subnet, err := netip.ParsePrefix(k.spec.Subnet)
	if err != nil {
		return c, err
	}
	dirs := hostinfo.Dirs{State: k.spec.State}
	if err := writeResolvConf(dirs.ResolvDir(), generator.GatewayAddr(subnet)); err != nil {
		return c, err
	}
	if _, err := decisionlog.Prepare(dirs.LogDir(), k.spec.Project); err != nil {
		return c, err
	}
	if k.spec.Broker != "" {
		if _, err := broker.MakeDir(k.spec.Broker, k.spec.Project); err != nil {
			return c, err
		}
	}
	return c, k.rt.Up(ctx, k.project)
}

func digestOf(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// prepared is project labelled as this process's, made ahead.
func prepared(project *types.Project) *types.Project {
	labels := withLabels(launcherLabels(project.Name), types.Labels{backend.LabelPrepared: "true"})
	p := *project
	p.Services = types.Services{}
	for name, s := range project.Services {
		s.Labels = withLabels(s.Labels, labels)
		p.Services[name] = s
	}
	p.Networks = types.Networks{}
	for name, n := range project.Networks {
		n.Labels = withLabels(n.Labels, labels)
		p.Networks[name] = n
	}
	return &p
}

// wait waits until it is to be removed, and says why: its time is up
// unused, a launch said so, the run that adopted it is over, a signal.
func (k *keeper) wait() string {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer signal.Stop(sigs)
	expire := time.NewTimer(k.spec.Keep)
	defer expire.Stop()
	for {
		select {
		case why := <-k.end:
			return why
		case s := <-sigs:
			return s.String()
		case <-expire.C:
			k.mu.Lock()
			unused := k.state != "adopted"
			k.mu.Unlock()
			if unused {
				k.finish("its time is up")
			}
		}
	}
}

// finish has it removed, for why (the first reason given wins).
func (k *keeper) finish(why string) {
	select {
	case k.end <- why:
	default:
	}
}

// remove removes the gateway, its networks and what the run that adopted
// it made, holding the workspace's busy lock; a log no run began goes too.
func (k *keeper) remove(rt backend.Runtime) error {
	k.mu.Lock()
	if k.busy == nil {
		k.busy, _ = holdBusy(k.dir, k.spec.Workspace)
	}
	adopter, state := k.adopter, k.state
	k.mu.Unlock()
	defer close(k.removed)
	ctx, cancel := context.WithTimeout(context.Background(), removeBudget)
	defer cancel()
	var err error
	if adopter > 0 {
		// The run's first: its container is on the keeper's networks.
		err = rt.Remove(ctx, k.spec.Project, adopter)
	}
	err = errors.Join(err, rt.Remove(ctx, k.spec.Project, os.Getpid()))
	if state != "adopted" {
		path := decisionlog.Path(hostinfo.Dirs{State: k.spec.State}.LogDir(), k.spec.Project)
		if fi, serr := os.Stat(path); serr == nil && fi.Size() == 0 {
			os.Remove(path)
		}
	}
	dropRunDirs(k.spec.Project)
	return err
}

// serve answers the launches that connect.
func (k *keeper) serve(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go k.answer(c.(*net.UnixConn))
	}
}

// answer answers one launch's requests, until it hangs up: a launch that
// adopted the gateway hangs up when its run is over (or its launcher is
// gone), and the gateway goes.
func (k *keeper) answer(c *net.UnixConn) {
	defer c.Close()
	adopted := false
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		var req keeperRequest
		if err := json.Unmarshal(sc.Bytes(), &req); err != nil {
			return
		}
		switch req.Op {
		case "hello":
			k.reply(c, k.hello(), nil)
		case "adopt":
			a, lock := k.adopt(req)
			k.reply(c, a, lock)
			adopted = adopted || a.OK
		case "remove":
			if adopted {
				k.reply(c, keeperReply{OK: true}, nil)
				k.finish("the run that adopted it is over")
				return
			}
			k.reply(c, keeperReply{Why: "not adopted by this launch"}, nil)
		case "discard":
			k.mu.Lock()
			waited := !k.exiting
			if waited {
				k.answering.Add(1)
			}
			k.mu.Unlock()
			k.finish("discarded by a launch")
			<-k.removed
			k.reply(c, keeperReply{OK: true}, nil)
			if waited {
				k.answering.Done()
			}
			return
		}
	}
	if adopted {
		k.finish("the launcher that adopted it is gone")
	}
}

// hello is what it keeps, and how it is.
func (k *keeper) hello() keeperReply {
	k.mu.Lock()
	defer k.mu.Unlock()
	return keeperReply{Project: k.spec.Project, Subnet: k.spec.Subnet, Workspace: k.spec.Workspace, State: k.state, Why: k.why}
}

// adopt gives the gateway to the launch that asks, when it is ready, not
// adopted yet, running, and what the launch would make: then its name's
// lock comes with the answer. A gateway that is not what it would make is
// removed.
func (k *keeper) adopt(req keeperRequest) (keeperReply, *os.File) {
	<-k.ready
	a := k.hello()
	switch {
	case a.State == "failed":
		return a, nil
	case a.State == "adopted":
		a.Why = "adopted by another launch"
		return a, nil
	case req.Digest != k.spec.Digest:
		a.Why = "not what the launch makes"
		k.finish("not what a launch of the workspace makes (another profile, or another build of propio-sandbox)")
		return a, nil
	}
	if err := k.running(); err != nil {
		a.Why = err.Error()
		k.finish(err.Error())
		return a, nil
	}
	busy, err := holdBusy(k.dir, k.spec.Workspace)
	if err != nil {
		a.Why = err.Error()
		return a, nil
	}
	k.mu.Lock()
	if k.state != "ready" {
		k.mu.Unlock()
		busy.Close()
		a.Why = "adopted by another launch"
		return a, nil
	}
	k.state, k.adopter, k.busy = "adopted", req.PID, busy
	k.mu.Unlock()
	// And for what the run makes, which it removes with the gateway.
	k.held().answerFor(os.Getpid(), req.PID)
	k.say("adopted by launcher %s", strconv.Itoa(req.PID))
	a.State, a.OK = "adopted", true
	return a, k.name
}

// running says why the gateway cannot serve a run, if it cannot: its
// container is not running (the engine restarted; it exited).
func (k *keeper) running() error {
	ctx, cancel := context.WithTimeout(context.Background(), keeperAnswer)
	defer cancel()
	ok, err := k.rt.Running(ctx, k.spec.Project, generator.GatewayService)
	if err == nil && !ok {
		err = errors.New("its gateway is not running")
	}
	return err
}

// reply writes an answer, with a file descriptor when file is not nil.
func (k *keeper) reply(c *net.UnixConn, a keeperReply, file *os.File) {
	b, _ := json.Marshal(a)
	b = append(b, '\n')
	if file == nil {
		c.Write(b)
		return
	}
	c.WriteMsgUnix(b, syscall.UnixRights(int(file.Fd())), nil)
}
