package profile

import (
	"cmp"
	"fmt"
	"math"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/docker/go-units"
	"github.com/propio/propio-sandbox/internal/egress"
	"go.yaml.in/yaml/v3"
)

// Defaults of version 1, applied when no profile in the chain sets a value.
const (
	DefaultTarget  = "/workspace"
	DefaultCPUs    = 2.0
	DefaultMemory  = 2 * units.GiB
	DefaultPids    = 100
	DefaultTmp     = 1 * units.GiB
	DefaultDisk    = 10 * units.GiB
	DefaultNetwork = "none"
	// DefaultSSHAgent: the SSH agent is forwarded only when a profile, or
	// PROPIO_SANDBOX_SSH_AGENT, asks for it.
	DefaultSSHAgent = "off"
	// HomeDir is the writable HOME inside every sandbox (a tmpfs).
	HomeDir = "/home/sandbox"
)

// Bounds of resource requests. The upper bounds of cpus and memory are the
// host's, which preflight checks (a profile loads the same on every host).
const (
	MinCPUs   = 0.5
	MinMemory = 512 * units.MiB
	MinPids   = 10
	MaxPids   = 1000
	MinTmp    = 1 * units.GiB
	MaxTmp    = 100 * units.GiB
	MinDisk   = 1 * units.GiB
	MaxDisk   = 100 * units.GiB
)

// Limits are the host's capacity, the upper bounds of resource requests,
// which preflight checks, and what FitDefaults fits the defaults to. A zero
// field is unknown and not checked.
type Limits struct {
	CPUs   float64
	Memory int64
}

func (p *Profile) set(path ...string) bool {
	return p.src != nil && lookupPath(p.src.root, path) != nil
}

// text is the field's value as the profile wrote it.
func (p *Profile) text(path ...string) string {
	if p.src == nil {
		return ""
	}
	if n := lookupPath(p.src.root, path); n != nil {
		return n.Value
	}
	return ""
}

// lookupPath walks path (keys, and indexes of sequences) from n; nil when
// it is not there.
func lookupPath(n *yaml.Node, path []string) *yaml.Node {
	for _, k := range path {
		if n != nil && n.Kind == yaml.SequenceNode {
			i, err := strconv.Atoi(k)
			if err != nil || i < 0 || i >= len(n.Content) {
				return nil
			}
			n = n.Content[i]
			continue
		}
		n = lookup(n, k)
		if n == nil {
			return nil
		}
	}
	return n
}

func (p *Profile) applyDefaults() {
	if p.Version == 0 {
		p.Version = 1
	}
	if p.Workspace.Target == "" {
		p.Workspace.Target = DefaultTarget
	}
	if p.Workspace.Mode == "" {
		p.Workspace.Mode = "rw"
	}
	for i := range p.Mounts {
		if p.Mounts[i].Mode == "" {
			p.Mounts[i].Mode = "ro"
		}
	}
	if p.Network.Mode == "" {
		p.Network.Mode = DefaultNetwork
	}
	if p.Network.HostGateway == nil {
		p.Network.HostGateway = ptr(true)
	}
	if p.Resources.CPUs == 0 && !p.set("resources", "cpus") {
		p.Resources.CPUs = DefaultCPUs
	}
	if p.Resources.Memory == 0 && !p.set("resources", "memory") {
		p.Resources.Memory = DefaultMemory
	}
	if p.Resources.Pids == 0 && !p.set("resources", "pids") {
		p.Resources.Pids = DefaultPids
	}
	if p.Resources.Tmp == 0 && !p.set("resources", "tmp") {
		p.Resources.Tmp = DefaultTmp
	}
	if p.Resources.Disk == 0 && !p.set("resources", "disk") {
		p.Resources.Disk = DefaultDisk
	}
	if p.Resources.Idle.IsZero() {
		p.Resources.Idle.After = DefaultIdle
	}
	if p.Security.ReadOnlyRootfs == nil {
		p.Security.ReadOnlyRootfs = ptr(false)
	}
	if p.Security.CapDrop == nil && !p.set("security", "cap_drop") {
		p.Security.CapDrop = []string{"ALL"}
	}
	if p.Security.NoNewPrivileges == nil {
		p.Security.NoNewPrivileges = ptr(true)
	}
	if p.Security.Init == nil {
		p.Security.Init = ptr(true)
	}
	if p.SSHAgent == "" {
		p.SSHAgent = DefaultSSHAgent
	}
	if p.Engine == "" {
		p.Engine = "auto"
	}
}

