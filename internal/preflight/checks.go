package preflight

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/docker/go-units"
	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/backend"
	"github.com/propio/propio-sandbox/internal/buildinputs"
	"github.com/propio/propio-sandbox/internal/fsutil"
	"github.com/propio/propio-sandbox/internal/profile"
	"github.com/propio/propio-sandbox/internal/sshagent"
)

// command is how hints name the launcher.
const command = "propio-sandbox"

// EngineConn is what the checks ask of a connected engine.
type EngineConn interface {
	Info(ctx context.Context) (backend.Info, error)
	ImageArch(ctx context.Context, ref string) (arch string, found bool, err error)
	HasNetwork(ctx context.Context, name string) (bool, error)
}

// TrustVerifier says whether a repository profile is trusted as it is, and
// what was trusted under a key (a build's inputs).
type TrustVerifier interface {
	Verify(p *profile.Profile) error
	Lookup(key string) (digest string, text []byte, found bool, err error)
}

// Hinter is an error that knows what to do about itself; the engine
// check passes its hints on.
type Hinter interface {
	Hints() []string
}

// Inputs are what the checks look at.
type Inputs struct {
	Profile *profile.Profile
	// Ref is how the profile was selected (-p), for hints; empty for the default.
	Ref string
	// Workspace is the directory the sandbox mounts, symlinks resolved.
	Workspace string
	// Home is the user's home directory.
	Home string
	// Dangers says why mounting a host path would undo the sandbox (the
	// engine's socket in it, HOME in it, in ~/.ssh, ...); nil: nothing would.
	Dangers func(path string) []profile.Danger
	// Host is the generator's view of the host, for mount sources.
	Host generator.Host
	// Build: the image will be built first (--build).
	Build bool
	// Missing, when set, is told by the image check that the image is not
	// on the engine and that the profile's build may make it (it has a
	// build section, trusted when it reads the workspace): run builds it
	// first. Nil for doctor, which only says so.
	Missing func()
	// Limits are the host's capacity.
	Limits profile.Limits
	// Trust verifies repository profiles.
	Trust TrustVerifier
	// Connect reaches the engine; it is called at most once.
	Connect func(context.Context) (EngineConn, error)
	// LookupEnv reads the launcher's environment (os.LookupEnv when nil).
	LookupEnv func(string) (string, bool)
	// Stat reads a path's information (os.Stat when nil).
	Stat func(string) (fs.FileInfo, error)
	// Listen takes a host address for a moment, as net.Listen or
	// net.ListenPacket would ("tcp" or "udp"); the default does exactly that.
	Listen func(network, address string) (io.Closer, error)
	// Changeset, when set, says how a changeset would be made here
	// (generator.ChangesetOverlay or ChangesetCopy, and why), for the disk
	// check to say how its cap holds. Nil: the check does not ask.
	Changeset func(context.Context) (mode, why string)
}

// Checks returns the built-in checks for in, in the order run uses.
func Checks(in Inputs) []Check {
	if in.LookupEnv == nil {
		in.LookupEnv = os.LookupEnv
	}
	if in.Stat == nil {
		in.Stat = os.Stat
	}
	if in.Listen == nil {
		in.Listen = listen
	}
	c := &checker{Inputs: in}
	return []Check{
		{Workspace, c.workspace},
		{Trust, c.trust},
		{EnvRequired, c.envRequired},
		{Resources, c.resources},
		{Mounts, c.mounts},
		{Ports, c.ports},
		{SSHAgent, c.sshAgent},
		{Engine, c.engine},
		{Image, c.image},
		{Runtime, c.runtime},
		{NetworkJoin, c.networkJoin},
		{Disk, c.disk},
	}
}

type checker struct {
	Inputs
	once    sync.Once
	eng     EngineConn
	engErr  error
	info    backend.Info
	infoErr error
	// The profile's image, looked up with the info.
	imageArch  string
	imageFound bool
	imageErr   error
}

