package profile

import (
	"fmt"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/propio/propio-sandbox/internal/fsutil"
)

// Names of the grants that undo the sandbox, as `unsafe` names them. Each
// capability of DangerousCaps is named by itself (SYS_ADMIN) too.
const (
	UnsafeDockerSocket = "docker-socket"
	UnsafeHostRoot     = "host-root"
	UnsafeHome         = "home"
	UnsafeSSH          = "ssh"
	UnsafeGnuPG        = "gnupg"
	UnsafeCloud        = "cloud-credentials"
	UnsafeRootUser     = "root-user"
	UnsafeEnvGlob      = "env-glob"
	UnsafeSystemWrite  = "system-write"
)

// SystemPaths are the host's own system directories: a sandbox that may
// write one of them, or a directory holding one, may change the host's
// configuration, programs, boot, root's files, the engines' storage or the
// kernel's interfaces, and so run code as root on the host.
var SystemPaths = []string{"/etc", "/usr", "/bin", "/sbin", "/lib", "/lib64", "/boot", "/root", "/var/lib/docker", "/var/lib/containers", "/proc", "/sys", "/dev"}

// DangerousCaps are the capabilities that break a container's isolation,
// each with what it lets the sandbox do (from capabilities(7) and Docker's
// run reference). The README's table is this list.
var DangerousCaps = []struct{ Name, Why string }{
	{"SYS_ADMIN", "mount file systems, make namespaces, and much else besides: the usual way out of a container"},
	{"SYS_MODULE", "load kernel modules: run code in the host's kernel"},
	{"SYS_RAWIO", "raw I/O (iopl, ioperm, /dev/mem): read and write the host's memory and devices"},
	{"SYS_PTRACE", "trace and write into other processes (ptrace, process_vm_writev), the host's too where their PID namespace is shared"},
	{"SYS_BOOT", "reboot the host, or load a new kernel (kexec_load)"},
	{"SYS_TIME", "set the host's clock, which no namespace separates"},
	{"SYS_RESOURCE", "override resource limits and disk quotas, use the space reserved for root"},
	{"DAC_READ_SEARCH", "read any file and open files by handle (open_by_handle_at): read the host's files outside every mount"},
	{"DAC_OVERRIDE", "read, write and run any file whatever its permissions"},
	{"CHOWN", "change the owner of any file, the host's in a mount among them"},
	{"FOWNER", "act as the owner of any file: change its mode, flags and times"},
	{"FSETID", "keep the setuid and setgid bits of files it changes, and set setgid for any group"},
	{"SETUID", "take any uid: become any user, root included"},
	{"SETGID", "take any gid and supplementary groups"},
	{"SETFCAP", "give files capabilities: plant a program that gains them when run"},
	{"MKNOD", "make device files"},
	{"NET_ADMIN", "configure interfaces, routes and the firewall: get round the network policy"},
	{"NET_RAW", "raw and packet sockets: forge addresses and listen on the sandbox's network"},
	{"MAC_ADMIN", "change the mandatory access control policy (AppArmor, SELinux, Smack)"},
	{"MAC_OVERRIDE", "override mandatory access control"},
	{"AUDIT_CONTROL", "change the kernel's audit rules, or turn auditing off"},
	{"AUDIT_READ", "read the kernel's audit log"},
	{"SYSLOG", "read the kernel's log (and the kernel addresses in it), and clear it"},
	{"BPF", "load BPF programs and maps: read kernel memory"},
	{"PERFMON", "monitor performance: observe the kernel and other processes"},
	{"LINUX_IMMUTABLE", "set and clear the immutable and append-only flags of files"},
}

// EngineDefaultCaps are the capabilities Docker gives a container that drops
// none. A profile whose cap_drop lacks ALL keeps these, less what it drops
// (Podman's default set is smaller: this one covers both).
var EngineDefaultCaps = []string{"CHOWN", "DAC_OVERRIDE", "FSETID", "FOWNER", "MKNOD", "NET_RAW", "SETGID", "SETUID", "SETFCAP", "SETPCAP", "NET_BIND_SERVICE", "SYS_CHROOT", "KILL", "AUDIT_WRITE"}

// UnsafeNames are the names unsafe accepts, in the schema's order.
func UnsafeNames() []string {
	out := []string{UnsafeDockerSocket, UnsafeHostRoot, UnsafeHome, UnsafeSSH, UnsafeGnuPG, UnsafeCloud, UnsafeRootUser, UnsafeEnvGlob, UnsafeSystemWrite}
	for _, c := range DangerousCaps {
		out = append(out, c.Name)
	}
	return out
}