// FitDefaults lowers the cpus and memory defaults to what the host has, so
// that a profile that does not ask for resources runs on a small machine.
// Values a profile sets are left for preflight to judge against the host.
// Load does not call it: a profile loads the same on every host.
func (p *Profile) FitDefaults(l Limits) {
	if l.CPUs > 0 && !p.set("resources", "cpus") && p.Resources.CPUs > l.CPUs {
		p.Resources.CPUs = math.Max(MinCPUs, l.CPUs)
	}
	if l.Memory > 0 && !p.set("resources", "memory") && int64(p.Resources.Memory) > l.Memory {
		p.Resources.Memory = ByteSize(l.Memory / units.MiB * units.MiB)
	}
}

func ptr[T any](v T) *T { return &v }

// Variables that profile strings may use.
var allowedVars = []string{"WORKSPACE", "HOME", "PROPIO_HOME"}

var varRef = regexp.MustCompile(`\$(\$|\{[^}]*\}?|[A-Za-z_][A-Za-z0-9_]*|)`)

// Vars are the values of the variables profile strings may use.
type Vars struct {
	Workspace  string
	Home       string
	PropioHome string
}

// Expand replaces ${WORKSPACE}, ${HOME}, ${PROPIO_HOME}, a leading ~/ and $$
// in s. Check has already rejected any other reference.
func Expand(s string, v Vars) string {
	if s == "~" {
		return v.Home
	}
	if rest, ok := strings.CutPrefix(s, "~/"); ok {
		// Expand the rest only: the value of HOME is not a profile string.
		return v.Home + "/" + expandVars(rest, v)
	}
	return expandVars(s, v)
}

func expandVars(s string, v Vars) string {
	return varRef.ReplaceAllStringFunc(s, func(m string) string {
		switch m {
		case "$$":
			return "$"
		case "${WORKSPACE}":
			return v.Workspace
		case "${HOME}":
			return v.Home
		case "${PROPIO_HOME}":
			return v.PropioHome
		}
		return m
	})
}

// expandable lists the fields whose strings are expanded, with their paths.
func (p *Profile) expandable() []struct {
	path  []string
	value string
} {
	type field = struct {
		path  []string
		value string
	}
	var out []field
	if p.Build != nil {
		out = append(out, field{[]string{"build", "context"}, p.Build.Context}, field{[]string{"build", "dockerfile"}, p.Build.Dockerfile})
	}
	for i, c := range p.Command {
		out = append(out, field{[]string{"command", strconv.Itoa(i)}, c})
	}
	for i, m := range p.Mounts {
		out = append(out, field{[]string{"mounts", strconv.Itoa(i), "source"}, m.Source}, field{[]string{"mounts", strconv.Itoa(i), "target"}, m.Target})
	}
	for _, k := range sortedKeys(p.Env.Set) {
		out = append(out, field{[]string{"env", "set", k}, p.Env.Set[k]})
	}
	for _, name := range p.SecretNames() {
		from := p.Secrets[name].From
		if from.File != "" {
			out = append(out, field{[]string{"secrets", name, "from", "file"}, from.File})
		}
		for i, a := range from.Command {
			out = append(out, field{[]string{"secrets", name, "from", "command", strconv.Itoa(i)}, a})
		}
	}
	if p.Network.UpstreamCA != "" {
		out = append(out, field{[]string{"network", "upstream_ca"}, p.Network.UpstreamCA})
	}
	return out
}