// connect reaches the engine once, and reads its info and the image's
// architecture at the same time (both are needed; each costs a round trip
// to the engine, and run's start-up waits for them).
func (c *checker) connect(ctx context.Context) (EngineConn, error) {
	c.once.Do(func() {
		if c.Connect == nil {
			c.engErr = errors.New("no engine to connect to")
			return
		}
		c.eng, c.engErr = c.Connect(ctx)
		if c.engErr != nil {
			return
		}
		var wg sync.WaitGroup
		wg.Go(func() { c.imageArch, c.imageFound, c.imageErr = c.eng.ImageArch(ctx, c.Profile.Image) })
		c.info, c.infoErr = c.eng.Info(ctx)
		wg.Wait()
	})
	return c.eng, c.engErr
}

var errNoEngine = fail("not checked: the engine is not reachable", "fix what the engine check reports first")

func (c *checker) file() string { return c.Profile.Meta.File }

func (c *checker) workspace(ctx context.Context) Result {
	ws := filepath.Clean(c.Workspace)
	fi, err := c.Stat(ws)
	switch {
	case err != nil:
		return fail(fmt.Sprintf("the workspace %s cannot be read: %v", ws, err), "run "+command+" in an existing project directory")
	case !fi.IsDir():
		return fail(fmt.Sprintf("the workspace %s is not a directory", ws), "run "+command+" in a project directory")
	case ws == "/":
		return fail("the workspace is /, the whole host filesystem", "run "+command+" in a project directory, not in /")
	case c.Home != "" && samePath(ws, c.Home):
		return fail(fmt.Sprintf("the workspace is your home directory %s: the sandbox would see and change all of it", c.Home), "run "+command+" in a project directory below your home")
	}
	if c.Dangers != nil {
		if d := c.Dangers(ws); len(d) > 0 {
			return fail("the workspace "+d[0].What, "run "+command+" in a project directory that holds no keys, credentials or engine socket (the sandbox may read and change all of it); mount what it needs with mounts in a profile of your own")
		}
	}
	if _, err := c.connect(ctx); err != nil {
		return pass(ws + " is a directory the sandbox may have (the engine's data directory was not compared: the engine is not reachable)")
	}
	if c.infoErr != nil {
		return fail(c.infoErr.Error(), "check that the engine answers (docker info)")
	}
	if d := c.info.DataDir; d != "" && fsutil.Within(filepath.Clean(d), ws) {
		return fail(fmt.Sprintf("the workspace %s is in the engine's data directory %s", ws, d), "run "+command+" in a project directory outside "+d)
	}
	return pass(ws + " is a directory the sandbox may have")
}

func samePath(a, b string) bool {
	if a == b {
		return true
	}
	ra, err1 := filepath.EvalSymlinks(a)
	rb, err2 := filepath.EvalSymlinks(b)
	return err1 == nil && err2 == nil && ra == rb
}

func (c *checker) trust(context.Context) Result {
	p := c.Profile
	reason := p.Meta.File + " is not a repository profile: it needs no trust"
	if profile.NeedsTrust(p, c.Workspace) {
		if c.Trust == nil {
			return fail(p.Meta.File+" is a repository profile and no trust store was given", "run `"+command+" trust` in "+c.Workspace)
		}
		if err := c.Trust.Verify(p); err != nil {
			return fail(err.Error(),
				"a repository profile can change what the sandbox may do, so run needs your trust for each version of it",
				"review it with `"+command+" profiles show "+p.Meta.File+"`, then run `"+command+" trust` in "+c.Workspace)
		}
		reason = p.Meta.File + " is trusted as it is"
	}
	if c.Build && p.Build != nil {
		r := c.buildTrust()
		if !r.OK {
			return r
		}
		reason += "; " + r.Reason
	}
	return pass(reason)
}

