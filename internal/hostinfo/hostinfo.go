// Package hostinfo gathers what the generator needs to know about this
// machine: directories, the invoking user, the names (never the values) of
// environment variables, the workspace paths that readonly and hide patterns
// match, and which mount sources exist. It is the I/O half of generation;
// it never talks to a container engine.
package hostinfo

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/docker/go-units"
	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/ask"
	"github.com/propio/propio-sandbox/internal/broker"
	"github.com/propio/propio-sandbox/internal/fsutil"
	"github.com/propio/propio-sandbox/internal/guard"
	"github.com/propio/propio-sandbox/internal/profile"
)

// Dirs are the user's propio-sandbox directories.
type Dirs struct {
	Config string // $XDG_CONFIG_HOME/propio-sandbox
	State  string // $XDG_STATE_HOME/propio-sandbox
}

// UserDirs returns the propio-sandbox directories of the XDG base directory spec.
func UserDirs() (Dirs, error) {
	home, err := os.UserHomeDir()
	if err != nil {
		return Dirs{}, fmt.Errorf("finding home directory: %w", err)
	}
	config := os.Getenv("XDG_CONFIG_HOME")
	if !filepath.IsAbs(config) {
		config = filepath.Join(home, ".config")
	}
	state := os.Getenv("XDG_STATE_HOME")
	if !filepath.IsAbs(state) {
		state = filepath.Join(home, ".local", "state")
	}
	return Dirs{Config: filepath.Join(config, "propio-sandbox"), State: filepath.Join(state, "propio-sandbox")}, nil
}

// ProfileDir is where user profiles live.
func (d Dirs) ProfileDir() string { return filepath.Join(d.Config, "profiles") }

// LogDir is where allowlist gateways write their decision logs, one file
// per sandbox. Run creates it; render only names it.
func (d Dirs) LogDir() string { return filepath.Join(d.State, "logs") }

// GuardDir holds the guard plans of running sandboxes (internal/guard),
// for gc to check what a sandbox of a killed launcher left.
func (d Dirs) GuardDir() string { return filepath.Join(d.State, "guard") }

// QuarantineDir is where the guard puts aside what a sandbox left that
// the host would run.
func (d Dirs) QuarantineDir() string { return filepath.Join(d.State, "quarantine") }

// ResolvDir holds the resolv.conf files that point allowlist sandboxes at
// their gateways. Run writes them; render only names them.
func (d Dirs) ResolvDir() string { return filepath.Join(d.State, "resolv") }

// Workspace returns the absolute, symlink-free path of the current directory.
func Workspace() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("finding the working directory: %w", err)
	}
	if real, err := filepath.EvalSymlinks(wd); err == nil {
		wd = real
	}
	return wd, nil
}

// PropioHome is $PROPIO_HOME, else the install root: the parent of the folder
// holding the resolved executable.
func PropioHome() string {
	if v := os.Getenv("PROPIO_HOME"); v != "" {
		return v
	}
	exe, err := os.Executable()
	if err != nil {
		return ""
	}
	if real, err := filepath.EvalSymlinks(exe); err == nil {
		exe = real
	}
	return filepath.Dir(filepath.Dir(exe))
}

// Limits returns the host's cores and memory.
func Limits() profile.Limits {
	return profile.Limits{CPUs: float64(runtime.NumCPU()), Memory: memTotal()}
}

func memTotal() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "MemTotal:" {
			kb, err := strconv.ParseInt(fields[1], 10, 64)
			if err == nil {
				return kb * 1024
			}
		}
	}
	return 0
}

