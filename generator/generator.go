// Package generator turns a resolved profile into a Compose project.
//
// It is pure: Generate performs no I/O, runs nothing and reads no environment
// variables. Everything it needs to know about the host comes in a Host value,
// and environment variables passed through are named, never valued: the
// engine reads their values from the launcher's environment when it runs the
// project. The same inputs always give the same project, and Render always
// gives the same bytes.
package generator

import (
	"bytes"
	"fmt"
	"maps"
	"net/netip"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/propio/propio-sandbox/internal/profile"
	"go.yaml.in/yaml/v3"
)

// Service is the name of the service the agent runs in.
const Service = "agent"

// Label keys put on every resource of a sandbox.
const (
	LabelProfile   = "dev.propio-sandbox.profile"
	LabelWorkspace = "dev.propio-sandbox.workspace"
)

// Host is what the generator knows of the machine, gathered beforehand.
type Host struct {
	Workspace  string // absolute path of the directory the command runs in
	Home       string
	PropioHome string
	// BuiltinContext, when set, is where a build context that a built-in
	// profile sets is read from instead of where it says: the copy of the
	// default image's build context that ships inside the binary, written
	// out, for a ${PROPIO_HOME} without the Dockerfile (a `go install`ed
	// binary).
	BuiltinContext string
	UID, GID       int
	// EnvNames are the names of the host's environment variables, never their values.
	EnvNames []string
	// EmptyFile is an empty regular file on the host, bind-mounted read-only over hidden files.
	EmptyFile string
	// Matches are the workspace entries matched by workspace.readonly and workspace.hide.
	Matches []Match
	// Exists holds the host paths, among mount sources, that exist: an
	// optional mount whose source is not there is left out.
	Exists map[string]bool
	// LogDir is the host directory of the allowlist gateways' decision logs.
	LogDir string
	// AskDir is the host directory of the ask directories of sandboxes with
	// network.unlisted: ask, one per project (package ask).
	AskDir string
	// AgentDir is the host directory of the agents' directories of
	// sandboxes with agent_requests, one per project (AgentDir names one).
	AgentDir string
	// ResolvDir is the host directory of the resolv.conf files that point an
	// allowlist sandbox's DNS at its gateway (ResolvConf names one).
	ResolvDir string
	// BrokerDir is the host directory of the broker directories of
	// allowlist sandboxes, one per project, each mounted into its gateway
	// only (package broker); CADir that of their trust files, one per
	// project, each mounted read-only into its sandbox.
	BrokerDir, CADir string
	// TrustStore is where the image keeps its trust store (PEM), over which
	// the run's bundle is mounted; "" is SystemTrustStore.
	TrustStore string
	// SystemRoots is the host's trust store (PEM), mounted into a gateway
	// that verifies upstreams; "" when the host has none in a file.
	SystemRoots string
	// GitConfig are the user's git configuration files that exist
	// (~/.gitconfig, ~/.config/git/config, ~/.gitignore_global).
	GitConfig []string
	// KnownHosts is ~/.ssh/known_hosts when it exists; it comes with a
	// forwarded SSH agent.
	KnownHosts string
	// SSHAgent is the agent to forward, if any.
	SSHAgent SSHAgent
	// Passwd and Group are files holding PasswdFile and GroupFile for the
	// user, mounted over the image's when the sandbox runs as the user.
	Passwd, Group string
	// ExtraMounts are the user's mounts for this launch.
	ExtraMounts []ExtraMount
	// Engine says what differs for the engine that runs the project.
	Engine EngineFacts
	// RemoteLogs is, for a remote engine, the host directory of the
	// directories (one per project, RemoteLogs/PROJECT) that hold the
	// allowlist gateway's decision log during the run: copied into the
	// gateway's log volume before it, and back after it.
	RemoteLogs string
	// TestDisk is PROPIO_SANDBOX_TEST_DISK, for tests only: a cap on what
	// the sandbox writes below the 1g that resources.disk allows, so that a
	// test reaches it quickly. It only ever lowers the profile's cap; 0 for
	// none.
	TestDisk int64
	// Changeset is the changeset of a launch whose workspace or mounts are
	// in mode changeset; nil when there is none (render, declared checks),
	// and those directories are then mounted read-only.
	Changeset *Changeset
	// Grants are the user's grants for the workspace (internal/grants),
	// which an allowlist sandbox's gateway adds to the profile's rules;
	// GrantsFile is the file they are in, which the gateway names them by
	// (grant:FILE:N).
	GrantsFile string
	Grants     []Grant
	// Guard are the paths below the writable directories that the launch
	// mounts whatever the profile says (internal/guard): each git directory
	// on itself, so that the sandbox can neither rename nor replace it, and
	// git's executable surface read-only.
	Guard []GuardPath
}