// Check applies the rules that a schema cannot say and that hold on any
// host (how much this host has is preflight's to judge). It returns every
// problem, as a List.
func (p *Profile) Check() error {
	var errs List
	add := func(msg, hint string, path ...string) { errs = append(errs, p.errorAt(msg, hint, path...)) }

	if p.Image == "" {
		add("image is required", "set image: to an image the engine has (propio-sandbox/agent:latest is built by `propio-sandbox build`), or extend a built-in profile with extends: open")
	}

	for _, f := range p.expandable() {
		for _, m := range varRef.FindAllString(f.value, -1) {
			switch {
			case m == "$$":
			case strings.HasPrefix(m, "${") && strings.HasSuffix(m, "}") && slices.Contains(allowedVars, m[2:len(m)-1]):
			default:
				add(fmt.Sprintf("%q cannot be expanded: only ${WORKSPACE}, ${HOME}, ${PROPIO_HOME} and ~/ are", m),
					"host environment variables are never expanded into a profile; write $$ for a literal $", f.path...)
			}
		}
	}

	if p.Build != nil {
		if p.Build.Context == "" {
			add("context is required when build is set", "", "build")
		} else if !isAbsLike(p.Build.Context) && p.Build.Dir == "" {
			add("a built-in profile's build context must be absolute", "", "build", "context")
		}
	}

	reserved := map[string]string{"/": "the root", "/proc": "the kernel's", "/sys": "the kernel's", "/dev": "the kernel's", "/tmp": "the sandbox's tmpfs", HomeDir: "the sandbox's HOME"}
	checkTarget := func(target string, path ...string) {
		clean := path0(target)
		if clean != target && target != "" {
			add(fmt.Sprintf("%q is not a clean absolute path (use %q)", target, clean), "", path...)
			return
		}
		if what, ok := reserved[clean]; ok {
			add(fmt.Sprintf("%s is %s mount point and cannot be used", clean, what), "", path...)
		}
	}
	checkTarget(p.Workspace.Target, "workspace", "target")

	targets := map[string]int{path0(p.Workspace.Target): -1}
	for i, m := range p.Mounts {
		idx := strconv.Itoa(i)
		if !isAbsLike(m.Source) && m.Dir == "" {
			add(fmt.Sprintf("source %q is relative, and a built-in profile has no directory to resolve it against", m.Source), "use an absolute path, ~/ or ${HOME}", "mounts", idx, "source")
		}
		if strings.Contains(m.Target, "$") || strings.HasPrefix(m.Target, "~") {
			continue // checked after expansion, by the generator
		}
		checkTarget(m.Target, "mounts", idx, "target")
		t := path0(m.Target)
		if prev, dup := targets[t]; dup {
			what := "the workspace target"
			if prev >= 0 {
				what = fmt.Sprintf("mounts[%d]", prev)
			}
			add(fmt.Sprintf("%s is already the target of %s", t, what), "", "mounts", idx, "target")
			continue
		}
		targets[t] = i
	}

	for _, list := range []string{"readonly", "hide"} {
		pats := p.Workspace.ReadOnly
		if list == "hide" {
			pats = p.Workspace.Hide
		}
		for i, pat := range pats {
			if _, err := path.Match(pat, ""); err != nil {
				add(fmt.Sprintf("%q is not a valid pattern: %v", pat, err), "", "workspace", list, strconv.Itoa(i))
				continue
			}
			for _, seg := range strings.Split(pat, "/") {
				if seg == ".." || seg == "." {
					add(fmt.Sprintf("%q must stay inside the workspace (no . or .. segments)", pat), "", "workspace", list, strconv.Itoa(i))
					break
				}
			}
		}
	}

	for i, name := range p.Env.Required {
		if !MatchesAny(p.Env.Pass, name) && !p.secretFromEnv(name) {
			add(fmt.Sprintf("%s is required but not passed, so the sandbox would never see it", name), fmt.Sprintf("add %s to env.pass, or read a secret from it", name), "env", "required", strconv.Itoa(i))
		}
	}

	if p.Resources.CPUs < MinCPUs {
		add(fmt.Sprintf("%g is below the minimum of %g", p.Resources.CPUs, MinCPUs), "", "resources", "cpus")
	}
	checkSize := func(field string, value ByteSize, lo, hi int64, hint string) {
		text := cmp.Or(p.text("resources", field), value.String())
		switch b := int64(value); {
		case b < 0:
			add(fmt.Sprintf("%q is not a size", text), hint, "resources", field)
		case b < lo:
			add(fmt.Sprintf("%s is below the minimum of %s", text, human(lo)), "", "resources", field)
		case hi > 0 && b > hi:
			add(fmt.Sprintf("%s is more than the maximum of %s", text, human(hi)), "", "resources", field)
		}
	}
	checkSize("memory", p.Resources.Memory, MinMemory, 0, "write a size such as 512m or 2g")
	checkSize("tmp", p.Resources.Tmp, MinTmp, MaxTmp, "write a size such as 512m or 2g")
	checkSize("disk", p.Resources.Disk, MinDisk, MaxDisk, "write a size such as 1g or 20g")
	if p.Resources.Pids < MinPids || p.Resources.Pids > MaxPids {
		add(fmt.Sprintf("%d is outside %d .. %d", p.Resources.Pids, MinPids, MaxPids), "", "resources", "pids")
	}
	if p.Resources.Timeout < 0 {
		add(fmt.Sprintf("%q is not a positive duration", p.text("resources", "timeout")), "write a duration such as 90s, 30m or 2h", "resources", "timeout")
	}
	if p.Resources.Idle.After < 0 {
		add(fmt.Sprintf("%q is neither a positive duration nor off", p.text("resources", "idle")), "write a duration such as 30m or 2h, or off", "resources", "idle")
	}
	if err := p.User.err(); err != nil {
		add(err.Error(), "write host, root or UID:GID", "user")
	}

	for i, c := range p.Security.CapAdd {
		if strings.EqualFold(strings.TrimPrefix(c, "CAP_"), "ALL") {
			add("adding every capability undoes the sandbox", "add only the capabilities the agent needs", "security", "cap_add", strconv.Itoa(i))
		}
	}

	for i, port := range p.Ports {
		if port.err != nil {
			add(fmt.Sprintf("%q: %s", port.Spec, lowerFirst(port.err.Error())), "", "ports", strconv.Itoa(i))
		}
	}
	switch {
	case len(p.Ports) > 0 && p.Network.Mode == "none":
		add("cannot be published when network.mode is none: the sandbox has only loopback",
			"set network.mode: open to publish ports", "ports")
	case len(p.Ports) > 0 && p.Network.Mode == "allowlist":
		add("cannot be published when network.mode is allowlist: the engine publishes no port of a container on an internal network",
			"set network.mode: open to publish ports", "ports")
	}
	// Grants that undo the sandbox, as far as they can be told without the
	// host (mount sources are judged by Grants).
	errs = append(errs, p.checkUnsafe(nil)...)
	p.checkAgentRequests(add)
	p.checkEgress(add)
	p.checkSecrets(add)
	p.checkChangeset(add)
	seen := map[string]bool{}
	for i, c := range p.Checks {
		idx := strconv.Itoa(i)
		switch {
		case slices.Contains(BuiltinChecks, c.Name):
			add(fmt.Sprintf("%q is the name of a built-in check", c.Name), "name the check after what it proves, such as \"openrouter key works\"", "checks", idx, "name")
		case seen[c.Name]:
			add(fmt.Sprintf("%q is the name of another check too", c.Name), "", "checks", idx, "name")
		}
		seen[c.Name] = true
		if c.Timeout < 0 {
			add(fmt.Sprintf("%q is not a positive duration", p.text("checks", idx, "timeout")), "write a duration such as 20s or 2m", "checks", idx, "timeout")
		}
	}
	p.sortByPos(errs)
	return errs.err()
}