// CloudCredentials are the files and directories below HOME where cloud,
// cluster, registry and package tools keep their credentials.
var CloudCredentials = []string{".aws", ".azure", ".config/gcloud", ".kube", ".docker", ".config/gh", ".oci", ".config/doctl", ".terraform.d", ".git-credentials", ".netrc", ".npmrc", ".pypirc"}

// Grant is one grant of a profile that undoes part of the sandbox: a user
// profile may make it by naming Name in unsafe; a repository profile never.
type Grant struct {
	Name  string // as unsafe names it: docker-socket, SYS_ADMIN, ...
	Field string // the field that grants it: mounts[0].source
	Pos   Pos
	What  string // what it grants, and why that undoes the sandbox
}

// String is the grant as a warning shows it.
func (g Grant) String() string {
	return fmt.Sprintf("unsafe grant %s: %s (%s): %s", g.Name, g.Field, g.Pos, g.What)
}

// Danger is what makes a host path unsafe to mount.
type Danger struct {
	Name string // as unsafe names it
	What string
}

// GrantHost are the host facts that judging mount sources takes: where
// HOME and the engine sockets are, and how paths resolve. The CLI gathers
// them; this package reads nothing of the host itself.
type GrantHost struct {
	Home       string
	Workspace  string
	PropioHome string
	// Sockets are the paths where an engine's API socket is or may be.
	Sockets []string
	// Resolve returns path with its symbolic links resolved, as far as it
	// exists, and whether all of it exists.
	Resolve func(path string) (resolved string, exists bool)
	// SameFile reports whether two existing paths are one file (a hard
	// link, a bind mount); nil: never.
	SameFile func(a, b string) bool
}

func (h GrantHost) resolve(p string) (string, bool) {
	if h.Resolve == nil {
		return filepath.Clean(p), false
	}
	return h.Resolve(p)
}

// shown is source cleaned, resolved, and as a danger shows it: "SOURCE
// (RESOLVED)" when they differ.
func (h GrantHost) shown(source string) (clean, resolved, shown string) {
	clean = filepath.Clean(source)
	resolved, _ = h.resolve(clean)
	shown = clean
	if resolved != clean {
		shown = fmt.Sprintf("%s (%s)", clean, resolved)
	}
	return clean, resolved, shown
}

// Dangers says why mounting source (an absolute host path) would undo the
// sandbox, if it would: the engine's socket or a directory holding it, the
// host's root, HOME or a parent of it, ~/.ssh, ~/.gnupg, credentials of
// cloud tools, or what contains those. The host's root stands for all the
// rest, and HOME for what is inside it except an engine socket.
func (h GrantHost) Dangers(source string) []Danger {
	source, r, shown := h.shown(source)
	if r == "/" {
		return []Danger{{UnsafeHostRoot, shown + " is the host's root directory: the sandbox sees the whole host"}}
	}
	var out []Danger
	for _, sock := range h.Sockets {
		rs, exists := h.resolve(sock)
		switch {
		case r == rs || source == filepath.Clean(sock) || (exists && h.SameFile != nil && h.SameFile(r, rs)):
			out = append(out, Danger{UnsafeDockerSocket, shown + " is the engine's socket: the sandbox controls the engine, and so the host"})
		case exists && fsutil.Within(r, rs):
			out = append(out, Danger{UnsafeDockerSocket, fmt.Sprintf("%s contains the engine's socket %s: the sandbox controls the engine, and so the host", shown, rs)})
		default:
			continue
		}
		break
	}
	if h.Home == "" {
		return out
	}
	home, _ := h.resolve(h.Home)
	switch {
	case r == home:
		return append(out, Danger{UnsafeHome, shown + " is your home directory: the sandbox sees all of it, your keys and credentials among it"})
	case fsutil.Within(r, home):
		return append(out, Danger{UnsafeHome, fmt.Sprintf("%s contains your home directory %s: the sandbox sees all of it, your keys and credentials among it", shown, home)})
	}
	for _, c := range []struct {
		name  string
		files []string
		what  string
	}{
		{UnsafeSSH, []string{".ssh"}, "your SSH keys"},
		{UnsafeGnuPG, []string{".gnupg"}, "your GnuPG keys"},
		{UnsafeCloud, CloudCredentials, "credentials of cloud, cluster, registry or package tools"},
	} {
		var in, holds []string
		for _, f := range c.files {
			rc, exists := h.resolve(filepath.Join(h.Home, f))
			switch {
			case fsutil.Within(rc, r):
				in = append(in, "~/"+f)
			case exists && fsutil.Within(r, rc):
				holds = append(holds, "~/"+f)
			}
		}
		switch {
		case len(in) > 0:
			out = append(out, Danger{c.name, fmt.Sprintf("%s is in %s: the sandbox can read %s", shown, in[0], c.what)})
		case len(holds) > 0:
			out = append(out, Danger{c.name, fmt.Sprintf("%s contains %s: the sandbox can read %s", shown, strings.Join(holds, ", "), c.what)})
		}
	}
	return out
}