// Grant is one of the user's grants, as the gateway takes it.
type Grant struct {
	N    int    // its number in Host.GrantsFile, from 1
	Deny bool   // a deny grant; else an allow grant
	Rule string // as network.allow writes it: host or host:port
}

// GuardPath is a path below a directory the sandbox may write, mounted
// beyond the profile's rules.
type GuardPath struct {
	Root     string // WorkspaceMount, "mount-I" (the profile's mounts[I]) or "extra-I" (ExtraMounts[I])
	Path     string // relative to the root, with forward slashes
	ReadOnly bool
}

// Match is a workspace entry matched by a readonly or hide pattern.
type Match struct {
	Path string // relative to the workspace, with forward slashes; no segment is a symbolic link (hostinfo.Match)
	Dir  bool
	Hide bool // matched by hide (else by readonly)
}

// Options are the choices of one invocation.
type Options struct {
	Project string   // the Compose project name
	Command []string // overrides the profile's command when not nil
	// Timeout overrides resources.timeout when not zero (a declared
	// check's own).
	Timeout time.Duration

	// For network.mode allowlist:
	GatewayImage   string       // the gateway's image (DefaultGatewayImage when empty)
	Subnet         netip.Prefix // the sandbox network (PickSubnet of the project when zero)
	OutsideNetwork string       // an existing network for the gateway's way out (one of the project's own when empty)

	// Keep makes the project a persistent sandbox's (up); nil for a run.
	Keep *Keep
}

// Vars returns the values of the variables a profile may use.
func (h Host) Vars() profile.Vars {
	return profile.Vars{Workspace: h.Workspace, Home: h.Home, PropioHome: h.PropioHome}
}

// BuildPaths returns the build context and the Dockerfile of p (which has a
// build section) on h, absolute: the context expanded and relative to the
// profile file that set it, the Dockerfile relative to the context, as the
// engine takes it (Dockerfile when unset). A context a built-in profile
// sets is h.BuiltinContext when that is set.
func BuildPaths(p *profile.Profile, h Host) (context, dockerfile string) {
	vars := h.Vars()
	context = profile.Expand(p.Build.Context, vars)
	if !filepath.IsAbs(context) {
		context = filepath.Join(p.Build.Dir, context)
	}
	if p.Build.Builtin() && h.BuiltinContext != "" {
		context = h.BuiltinContext
	}
	context = filepath.Clean(context)
	dockerfile = profile.Expand(p.Build.Dockerfile, vars)
	if dockerfile == "" {
		dockerfile = "Dockerfile"
	}
	if !filepath.IsAbs(dockerfile) {
		dockerfile = filepath.Join(context, dockerfile)
	}
	return context, filepath.Clean(dockerfile)
}

// MountSource returns the host path of a profile mount, expanded and absolute.
func MountSource(m profile.Mount, h Host) string {
	src := profile.Expand(m.Source, h.Vars())
	if !filepath.IsAbs(src) {
		src = filepath.Join(m.Dir, src)
	}
	return filepath.Clean(src)
}

// Ports returns the ports p publishes, as the sandbox publishes them: on
// 127.0.0.1 unless an address is given, and on the host port of the same
// number unless another is given.
func Ports(p *profile.Profile) []types.ServicePortConfig {
	var out []types.ServicePortConfig
	for _, spec := range p.Ports {
		for _, port := range spec.Bindings {
			if port.HostIP == "" {
				port.HostIP = "127.0.0.1"
			}
			if port.Published == "" { // "3000" means localhost:3000, not a random port
				port.Published = strconv.FormatUint(uint64(port.Target), 10)
			}
			out = append(out, port)
		}
	}
	return out
}