// BuiltinChecks are the names of the built-in preflight checks, which a
// declared check may not take (internal/preflight defines them).
var BuiltinChecks = []string{"workspace", "trust", "env.required", "resources", "mounts", "ports", "ssh-agent", "engine", "image", "runtime", "network.join", "disk"}

// checkEgress reports the allowlist rules and the bandwidth cap that did
// not parse when the profile was decoded, each error at the rule that has it.
func (p *Profile) checkEgress(add func(msg, hint string, path ...string)) {
	n := p.Network
	if n.Mode != "allowlist" {
		for _, f := range []struct {
			name string
			set  bool
		}{{"allow", len(n.Allow) > 0}, {"deny", len(n.Deny) > 0}, {"join", len(n.Join) > 0}, {"bandwidth", n.Bandwidth.IsSet()},
			{"unlisted", n.Unlisted == UnlistedAsk}, {"ask_timeout", n.AskTimeout != 0}, {"methods", len(n.Methods) > 0}, {"upstream_ca", n.UpstreamCA != ""}} {
			if f.set {
				add(fmt.Sprintf("applies only to network.mode allowlist, and the mode is %s", n.Mode),
					"set network.mode: allowlist, or remove network."+f.name, "network", f.name)
			}
		}
		return
	}
	for _, list := range []struct {
		name  string
		rules []Rule
	}{{"allow", n.Allow}, {"deny", n.Deny}} {
		for i, r := range list.rules {
			switch err := r.problem(); {
			case err != nil && r.limits && r.Rule.Host == "" && !r.Addr.IsValid():
				add(err.Error(), "write a name (api.example.com), *.name for its subdomains, or an address; add :port for a port other than 80 and 443",
					"network", list.name, strconv.Itoa(i), "host")
			case err != nil && r.limits:
				add(err.Error(), "write methods in upper case (GET, POST, or * for any) and paths from / (/repos/**)", "network", list.name, strconv.Itoa(i))
			case err != nil:
				add(err.Error(), "write a name (api.example.com), *.name for its subdomains, or an address; add :port for a port other than 80 and 443",
					"network", list.name, strconv.Itoa(i))
			case r.limits && list.name == "deny":
				add("a deny rule denies the whole host: it takes no methods or paths", "limit the requests in network.allow", "network", list.name, strconv.Itoa(i))
			}
		}
	}
	if n.Bandwidth.err != nil {
		add(n.Bandwidth.err.Error(), "", "network", "bandwidth")
	}
	for i, m := range n.Methods {
		if err := egress.ParseMethod(m); err != nil {
			add(err.Error(), "", "network", "methods", strconv.Itoa(i))
		}
	}
	if slices.Contains(n.Methods, egress.AnyMethod) && len(n.Methods) > 1 {
		add("* is any method: name no other beside it", "", "network", "methods")
	}
	if n.UpstreamCA != "" && !isAbsLike(n.UpstreamCA) && n.UpstreamCADir == "" {
		add("a built-in profile's upstream_ca must be absolute", "", "network", "upstream_ca")
	}
	switch n.Unlisted {
	case "", UnlistedDeny, UnlistedAsk:
	default:
		add(fmt.Sprintf("%q is not deny or ask", n.Unlisted), "write deny (the default) or ask", "network", "unlisted")
	}
	switch t := n.AskTimeout; {
	case t < 0:
		add(fmt.Sprintf("%q is not a positive duration", p.text("network", "ask_timeout")), "write a duration such as 30s or 2m", "network", "ask_timeout")
	case t != 0 && (t < MinAskTimeout || t > MaxAskTimeout):
		add(fmt.Sprintf("%s is outside %s .. %s", t, MinAskTimeout, MaxAskTimeout), "write a duration such as 30s or 2m", "network", "ask_timeout")
	case t != 0 && n.Unlisted != UnlistedAsk:
		add("applies only with network.unlisted: ask", "set network.unlisted: ask, or remove network.ask_timeout", "network", "ask_timeout")
	}
	for i, name := range n.Join {
		if name == "host" || name == "none" {
			add(fmt.Sprintf("%q is not a network a container can join beside others", name),
				"name a network made with docker network create, on which the server the sandbox needs runs", "network", "join", strconv.Itoa(i))
		}
	}
}