// WriteDangers says why mounting source (an absolute host path) with
// write access would undo the sandbox beyond what Dangers says: it is in a
// directory of SystemPaths, or holds one. The host's root is Dangers'.
func (h GrantHost) WriteDangers(source string) []Danger {
	source, r, shown := h.shown(source)
	if r == "/" || source == "/" {
		return nil
	}
	const why = ", mounted rw: the sandbox can change the host's own files, and so run code as root on the host"
	for _, sys := range SystemPaths {
		switch {
		case source == sys || r == sys:
			return []Danger{{UnsafeSystemWrite, shown + " is a system directory of the host" + why}}
		case fsutil.Within(sys, source) || fsutil.Within(sys, r):
			return []Danger{{UnsafeSystemWrite, fmt.Sprintf("%s is in the host's system directory %s%s", shown, sys, why)}}
		case fsutil.Within(source, sys) || fsutil.Within(r, sys):
			return []Danger{{UnsafeSystemWrite, fmt.Sprintf("%s holds the host's system directory %s%s", shown, sys, why)}}
		}
	}
	return nil
}

// MountDangers is what mounting source would undo: Dangers, and with write
// access (rw) WriteDangers too.
func (h GrantHost) MountDangers(source string, rw bool) []Danger {
	ds := h.Dangers(source)
	if rw {
		ds = append(ds, h.WriteDangers(source)...)
	}
	return ds
}

// found is one dangerous grant found in a profile, before it is judged.
type found struct {
	Danger
	path []string // the field
	// at is where it is set when that is not the field's node (an implied
	// capability: the cap_drop that lacks ALL); doc is the file there.
	at  *Pos
	doc *Document
}

// literalRoot reports whether a mount source is / as written.
func literalRoot(source string) bool {
	return !strings.ContainsAny(source, "$~") && path.Clean(source) == "/"
}

// hostDangers lists the grants of p's mount sources judged on h, but for a
// mount of / as written, which hostFreeDangers has, and of the build context
// a profile file sets: a build sees all of its context, and may copy any of
// it into the image the sandbox runs.
func (p *Profile) hostDangers(h GrantHost) []found {
	var out []found
	vars := Vars{Workspace: h.Workspace, Home: h.Home, PropioHome: h.PropioHome}
	// A built-in's context is the install's (${PROPIO_HOME}): the user's
	// choice, judged by no profile.
	if d := p.originOf([]string{"build", "context"}); p.Build != nil && p.Build.Context != "" && (d == nil || d.Path != "") {
		ctx := Expand(p.Build.Context, vars)
		if !filepath.IsAbs(ctx) {
			ctx = filepath.Join(p.Build.Dir, ctx)
		}
		for _, d := range h.Dangers(ctx) {
			d.What = strings.Replace(d.What, "the sandbox", "the build, and so the image it makes,", 1)
			out = append(out, found{Danger: d, path: []string{"build", "context"}})
		}
	}
	for i, m := range p.Mounts {
		if literalRoot(m.Source) {
			continue
		}
		for _, d := range h.MountDangers(m.hostPath(vars), m.Mode == ModeRW) {
			out = append(out, found{Danger: d, path: []string{"mounts", strconv.Itoa(i), "source"}})
		}
	}
	return out
}

// hostPath is the mount's source on the host: variables expanded, a
// relative one from the directory of the file that declared it.
func (m Mount) hostPath(vars Vars) string {
	src := Expand(m.Source, vars)
	if !filepath.IsAbs(src) {
		src = filepath.Join(m.Dir, src)
	}
	return src
}