// buildTrust checks, for a build, that what it reads and the agent could
// have changed (its Dockerfile or context are in the workspace) is trusted
// as it is: the Dockerfile, the .dockerignore files, the files it copies by
// name.
func (c *checker) buildTrust() Result {
	ctx, df := generator.BuildPaths(c.Profile, c.Host)
	paths := buildinputs.Paths{Context: ctx, Dockerfile: df}
	if !paths.InWorkspace(c.Workspace) {
		return pass("the build reads nothing of the workspace: it needs no trust")
	}
	trustCmd := "`" + command + " trust`"
	if c.Ref != "" {
		trustCmd = "`" + command + " trust -p " + c.Ref + "`"
	}
	in, err := buildinputs.Collect(paths)
	if err != nil {
		return fail(err.Error(), "the build reads it from the workspace, where a sandbox may have made it; remove it or make it a regular file, then run "+trustCmd+" in "+c.Workspace)
	}
	if c.Trust == nil {
		return fail("the build of "+df+" reads files of the workspace and no trust store was given", "run "+trustCmd+" in "+c.Workspace)
	}
	digest, text, found, err := c.Trust.Lookup(in.Key())
	if err != nil {
		return fail(err.Error())
	}
	if err := in.Verify(buildinputs.Record{Digest: digest, Manifest: text}, found); err != nil {
		return fail(err.Error(),
			"a build runs its Dockerfile's steps, with the network, and what they execute; these files are in the workspace, where the agent can change them, so building needs your trust for each version of them",
			"review the Dockerfile and the files it copies, then run "+trustCmd+" in "+c.Workspace)
	}
	return pass("the build of " + df + " is trusted as it is")
}