// Generate builds the Compose project that runs p on h. It returns a
// profile.List of positioned problems for what only the host can reveal (a
// mount target that is not absolute once expanded). A required mount whose
// source does not exist is in the project all the same: preflight's mounts
// check says so, and run refuses to start.
func Generate(p *profile.Profile, h Host, o Options) (*types.Project, error) {
	if !filepath.IsAbs(h.Workspace) {
		return nil, fmt.Errorf("workspace %q is not an absolute path", h.Workspace)
	}
	vars := h.Vars()
	svc := types.ServiceConfig{Name: Service}
	svc.Image = p.Image
	svc.PullPolicy = types.PullPolicyNever // images are built or pulled by the user, never behind their back
	if p.Build != nil {
		ctx, _ := BuildPaths(p, h)
		svc.Build = &types.BuildConfig{
			Context:    ctx,
			Dockerfile: profile.Expand(p.Build.Dockerfile, vars),
			Target:     p.Build.Target,
		}
		if len(p.Build.Args) > 0 {
			svc.Build.Args = types.MappingWithEquals{}
			for k, v := range p.Build.Args {
				svc.Build.Args[k] = ptr(v)
			}
		}
	}
	cmd := p.Command
	if o.Command != nil {
		cmd = o.Command
	}
	for _, c := range cmd {
		svc.Command = append(svc.Command, profile.Expand(c, vars))
	}

	uid, gid := p.User.IDs(h.UID, h.GID)
	svc.User = fmt.Sprintf("%d:%d", uid, gid)
	svc.WorkingDir = p.Workspace.Target
	svc.Environment = environment(p, h)

	project := &types.Project{Name: o.Project, WorkingDir: h.Workspace}
	vols, tmpfs, copies, err := mounts(project, p, h)
	if err != nil {
		return nil, err
	}
	svc.Volumes = vols
	svc.Tmpfs = h.Engine.tmpfs(tmpfs)
	credentials(p, h, &svc)
	agentRequests(p, h, project, &svc)
	guardMounts(p, h, &svc)

	labels := types.Labels{
		LabelProfile:   profileLabel(p),
		LabelWorkspace: h.Workspace,
	}
	svc.Labels = labels
	for k, v := range project.Volumes {
		maps.Copy(v.Labels, labels)
		project.Volumes[k] = v
	}
	switch p.Network.Mode {
	case "none":
		svc.NetworkMode = "none"
	case "allowlist":
		// Set below, by allowlist, once the service is complete.
	default:
		// The engine's default bridge, as `docker run` uses: a network made
		// for each run costs more than a quarter of the launch time (0.57 s
		// against 0.44 s for docker run here).
		svc.NetworkMode = "bridge"
		if *p.Network.HostGateway {
			svc.ExtraHosts = h.Engine.hostGateway()
		}
	}

	svc.CPUS = float32(p.Resources.CPUs)
	svc.MemLimit = types.UnitBytes(p.Resources.Memory)
	svc.PidsLimit = p.Resources.Pids

	svc.ReadOnly = *p.Security.ReadOnlyRootfs
	svc.Runtime = p.Security.Runtime
	svc.CapAdd = slices.Clone(p.Security.CapAdd)
	svc.CapDrop = slices.Clone(p.Security.CapDrop)
	if *p.Security.NoNewPrivileges {
		svc.SecurityOpt = []string{"no-new-privileges:true"}
	}
	svc.Init = ptr(*p.Security.Init)

	svc.Ports = Ports(p)

	ext := Extension{Profile: profileLabel(p), Disk: diskCap(p, h), Timeout: time.Duration(p.Resources.Timeout), Copies: copies}
	if o.Timeout > 0 {
		ext.Timeout = o.Timeout
	}
	if cs := h.Changeset; cs != nil {
		ext.Changeset = cs.extension()
	}
	if o.Keep != nil {
		o.Keep.apply(&svc, &ext)
	}

	project.Services = types.Services{}
	if p.Network.Mode == "allowlist" {
		if ext.Gateway, err = allowlist(project, p, h, o, &svc); err != nil {
			return nil, err
		}
	}
	if h.Engine.Remote && h.Engine.VolumeRoot != "" {
		ext.Copies = remoteBinds(project, h, &svc, ext.Copies)
		ext.Copies = remoteGatewayLog(project, h, ext.Copies)
	}
	ext.Set(&svc)
	project.Services[Service] = svc
	boundLogs(project)
	if h.Engine.Remote {
		if err := hostBinds(project); err != nil {
			return nil, err
		}
	}
	return project, nil
}