// WritesOutside says, a line per mount, which mounts of p in mode rw have
// a source outside the workspace (resolved on h): the sandbox writes
// those host paths themselves, with nothing to review before. trust shows
// each as a warning.
func (p *Profile) WritesOutside(h GrantHost) []string {
	vars := Vars{Workspace: h.Workspace, Home: h.Home, PropioHome: h.PropioHome}
	ws, _ := h.resolve(h.Workspace)
	var out []string
	for i, m := range p.Mounts {
		if m.Mode != ModeRW {
			continue
		}
		src, r, shown := h.shown(m.hostPath(vars))
		if h.Workspace != "" && (fsutil.Within(h.Workspace, src) && fsutil.Within(ws, r)) {
			continue
		}
		path := []string{"mounts", strconv.Itoa(i), "source"}
		out = append(out, fmt.Sprintf("%s (%s): %s is mounted rw, outside the workspace: the sandbox writes it on the host, with no changeset to review", fieldPath(path), p.Pos(path...), shown))
	}
	return out
}

// hostFreeDangers lists the grants of p that undo the sandbox and need no
// host to be told: capabilities, the user, env.pass globs and a mount of /
// written as such.
func (p *Profile) hostFreeDangers() []found {
	var out []found
	add := func(name, what string, path ...string) {
		out = append(out, found{Danger: Danger{name, what}, path: path})
	}
	for i, m := range p.Mounts {
		if literalRoot(m.Source) {
			add(UnsafeHostRoot, m.Source+" is the host's root directory: the sandbox sees the whole host", "mounts", strconv.Itoa(i), "source")
		}
	}
	if p.User.IsRoot() {
		add(UnsafeRootUser, fmt.Sprintf("%q runs the sandbox as root: on a rootful engine what it writes in the workspace is root's on the host, and a setuid program it leaves there runs as root for anyone on the host", p.User), "user")
	}
	for i, pat := range p.Env.Pass {
		if !anchoredGlob(pat) {
			add(UnsafeEnvGlob, fmt.Sprintf("%q is not anchored on a name prefix: it passes host variables no one named, secrets among them", pat), "env", "pass", strconv.Itoa(i))
		}
	}
	out = append(out, p.capDangers()...)
	return out
}

// anchoredGlob reports whether an env.pass pattern is a name, or a glob
// whose literal text before the first wildcard is at least two characters
// ending in _ (AWS_*, LC_*): a glob that passes only variables of one family.
func anchoredGlob(pat string) bool {
	i := strings.IndexAny(pat, "*?[\\")
	if i < 0 {
		return true
	}
	prefix := pat[:i]
	return len(prefix) >= 2 && strings.HasSuffix(prefix, "_")
}

// capName is a capability as unsafe and DangerousCaps name it: upper case,
// without CAP_.
func capName(c string) string {
	c = strings.ToUpper(c)
	return strings.TrimPrefix(c, "CAP_")
}

// capDangers lists the dangerous capabilities of the effective set: the
// engine's defaults less cap_drop (none when it drops ALL), plus cap_add.
// An added one is reported at its cap_add entry, an implied one at the
// cap_drop that lacks ALL.
func (p *Profile) capDangers() []found {
	var out []found
	why := func(name string) (string, bool) {
		for _, c := range DangerousCaps {
			if c.Name == name {
				return c.Why, true
			}
		}
		return "", false
	}
	added := map[string]bool{}
	for i, c := range p.Security.CapAdd {
		name := capName(c)
		if w, ok := why(name); ok {
			added[name] = true
			out = append(out, found{Danger: Danger{name, "adds " + name + ": " + w}, path: []string{"security", "cap_add", strconv.Itoa(i)}})
		}
	}
	dropped := map[string]bool{}
	for _, c := range p.Security.CapDrop {
		dropped[capName(c)] = true
	}
	if dropped["ALL"] {
		return out
	}
	at, doc := p.capDropSetter()
	for _, name := range EngineDefaultCaps {
		w, ok := why(name)
		if !ok || dropped[name] || added[name] {
			continue
		}
		out = append(out, found{
			Danger: Danger{name, fmt.Sprintf("cap_drop does not drop ALL, so the engine's default %s stays: %s", name, w)},
			path:   []string{"security", "cap_drop"}, at: at, doc: doc,
		})
	}
	return out
}

// capDropSetter is where the engine's default capabilities were let in: the
// first file of the chain, from the base, that sets cap_drop (lists append,
// so the files after it can only drop more).
func (p *Profile) capDropSetter() (*Pos, *Document) {
	if p.src == nil {
		return nil, nil
	}
	for i := len(p.src.chain) - 1; i >= 0; i-- {
		d := p.src.chain[i]
		if n := lookupPath(d.Root, []string{"security", "cap_drop"}); n != nil {
			pos := posOf(d.File, n)
			return &pos, d
		}
	}
	return nil, nil
}