// sortByPos puts errors in file order: the leaf's first, then each file it
// extends, each by line and column.
func (p *Profile) sortByPos(errs List) {
	slices.SortStableFunc(errs, func(a, b *Error) int { return p.comparePos(a.Pos, b.Pos) })
}

// comparePos orders positions in file order: the leaf's first, then each
// file it extends, each by line and column.
func (p *Profile) comparePos(a, b Pos) int {
	rank := func(file string) int {
		for i, s := range p.Meta.Chain {
			if s.File == file {
				return i
			}
		}
		return 0
	}
	return cmp.Or(cmp.Compare(rank(a.File), rank(b.File)), cmp.Compare(a.Line, b.Line), cmp.Compare(a.Col, b.Col))
}

// MatchesAny reports whether name matches one of the env patterns.
func MatchesAny(patterns []string, name string) bool {
	for _, p := range patterns {
		if ok, _ := path.Match(p, name); ok {
			return true
		}
	}
	return false
}

func isAbsLike(s string) bool {
	return strings.HasPrefix(s, "/") || strings.HasPrefix(s, "~/") || s == "~" || strings.HasPrefix(s, "${")
}

func lowerFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToLower(s[:1]) + s[1:]
}

func path0(s string) string {
	if s == "" {
		return s
	}
	return path.Clean(s)
}

func human(b int64) string {
	switch {
	case b%units.GiB == 0:
		return fmt.Sprintf("%dg", b/units.GiB)
	case b%units.MiB == 0:
		return fmt.Sprintf("%dm", b/units.MiB)
	}
	return strconv.FormatInt(b, 10)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// RequestKinds are the kinds of request that agent_requests may name: the
// agent may ask to publish a port, to raise its resources, or to read a
// host path.
var RequestKinds = []string{"port", "resources", "mount"}

// checkAgentRequests reports an agent_requests item that names no kind, or
// one named twice.
func (p *Profile) checkAgentRequests(add func(msg, hint string, path ...string)) {
	seen := map[string]bool{}
	for i, k := range p.AgentRequests {
		idx := strconv.Itoa(i)
		switch {
		case !slices.Contains(RequestKinds, k):
			add(fmt.Sprintf("%q is not a kind of request", k), "write port, resources or mount", "agent_requests", idx)
		case seen[k]:
			add(fmt.Sprintf("%q is named twice", k), "", "agent_requests", idx)
		}
		seen[k] = true
	}
}

// AgentAsks reports whether the agent may ask for kind from inside.
func (p *Profile) AgentAsks(kind string) bool { return slices.Contains(p.AgentRequests, kind) }