// LogMaxSize bounds what the engine keeps of a container's output (what
// the agent prints, the gateway's own output): well under the smallest
// disk cap (1g), so that printing is no way past it. The launcher gets the
// output as it comes (attached), never from the engine's log, which is
// there only for `docker logs` while the sandbox runs.
const LogMaxSize = "10m"

// boundLogs has the engine keep at most LogMaxSize of each container's
// output: json-file, whose max-size both Docker (which then keeps one file,
// truncated when full) and Podman (as k8s-file, conmon's log size) honour,
// whatever the engine's default driver (an unbounded json-file on Docker,
// journald on many Podman setups).
func boundLogs(project *types.Project) {
	for name, s := range project.Services {
		s.Logging = &types.LoggingConfig{Driver: "json-file", Options: types.Options{"max-size": LogMaxSize}}
		project.Services[name] = s
	}
}

// diskCap is the cap on what the sandbox writes: resources.disk, or the
// lower one a test asks for.
func diskCap(p *profile.Profile, h Host) int64 {
	disk := int64(p.Resources.Disk)
	if h.TestDisk > 0 && h.TestDisk < disk {
		return h.TestDisk
	}
	return disk
}

// DiskCap reads the cap on what the sandbox writes, in bytes, from a
// service's extension; 0 when it has none, or none that reads.
func DiskCap(svc types.ServiceConfig) int64 {
	ext, err := readExtension(svc)
	if err != nil {
		return 0
	}
	return ext.Disk
}

// profileLabel names the profile's file the same way however it was asked
// for: builtin:NAME, or the path of the leaf file.
func profileLabel(p *profile.Profile) string { return p.Meta.File }

// environment names the passed variables (the engine fills in their values)
// and sets the profile's defaults where no passed host variable overrides them.
func environment(p *profile.Profile, h Host) types.MappingWithEquals {
	env := types.MappingWithEquals{"HOME": ptr(profile.HomeDir)}
	for _, name := range h.EnvNames {
		if name != "HOME" && profile.MatchesAny(p.Env.Pass, name) {
			env[name] = nil
		}
	}
	for k, v := range p.Env.Set {
		if v, passed := env[k]; passed && v == nil {
			continue // a passed host value wins over the default
		}
		env[k] = ptr(profile.Expand(v, h.Vars()))
	}
	return env
}