// judge splits the dangerous grants into the problems (made by a repository
// profile file, or not named in unsafe) and the grants a user profile made
// by naming them in unsafe.
func (p *Profile) judge(all []found) (List, []Grant) {
	var errs List
	var granted []Grant
	seen := map[string]bool{}
	for _, f := range all {
		pos, doc := p.Pos(f.path...), p.originOf(f.path)
		if f.at != nil {
			pos, doc = *f.at, f.doc
		}
		field := fieldPath(f.path)
		switch {
		case p.src.isRepo(doc):
			errs = append(errs, &Error{Pos: pos, Field: field, Msg: "unsafe grant " + f.Name + " in a repository profile: " + f.What,
				Hint: "a repository profile can never grant " + f.Name + ": the agent can write it; if you mean it, grant it in a profile of your own (" + p.userProfiles() + ") that names it in unsafe, and extend or use that"})
		case !slices.Contains(p.Unsafe, f.Name):
			errs = append(errs, &Error{Pos: pos, Field: field, Msg: "unsafe grant " + f.Name + " not named in unsafe: " + f.What,
				Hint: "this undoes the sandbox; if you mean it, name it in unsafe: [" + f.Name + "] in " + pos.File + ", or remove the grant"})
		default:
			key := f.Name + "\x00" + field
			if !seen[key] {
				seen[key] = true
				granted = append(granted, Grant{Name: f.Name, Field: field, Pos: pos, What: f.What})
			}
		}
	}
	slices.SortStableFunc(granted, func(a, b Grant) int { return p.comparePos(a.Pos, b.Pos) })
	return errs, granted
}

// repoUnsafe reports unsafe set in a repository profile file, at each.
func (p *Profile) repoUnsafe() List {
	if p.src == nil {
		return nil
	}
	var errs List
	for _, d := range p.src.chain {
		if k := lookupKey(d.Root, "unsafe"); k != nil && p.src.isRepo(d) {
			errs = append(errs, &Error{Pos: posOf(d.File, k), Field: "unsafe",
				Msg:  "a repository profile cannot name unsafe grants: the agent can write it",
				Hint: "name unsafe grants only in a profile of your own (" + p.userProfiles() + "), outside the workspace"})
		}
	}
	return errs
}

// checkUnsafe is the part of Check about unsafe grants: those it can tell
// without the host, and unsafe set where it may not be; with h, the mount
// sources judged on the host too.
func (p *Profile) checkUnsafe(h *GrantHost) List {
	all := p.hostFreeDangers()
	if h != nil {
		all = append(all, p.hostDangers(*h)...)
	}
	errs, _ := p.judge(all)
	return append(errs, p.repoUnsafe()...)
}

// userProfiles names where a user profile would go, for hints.
func (p *Profile) userProfiles() string {
	if p.src != nil && p.src.configDir != "" {
		return filepath.Join(p.src.configDir, "NAME.yaml")
	}
	return "$XDG_CONFIG_HOME/propio-sandbox/profiles/NAME.yaml"
}

// Grants judges every grant of p that undoes the sandbox, mount sources
// resolved on h included. It returns the ones granted (by a user profile
// naming them in unsafe), each to be shown as a warning, and a List of the
// others: those of a repository profile file, and those unsafe does not name.
func (p *Profile) Grants(h GrantHost) ([]Grant, error) {
	errs, granted := p.judge(append(p.hostFreeDangers(), p.hostDangers(h)...))
	errs = append(errs, p.repoUnsafe()...)
	p.sortByPos(errs)
	return granted, errs.err()
}

// Granted returns the unsafe grants of a profile that Load judged on the
// host (Locations.Host set), which its user profile named in unsafe; each is
// to be shown as a warning.
func (p *Profile) Granted() []Grant { return p.granted }

// originOf returns the file that set the field at path, nil when unknown.
func (p *Profile) originOf(path []string) *Document {
	if p.src == nil {
		return nil
	}
	n := find(p.src.root, path, false)
	return p.src.origin[n]
}

// isRepo reports whether d is a repository profile file: a file of the
// chain inside the workspace, which the agent can write.
func (r *resolved) isRepo(d *Document) bool {
	return r != nil && d != nil && inWorkspace(r.workspace, d.Path, d.Real)
}