// EnvNames returns the names of the process's environment variables, sorted.
// Values are never read into the result.
func EnvNames() []string {
	var names []string
	for _, kv := range os.Environ() {
		if name, _, ok := strings.Cut(kv, "="); ok && name != "" {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	return names
}

// Gather builds the generator's view of this host for profile p run in
// workspace, with Match's warnings about the workspace rules. It creates the
// empty file that hidden files are masked with under dirs.State when the
// profile hides a file.
func Gather(p *profile.Profile, workspace string, dirs Dirs) (generator.Host, []string, error) {
	home, err := os.UserHomeDir()
	if err != nil {
		return generator.Host{}, nil, fmt.Errorf("finding home directory: %w", err)
	}
	h := generator.Host{
		Workspace:  workspace,
		Home:       home,
		PropioHome: PropioHome(),
		UID:        os.Getuid(),
		GID:        os.Getgid(),
		EnvNames:   EnvNames(),
		Exists:     map[string]bool{},
	}
	if h.BuiltinContext = BuiltinContext(p, h, dirs); h.BuiltinContext != "" {
		if err := WriteAgentContext(h.BuiltinContext); err != nil {
			return generator.Host{}, nil, err
		}
	}
	if p.Network.Mode == "allowlist" {
		h.LogDir = dirs.LogDir()
		h.ResolvDir = dirs.ResolvDir()
		if h.BrokerDir, h.CADir, err = broker.BaseDirs(); err != nil {
			return generator.Host{}, nil, err
		}
		h.SystemRoots = SystemRoots(os.LookupEnv)
	}
	if p.Network.Asks() {
		if h.AskDir, err = ask.BaseDir(); err != nil {
			return generator.Host{}, nil, err
		}
	}
	if len(p.AgentRequests) > 0 {
		if h.AgentDir, err = ask.AgentBaseDir(); err != nil {
			return generator.Host{}, nil, err
		}
	}
	var warnings []string
	h.Matches, warnings, err = Match(workspace, p)
	if err != nil {
		return generator.Host{}, nil, err
	}
	for _, m := range h.Matches {
		if m.Hide && !m.Dir {
			// In a directory of its own, which a remote engine gets a copy of.
			if h.EmptyFile, err = emptyFile(filepath.Join(dirs.State, "mask")); err != nil {
				return generator.Host{}, nil, err
			}
			break
		}
	}
	for _, m := range p.Mounts {
		src := generator.MountSource(m, h)
		if _, err := os.Stat(src); err == nil {
			h.Exists[src] = true
		}
	}
	for _, f := range []string{".gitconfig", ".config/git/config", ".gitignore_global"} {
		if path := filepath.Join(home, f); isFile(path) {
			h.GitConfig = append(h.GitConfig, path)
		}
	}
	if path := filepath.Join(home, ".ssh", "known_hosts"); isFile(path) {
		h.KnownHosts = path
	}
	if p.User.IsHost() {
		if h.Passwd, h.Group, err = accountFiles(dirs.State, h.UID, h.GID); err != nil {
			return generator.Host{}, nil, err
		}
	}
	if h.ExtraMounts, err = ExtraMounts(os.LookupEnv); err != nil {
		return generator.Host{}, nil, err
	}
	if h.TestDisk, err = TestDisk(os.LookupEnv); err != nil {
		return generator.Host{}, nil, err
	}
	return h, warnings, nil
}

// EnvTestDisk is for tests only: a cap on what the sandbox writes, below
// the 1g minimum of resources.disk, so that a test reaches it in a moment.
// It is read from the launcher's environment (never from a profile) and only
// ever lowers the profile's cap.
const EnvTestDisk = "PROPIO_SANDBOX_TEST_DISK"

// minTestDisk keeps a test's cap above what a sandbox writes just starting.
const minTestDisk = 1 << 20

// TestDisk reads PROPIO_SANDBOX_TEST_DISK: 0 when it is not set.
func TestDisk(lookup func(string) (string, bool)) (int64, error) {
	v, ok := lookup(EnvTestDisk)
	if !ok || v == "" {
		return 0, nil
	}
	b, err := units.RAMInBytes(v)
	if err != nil || b < minTestDisk {
		return 0, fmt.Errorf("%s=%q: not a size of 1m or more (it is for tests: a lower disk cap than resources.disk allows)", EnvTestDisk, v)
	}
	return b, nil
}

func isFile(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular()
}

// accountFiles writes (once) the passwd and group files that give uid:gid
// an account in the sandbox, under dir/accounts.
func accountFiles(dir string, uid, gid int) (passwd, group string, err error) {
	dir = filepath.Join(dir, "accounts")
	base := filepath.Join(dir, fmt.Sprintf("%d-%d", uid, gid))
	for _, f := range []struct{ path, content string }{
		{base + ".passwd", generator.PasswdFile(uid, gid)},
		{base + ".group", generator.GroupFile(gid)},
	} {
		if err := fsutil.WriteFileIfChanged(f.path, []byte(f.content), 0o644); err != nil {
			return "", "", fmt.Errorf("writing the sandbox's account files: %w", err)
		}
	}
	return base + ".passwd", base + ".group", nil
}

// Environment variables that add mounts to one launch:
// SRC:DST[:ro|rw], comma-separated; read-only unless :rw.
const (
	EnvMounts       = "PROPIO_SANDBOX_MOUNTS"
	EnvMountsLegacy = "SANDBOX_MOUNTS"
)

// ExtraMounts reads the mounts PROPIO_SANDBOX_MOUNTS (else SANDBOX_MOUNTS)
// adds. A relative or missing source, a relative target or a mode other than
// ro and rw is an error naming the variable and the entry.
func ExtraMounts(lookup func(string) (string, bool)) ([]generator.ExtraMount, error) {
	name := EnvMounts
	v, ok := lookup(name)
	if !ok {
		name = EnvMountsLegacy
		v, ok = lookup(name)
	}
	if !ok || strings.TrimSpace(v) == "" {
		return nil, nil
	}
	var out []generator.ExtraMount
	var errs []error
	for _, entry := range strings.Split(v, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		parts := strings.Split(entry, ":")
		bad := func(why string) { errs = append(errs, fmt.Errorf("%s: %q: %s", name, entry, why)) }
		if len(parts) < 2 || len(parts) > 3 {
			bad("want SRC:DST or SRC:DST:ro|rw")
			continue
		}
		m := generator.ExtraMount{Source: parts[0], Target: parts[1], ReadOnly: true}
		if len(parts) == 3 {
			switch parts[2] {
			case "ro":
			case "rw":
				m.ReadOnly = false
			default:
				bad(fmt.Sprintf("mode %q is neither ro nor rw", parts[2]))
				continue
			}
		}
		switch {
		case !filepath.IsAbs(m.Source):
			bad("the source is relative; write an absolute path")
			continue
		case !path.IsAbs(m.Target):
			bad("the target is relative; write an absolute path inside the sandbox")
			continue
		}
		if _, err := os.Stat(m.Source); err != nil {
			bad("the source does not exist (it is never created)")
			continue
		}
		m.Source, m.Target = filepath.Clean(m.Source), path.Clean(m.Target)
		out = append(out, m)
	}
	if len(errs) > 0 {
		return nil, &MountsError{Var: name, err: errors.Join(errs...)}
	}
	return out, nil
}

// MountsError is a bad PROPIO_SANDBOX_MOUNTS (or SANDBOX_MOUNTS): every bad
// entry, each on a line.
type MountsError struct {
	Var string // the variable that was read
	err error
}

func (e *MountsError) Error() string { return e.err.Error() }
func (e *MountsError) Unwrap() error { return e.err }

// emptyFile returns a read-only empty file under dir, creating it if needed.
func emptyFile(dir string) (string, error) {
	name := filepath.Join(dir, "empty")
	if st, err := os.Stat(name); err == nil && st.Mode().IsRegular() && st.Size() == 0 {
		return name, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("creating %s: %w", dir, err)
	}
	os.Remove(name)
	if err := os.WriteFile(name, nil, 0o444); err != nil {
		return "", fmt.Errorf("creating %s: %w", name, err)
	}
	return name, nil
}

// GuardRoots are the host directories the sandbox of p may change, for
// internal/guard: the workspace and the mounts in mode rw or changeset
// (sources that exist, links resolved), and the launch's rw extra mounts.
func GuardRoots(p *profile.Profile, h generator.Host) []guard.Root {
	var roots []guard.Root
	add := func(name, src, mode string) {
		if mode != profile.ModeRW && mode != profile.ModeChangeset {
			return
		}
		if real, err := filepath.EvalSymlinks(src); err == nil {
			src = real
		}
		if st, err := os.Stat(src); err != nil || !st.IsDir() {
			return
		}
		roots = append(roots, guard.Root{Name: name, Source: src, Changeset: mode == profile.ModeChangeset})
	}
	add(generator.WorkspaceMount, h.Workspace, p.Workspace.Mode)
	for i, m := range p.Mounts {
		add("mount-"+strconv.Itoa(i), generator.MountSource(m, h), m.Mode)
	}
	for i, m := range h.ExtraMounts {
		if !m.ReadOnly {
			add("extra-"+strconv.Itoa(i), m.Source, profile.ModeRW)
		}
	}
	return roots
}

// Guard scans the roots of p on h (internal/guard.Scan) and records what it
// mounts in h.Guard; the plan is for the launch to prepare and check.
func Guard(p *profile.Profile, h *generator.Host) guard.Plan {
	plan := guard.Scan(GuardRoots(p, *h))
	h.Guard = nil
	for _, g := range plan.Paths() {
		h.Guard = append(h.Guard, generator.GuardPath{Root: g.Root, Path: g.Path, ReadOnly: g.ReadOnly})
	}
	return plan
}

// trustStores are where Linux distributions keep the system's trust store
// as one PEM file (Go's crypto/x509 looks there too): Debian and Ubuntu,
// Fedora and RHEL, openSUSE, OpenELEC, CentOS, Alpine.
var trustStores = []string{
	"/etc/ssl/certs/ca-certificates.crt",
	"/etc/pki/tls/certs/ca-bundle.crt",
	"/etc/ssl/ca-bundle.pem",
	"/etc/pki/tls/cacert.pem",
	"/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
	"/etc/ssl/cert.pem",
}

// SystemRoots is the host's trust store as a PEM file, which the gateway
// verifies upstreams with: SSL_CERT_FILE when it names one, else the first
// of the usual places that exists; "" elsewhere than on Linux (the gateway
// then uses the roots built into it).
func SystemRoots(lookup func(string) (string, bool)) string {
	if runtime.GOOS != "linux" {
		return ""
	}
	if f, ok := lookup("SSL_CERT_FILE"); ok && filepath.IsAbs(f) && isFile(f) {
		return f
	}
	for _, f := range trustStores {
		if isFile(f) {
			return f
		}
	}
	return ""
}

// TrustStores are the places an image's trust store may be, in the order
// they are looked for.
func TrustStores() []string { return slices.Clone(trustStores) }