// mounts lays out the filesystem: the workspace, its read-only and hidden
// paths, the profile's extra mounts, and the writable tmpfs mounts.
//
// On a remote engine (h.Engine.Remote), a directory the sandbox only reads
// is a snapshot: a volume filled with a copy of it (copies).
func mounts(project *types.Project, p *profile.Profile, h Host) (_ []types.ServiceVolumeConfig, _ types.StringList, copies []VolumeCopy, _ error) {
	snapshot := func(name, src, dst string) types.ServiceVolumeConfig {
		v, c := snapshotMount(project, name, src, dst)
		copies = append(copies, c)
		return v
	}
	target := p.Workspace.Target
	ws := bind(h.Workspace, target, p.Workspace.Mode != profile.ModeRW)
	if p.Workspace.Mode == profile.ModeChangeset {
		v, ok, err := changesetMount(project, h, WorkspaceMount, path.Clean(target))
		if err != nil {
			return nil, nil, nil, err
		}
		if ok {
			ws = v
		}
	}
	if ws.Type == types.VolumeTypeBind && ws.ReadOnly && h.Engine.Remote {
		ws = snapshot(WorkspaceMount, h.Workspace, path.Clean(target))
	}
	vols := []types.ServiceVolumeConfig{ws}

	// /tmp and HOME are each capped by resources.disk too: both are in
	// memory, and resources.memory bounds the two together.
	tmpSize := min(int64(p.Resources.Tmp), diskCap(p, h))
	uid, gid := p.User.IDs(h.UID, h.GID)
	tmpfs := types.StringList{
		fmt.Sprintf("/tmp:size=%d,mode=1777", tmpSize),
		fmt.Sprintf("%s:size=%d,mode=0700,uid=%d,gid=%d", profile.HomeDir, tmpSize, uid, gid),
	}

	matches := slices.Clone(h.Matches)
	slices.SortFunc(matches, func(a, b Match) int { return strings.Compare(a.Path, b.Path) })
	var hidden []string // hidden directories: nothing below them is mounted
	under := func(rel string) bool {
		for _, d := range hidden {
			if strings.HasPrefix(rel, d+"/") {
				return true
			}
		}
		return false
	}
	hides := map[string]bool{}
	for _, m := range matches {
		if m.Hide {
			hides[m.Path] = true
		}
	}
	for _, m := range matches {
		if under(m.Path) || (!m.Hide && hides[m.Path]) {
			continue
		}
		dst := path.Join(target, m.Path)
		switch {
		case m.Hide && m.Dir:
			tmpfs = append(tmpfs, dst+":ro,size=4k,mode=0555")
			hidden = append(hidden, m.Path)
		case m.Hide:
			if h.EmptyFile == "" {
				return nil, nil, nil, fmt.Errorf("hiding %s: no empty file to mount over it", m.Path)
			}
			vols = append(vols, bind(h.EmptyFile, dst, true))
		case p.Workspace.Mode != profile.ModeRO:
			vols = append(vols, bind(filepath.Join(h.Workspace, filepath.FromSlash(m.Path)), dst, true))
		}
	}

	// A required source that does not exist is mounted all the same:
	// preflight refuses to run without it (the engine never creates it).
	var errs profile.List
	for i, m := range p.Mounts {
		src := MountSource(m, h)
		if m.Optional && !h.Exists[src] {
			continue
		}
		dst := profile.Expand(m.Target, h.Vars())
		if !path.IsAbs(dst) {
			errs = append(errs, &profile.Error{Pos: p.Pos("mounts", strconv.Itoa(i), "target"), Field: fmt.Sprintf("mounts[%d].target", i), Msg: fmt.Sprintf("%q is not an absolute path", dst)})
			continue
		}
		v := bind(src, path.Clean(dst), m.Mode != profile.ModeRW)
		if m.Mode == profile.ModeChangeset {
			cv, ok, err := changesetMount(project, h, "mount-"+strconv.Itoa(i), path.Clean(dst))
			if err != nil {
				return nil, nil, nil, err
			}
			if ok {
				v = cv
			}
		}
		if v.Type == types.VolumeTypeBind && v.ReadOnly && h.Engine.Remote {
			v = snapshot("mount-"+strconv.Itoa(i), src, path.Clean(dst))
		}
		vols = append(vols, v)
	}
	if len(errs) > 0 {
		return nil, nil, nil, errs
	}
	return vols, tmpfs, copies, nil
}

func bind(src, dst string, readOnly bool) types.ServiceVolumeConfig {
	return types.ServiceVolumeConfig{
		Type:     types.VolumeTypeBind,
		Source:   src,
		Target:   dst,
		ReadOnly: readOnly,
		Bind:     &types.ServiceVolumeBind{CreateHostPath: false},
	}
}

func ptr[T any](v T) *T { return &v }

// Render prints a project as compose YAML: deterministic bytes that
// compose-go loads back to the same project. Dollar signs are doubled so that
// Compose's interpolation gives back the literal text.
func Render(project *types.Project) ([]byte, error) {
	raw, err := project.MarshalYAML()
	if err != nil {
		return nil, fmt.Errorf("rendering project: %w", err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return nil, fmt.Errorf("rendering project: %w", err)
	}
	normalize(&doc)
	environmentAsList(&doc)
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return nil, fmt.Errorf("rendering project: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("rendering project: %w", err)
	}
	return buf.Bytes(), nil
}

// environmentAsList writes each service's environment in Compose's list
// form: NAME=value for a value set, and the bare NAME for a variable passed
// from the host, which the engine fills in (the map form can only say that
// as NAME: null). The keys stay sorted, as the marshaller left them.
func environmentAsList(doc *yaml.Node) {
	root := doc
	if root.Kind == yaml.DocumentNode && len(root.Content) > 0 {
		root = root.Content[0]
	}
	services := mappingValue(root, "services")
	if services == nil || services.Kind != yaml.MappingNode {
		return
	}
	for i := 1; i < len(services.Content); i += 2 {
		env := mappingValue(services.Content[i], "environment")
		if env == nil || env.Kind != yaml.MappingNode {
			continue
		}
		list := make([]*yaml.Node, 0, len(env.Content)/2)
		for j := 0; j+1 < len(env.Content); j += 2 {
			k, v := env.Content[j], env.Content[j+1]
			item := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: k.Value}
			if v.Tag != "!!null" {
				item.Value += "=" + v.Value
			}
			if !plainSafe(item.Value) {
				item.Style = yaml.DoubleQuotedStyle
			}
			list = append(list, item)
		}
		*env = yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq", Content: list}
	}
}