func (c *checker) envRequired(context.Context) Result {
	var missing []string
	for _, name := range c.Profile.Env.Required {
		if _, ok := c.LookupEnv(name); !ok {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return fail("required environment variables are not set: "+strings.Join(missing, ", "),
			"set them in this shell, or remove them from env.required in "+c.file())
	}
	if len(c.Profile.Env.Required) == 0 {
		return pass("the profile requires no variables")
	}
	return pass("set: " + strings.Join(c.Profile.Env.Required, ", "))
}

// remote connects to the engine, unless done, and tells whether it runs on
// another machine: then the checks of the host's resources, ports and SSH
// agent look at that machine, as its engine reports it. False when the
// engine cannot be reached (the engine check says why).
func (c *checker) remote(ctx context.Context) bool {
	if _, err := c.connect(ctx); err != nil || c.infoErr != nil {
		return false
	}
	return c.info.Remote
}

func (c *checker) resources(ctx context.Context) Result {
	r := c.Profile.Resources
	limits, where := c.Limits, "this host"
	if c.remote(ctx) {
		limits, where = profile.Limits{CPUs: c.info.CPUs, Memory: c.info.Memory}, "the engine's host"
	}
	var problems []string
	if limits.CPUs > 0 && r.CPUs > limits.CPUs {
		problems = append(problems, fmt.Sprintf("cpus %g is more than %s's %g cores", r.CPUs, where, limits.CPUs))
	}
	if limits.Memory > 0 && int64(r.Memory) > limits.Memory {
		problems = append(problems, fmt.Sprintf("memory %s is more than %s's %s", r.Memory, where, units.BytesSize(float64(limits.Memory))))
	}
	if len(problems) > 0 {
		return fail(strings.Join(problems, "; "), "lower resources.cpus and resources.memory in "+c.file()+" to what "+where+" has")
	}
	return pass(fmt.Sprintf("cpus %g and memory %s fit %s", r.CPUs, r.Memory, where))
}

// MountsHint is what to do about a required mount source that does not exist.
const MountsHint = "create it, or mark the mount optional: true (a missing source is never created)"

// MissingMounts are the required mounts of p whose source does not exist
// on h (stat says), each as FILE:LINE:COL: mounts[I].source: SRC does not
// exist; and how many sources exist. This check owns that failure: the
// generator mounts a required source whether it exists or not.
func MissingMounts(p *profile.Profile, h generator.Host, stat func(string) (fs.FileInfo, error)) (missing []string, exist int) {
	for i, m := range p.Mounts {
		src := generator.MountSource(m, h)
		if _, err := stat(src); err != nil {
			if m.Optional {
				continue
			}
			pos := p.Pos("mounts", strconv.Itoa(i), "source")
			missing = append(missing, fmt.Sprintf("%s: mounts[%d].source: %s does not exist", pos, i, src))
			continue
		}
		exist++
	}
	if ca := generator.UpstreamCA(p, h); ca != "" && p.Network.Mode == "allowlist" {
		if _, err := stat(ca); err != nil {
			missing = append(missing, fmt.Sprintf("%s: network.upstream_ca: %s does not exist", p.Pos("network", "upstream_ca"), ca))
		} else {
			exist++
		}
	}
	return missing, exist
}

func (c *checker) mounts(ctx context.Context) Result {
	missing, n := MissingMounts(c.Profile, c.Host, c.Stat)
	if len(missing) > 0 {
		return fail(strings.Join(missing, "; "), MountsHint)
	}
	if c.remote(ctx) {
		var rw []string
		for i, m := range c.Profile.Mounts {
			if m.Mode == profile.ModeRW {
				rw = append(rw, fmt.Sprintf("%s: mounts[%d].mode: rw", c.Profile.Pos("mounts", strconv.Itoa(i), "mode"), i))
			}
		}
		if len(rw) > 0 {
			return fail(c.info.RemoteWhy+": its sandbox cannot write to a directory of this host: "+strings.Join(rw, "; "),
				"use mode changeset (the writes come back as a changeset to review and apply) or ro (a copy the sandbox reads)",
				"or run it with an engine on this host")
		}
		return pass(fmt.Sprintf("%d mount source(s) exist, copied to the engine's host", n))
	}
	return pass(fmt.Sprintf("%d mount source(s) exist", n))
}

// sshAgent checks, when forwarding is on (by the profile or
// PROPIO_SANDBOX_SSH_AGENT), that SSH_AUTH_SOCK names a socket an agent
// answers on. Under auto a missing agent is only a warning, later.
func (c *checker) sshAgent(ctx context.Context) Result {
	getenv := func(k string) (string, bool) { return c.LookupEnv(k) }
	mode, err := sshagent.ModeFrom(c.Profile.SSHAgent, getenv)
	if err != nil {
		return fail(err.Error(), "set "+sshagent.EnvMode+" to auto, on or off")
	}
	if mode != sshagent.On {
		return pass("SSH agent forwarding is " + string(cmpMode(mode)) + ": nothing to check")
	}
	if c.remote(ctx) {
		return fail(c.info.RemoteWhy+": SSH agent forwarding is on, and the agent's socket cannot be mounted into a sandbox on another machine (forwarding over the engine's connection is not done)",
			"set ssh_agent: \"off\" in "+c.file()+", or "+sshagent.EnvMode+"=off", "or run it with an engine on this host")
	}
	hints := []string{
		"start an agent and add a key (eval \"$(ssh-agent)\"; ssh-add), then run again",
		"or set " + sshagent.EnvMode + "=off",
	}
	sock, ok := c.LookupEnv("SSH_AUTH_SOCK")
	if !ok || sock == "" {
		return fail("ssh_agent is on and SSH_AUTH_SOCK is not set", hints...)
	}
	conn, err := net.DialTimeout("unix", sock, 2*time.Second)
	if err != nil {
		return fail(fmt.Sprintf("ssh_agent is on and no agent answers on SSH_AUTH_SOCK %s: %v", sock, err), hints...)
	}
	conn.Close()
	return pass("an SSH agent answers on " + sock)
}

func cmpMode(m sshagent.Mode) sshagent.Mode {
	if m == "" {
		return sshagent.Auto
	}
	return m
}

func (c *checker) ports(ctx context.Context) Result {
	remote := c.remote(ctx)
	var taken, free []string
	for _, p := range generator.Ports(c.Profile) {
		lo, hi, err := portRange(p.Published)
		if err != nil {
			return fail(fmt.Sprintf("ports: host port %q: %v", p.Published, err), "fix ports in "+c.file())
		}
		proto := p.Protocol
		if proto == "" {
			proto = "tcp"
		}
		for port := lo; port <= hi; port++ {
			addr := net.JoinHostPort(p.HostIP, strconv.Itoa(port))
			if remote {
				if by := publishedOn(c.info.Published, p.HostIP, port, proto); by != "" {
					taken = append(taken, fmt.Sprintf("%s/%s (a container of the engine publishes %s)", addr, proto, by))
				} else {
					free = append(free, addr+"/"+proto)
				}
				continue
			}
			l, err := c.Listen(proto, addr)
			if err != nil {
				taken = append(taken, fmt.Sprintf("%s/%s (%v)", addr, proto, err))
				continue
			}
			l.Close()
			free = append(free, addr+"/"+proto)
		}
	}
	if len(taken) > 0 {
		return fail("host ports are taken: "+strings.Join(taken, "; "), "stop what listens there, or publish another host port in ports of "+c.file())
	}
	if len(free) == 0 {
		return pass("the profile publishes no ports")
	}
	if remote {
		return pass("not published by the engine's containers, on its host: " + strings.Join(free, ", "))
	}
	return pass("free: " + strings.Join(free, ", "))
}

// publishedOn is the published address of list (ADDRESS:PORT/PROTO) that
// holds port for proto on ip ("" or 0.0.0.0: every address), or "".
func publishedOn(list []string, ip string, port int, proto string) string {
	all := func(a string) bool { return a == "" || a == "0.0.0.0" || a == "::" }
	for _, p := range list {
		hp, pr, _ := strings.Cut(p, "/")
		h, po, err := net.SplitHostPort(hp)
		if err != nil || pr != proto || po != strconv.Itoa(port) {
			continue
		}
		if all(h) || all(ip) || h == ip {
			return p
		}
	}
	return ""
}

// portRange reads "8080" or "8080-8082".
func portRange(s string) (lo, hi int, err error) {
	a, b, isRange := strings.Cut(s, "-")
	if lo, err = strconv.Atoi(a); err != nil {
		return 0, 0, err
	}
	hi = lo
	if isRange {
		if hi, err = strconv.Atoi(b); err != nil {
			return 0, 0, err
		}
	}
	if lo < 1 || hi > 65535 || hi < lo {
		return 0, 0, errors.New("not a port or port range")
	}
	return lo, hi, nil
}

func listen(network, address string) (io.Closer, error) {
	if strings.HasPrefix(network, "udp") {
		return net.ListenPacket(network, address)
	}
	return net.Listen(network, address)
}

func (c *checker) engine(ctx context.Context) Result {
	if _, err := c.connect(ctx); err != nil {
		var h Hinter
		if errors.As(err, &h) {
			return fail(err.Error(), h.Hints()...)
		}
		return fail(err.Error())
	}
	if c.infoErr != nil {
		return fail(c.infoErr.Error(), "check that the engine answers (docker info)")
	}
	if c.info.Remote && c.Profile.Network.Mode == "allowlist" && c.Profile.Network.Asks() {
		return fail(fmt.Sprintf("%s; %s: network.unlisted: ask does not run on an engine on another machine yet (its gateway asks through a directory of this host)", engineReason(c.info), c.Profile.Pos("network", "unlisted")),
			"use network.unlisted: deny there, or run it with an engine on this host")
	}
	if c.Profile.Network.Mode == "allowlist" && c.info.Kind == "podman" && backend.VersionLess(c.info.Version, backend.FencedAllowlistSince) {
		return fail(engineReason(c.info)+"; network.mode allowlist needs Podman "+backend.FencedAllowlistSince+" or newer (the fence that keeps its sandbox off the host's address on the sandbox network is tested from that version on, rootful and rootless)",
			"upgrade Podman to "+backend.FencedAllowlistSince+" or newer, or use Docker for this profile",
			"or a profile without an allowlist here (-p open, or -p offline)")
	}
	reason := engineReason(c.info)
	if c.info.LimitsIgnored != "" {
		reason += "; resource limits NOT enforced: " + c.info.LimitsIgnored
	}
	if c.info.Remote {
		return pass(reason + "; on another machine (" + c.info.RemoteWhy + "): the workspace goes there by copy")
	}
	return pass(reason)
}

// engineReason says which engine answered, where, through which Docker
// context, and its architecture: "Docker 26.1.5 at unix:///var/run/docker.sock
// (context desktop, from DOCKER_CONTEXT), amd64".
func engineReason(in backend.Info) string {
	what := strings.TrimSpace(cmp.Or(in.Kind, "engine") + " " + in.Version)
	if in.Host != "" {
		what += " at " + in.Host
	}
	switch {
	case in.Context != "" && in.ContextFrom != "":
		what += fmt.Sprintf(" (context %q, from %s)", in.Context, in.ContextFrom)
	case in.Context != "":
		what += fmt.Sprintf(" (context %q)", in.Context)
	}
	return "reachable: " + what + ", " + in.Arch
}

func (c *checker) image(ctx context.Context) Result {
	p := c.Profile
	if _, err := c.connect(ctx); err != nil {
		return errNoEngine
	}
	if c.Build && p.Build != nil {
		return pass(p.Image + " will be built first (--build)")
	}
	arch, found, err := c.imageArch, c.imageFound, c.imageErr
	if err != nil {
		return fail(err.Error(), "check that the engine answers (docker info)")
	}
	if !found && p.Build != nil {
		return c.buildMissing()
	}
	if !found {
		return fail("image "+p.Image+" is not on the engine", c.imageHint())
	}
	if c.infoErr == nil && c.info.Arch != "" && arch != "" && arch != c.info.Arch {
		return fail(fmt.Sprintf("image %s is built for %s, the engine runs %s", p.Image, arch, c.info.Arch), c.imageHint())
	}
	return pass(p.Image + " is on the engine, for " + arch)
}

// buildMissing: the image is not on the engine and the profile says how
// to build it; run builds it first when the build needs no trust, or is
// trusted as it is.
func (c *checker) buildMissing() Result {
	p := c.Profile
	if r := c.buildTrust(); !r.OK {
		return fail("image "+p.Image+" is not on the engine, and its build needs trust: "+r.Reason, r.Hints...)
	}
	if c.Missing != nil {
		c.Missing()
	}
	ctx, _ := generator.BuildPaths(p, c.Host)
	return pass(p.Image + " is not on the engine: run builds it first, from " + ctx)
}

func (c *checker) imageHint() string {
	p := c.Profile
	if p.Build != nil {
		pflag := ""
		if c.Ref != "" {
			pflag = " -p " + c.Ref
		}
		return "build it: " + command + " build" + pflag + " (or run with --build)"
	}
	return "build or pull it yourself (docker pull " + p.Image + "); " + command + " never pulls images on its own"
}

// networkJoin checks that the networks the gateway is to join exist: the
// engine would fail the start with less to go on, and never makes them.
func (c *checker) networkJoin(ctx context.Context) Result {
	p := c.Profile
	if p.Network.Mode != "allowlist" || len(p.Network.Join) == 0 {
		return pass("the profile joins no networks")
	}
	eng, err := c.connect(ctx)
	if err != nil {
		return errNoEngine
	}
	var missing []string
	first := ""
	for i, name := range p.Network.Join {
		ok, err := eng.HasNetwork(ctx, name)
		if err != nil {
			return fail(err.Error(), "check that the engine answers (docker info)")
		}
		if !ok {
			first = cmp.Or(first, name)
			missing = append(missing, fmt.Sprintf("%s: network.join[%d]: the engine has no network %s", p.Pos("network", "join", strconv.Itoa(i)), i, name))
		}
	}
	if len(missing) > 0 {
		return fail(strings.Join(missing, "; "),
			"create it and start the server the sandbox needs on it (docker network create "+first+"; docker run -d --network "+first+" --name SERVER IMAGE), or remove it from network.join in "+c.file())
	}
	return pass("the gateway joins " + strings.Join(p.Network.Join, ", "))
}

func (c *checker) runtime(ctx context.Context) Result {
	if _, err := c.connect(ctx); err != nil {
		return errNoEngine
	}
	if c.infoErr != nil {
		return fail(c.infoErr.Error(), "check that the engine answers (docker info)")
	}
	want := c.Profile.Security.Runtime
	if want == "" {
		return pass("the engine's default runtime, " + c.info.DefaultRuntime)
	}
	if slices.Contains(c.info.Runtimes, want) {
		return pass("the engine has the runtime " + want)
	}
	return fail(fmt.Sprintf("the engine has no runtime %q (it has: %s)", want, strings.Join(c.info.Runtimes, ", ")),
		"install "+want+" and register it with the engine (Docker: \"runtimes\" in /etc/docker/daemon.json), or change security.runtime in "+c.file())
}