// plainSafe reports whether s, which starts with a variable's name, reads
// back as itself written plain; otherwise it is double-quoted, so that the
// bytes do not depend on the encoder's choice.
func plainSafe(s string) bool {
	if strings.Contains(s, ": ") || strings.Contains(s, " #") || strings.HasSuffix(s, ":") || strings.HasSuffix(s, " ") {
		return false
	}
	return !strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f })
}

// mappingValue returns the value of key in mapping n, or nil.
func mappingValue(n *yaml.Node, key string) *yaml.Node {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

// sexagesimal is what YAML 1.1 readers take for a base-60 number (1000:1000).
var sexagesimal = regexp.MustCompile(`^[0-9]+(:[0-9]+)+$`)

// normalize doubles dollar signs, and settles how strings are quoted, so that
// the bytes do not depend on the YAML encoder's version: quoted strings are
// double-quoted, and a uid:gid is always quoted.
func normalize(n *yaml.Node) { settleScalars(n, true) }

// settleScalars settles how strings are quoted, so that the bytes do not
// depend on the YAML encoder's version, and doubles dollar signs when
// dollars (Compose reads $ as interpolation; Kubernetes' manifests do not).
func settleScalars(n *yaml.Node, dollars bool) {
	if n.Kind == yaml.ScalarNode {
		if dollars && strings.Contains(n.Value, "$") {
			n.Value = strings.ReplaceAll(n.Value, "$", "$$")
		}
		switch {
		case n.Style == yaml.SingleQuotedStyle:
			n.Style = yaml.DoubleQuotedStyle
		case n.Tag == "!!str" && n.Style == 0 && sexagesimal.MatchString(n.Value):
			n.Style = yaml.DoubleQuotedStyle
		}
	}
	for _, c := range n.Content {
		settleScalars(c, dollars)
	}
}

// ProjectName is the Compose project name for a sandbox of workspace: propio-
// and the directory's name, lower-cased to what Compose accepts, then the
// suffix that makes a run unique (empty for render).
func ProjectName(workspace, suffix string) string {
	var b strings.Builder
	b.WriteString("propio-")
	for _, r := range strings.ToLower(filepath.Base(workspace)) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
	}
	name := strings.TrimRight(b.String(), "-_")
	if suffix != "" {
		name += "-" + suffix
	}
	return name
}

// guardMounts adds the guard's paths, each below its root, unless a mount
// of the profile is there already (a hidden or read-only path is read-only
// already) or a hidden directory covers it.
func guardMounts(p *profile.Profile, h Host, svc *types.ServiceConfig) {
	taken := map[string]bool{}
	for _, v := range svc.Volumes {
		taken[v.Target] = true
	}
	var hidden []string
	for _, t := range svc.Tmpfs {
		dst, _, _ := strings.Cut(t, ":")
		taken[dst] = true
		hidden = append(hidden, dst)
	}
	for _, g := range h.Guard {
		src, dst, ok := guardRoot(p, h, g.Root)
		if !ok {
			continue
		}
		src = filepath.Join(src, filepath.FromSlash(g.Path))
		dst = path.Join(dst, g.Path)
		covered := taken[dst]
		for _, d := range hidden {
			covered = covered || strings.HasPrefix(dst, d+"/")
		}
		if covered {
			continue
		}
		taken[dst] = true
		svc.Volumes = append(svc.Volumes, bind(src, dst, g.ReadOnly))
	}
}

// guardRoot is the host directory and the sandbox path of a guard root.
func guardRoot(p *profile.Profile, h Host, name string) (src, dst string, ok bool) {
	if name == WorkspaceMount {
		return h.Workspace, path.Clean(p.Workspace.Target), true
	}
	if i, err := strconv.Atoi(strings.TrimPrefix(name, "mount-")); err == nil && strings.HasPrefix(name, "mount-") && i < len(p.Mounts) {
		m := p.Mounts[i]
		return MountSource(m, h), path.Clean(profile.Expand(m.Target, h.Vars())), true
	}
	if i, err := strconv.Atoi(strings.TrimPrefix(name, "extra-")); err == nil && strings.HasPrefix(name, "extra-") && i < len(h.ExtraMounts) {
		return h.ExtraMounts[i].Source, h.ExtraMounts[i].Target, true
	}
	return "", "", false
}
