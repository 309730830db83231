package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/ask"
	"github.com/propio/propio-sandbox/internal/backend"
	"github.com/propio/propio-sandbox/internal/changeset"
	"github.com/propio/propio-sandbox/internal/fsutil"
	"github.com/propio/propio-sandbox/internal/profile"
)

// DefaultMountMax is what the copies of a sandbox's mount requests may
// come to together, in bytes, when its profile sets no resources.disk.
const DefaultMountMax = 1 << 30

// MaxMountFiles is how many files one mount request may copy.
const MaxMountFiles = 100_000

// ErrMountRefused: a mount request is refused without asking the user
// (what it asks for is never given at run time, or cannot be).
var ErrMountRefused = errors.New("mount request refused")

// MountConfig is what a sandbox's mount requests need.
type MountConfig struct {
	Runtime backend.Runtime
	// Volume is the sandbox's volume at generator.MountsTarget, with the
	// image and labels of the helper containers that fill it.
	Volume backend.Volume
	// Host judges a source as unsafe judges a mount's: the engine's
	// sockets, HOME and its parents, ~/.ssh, ~/.gnupg, cloud credentials.
	Host profile.GrantHost
	// Own are propio-sandbox's own directories (its configuration, its
	// state, the ask directories): never copied, nor what holds them.
	Own []string
	// Hide are workspace.hide's patterns: those naming a file (no /) leave
	// the files they match out of a copy, and refuse a source they match.
	Hide []string
	// Max is what the copies may come to together, in bytes.
	Max int64
	// Writes is the sandbox's volume at generator.WritesTarget, where the
	// copies of requests with write access go (no Name: none is given).
	Writes backend.Volume
	// Changesets is the store of the changeset that brings back what the
	// agent wrote to them, made for the Workspace's run of Profile.
	Changesets changeset.Store
	Workspace  string
	Profile    string
}

// Mounts carries out a sandbox's mount requests: each copies a host path
// outside the workspace into the sandbox's mounts volume, where the agent
// reads it at generator.MountsTarget/NAME, as it was when the user allowed
// it (a second request for the same NAME copies it again).
type Mounts struct {
	c     MountConfig
	mu    sync.Mutex
	sizes map[string]int64 // bytes copied, by NAME ("w/NAME" for the writable copies)
	w     writes
}

// NewMounts returns the mount requests' handler of c.
func NewMounts(c MountConfig) *Mounts {
	if c.Max <= 0 {
		c.Max = DefaultMountMax
	}
	return &Mounts{c: c, sizes: map[string]int64{}}
}

// LaunchMounts is NewMounts for a launch's project (generated with
// generator.Options.Mounts, its launcher's labels on it), or false when the
// project has no mounts volume.
func LaunchMounts(rt backend.Runtime, project *types.Project, env Env, p *profile.Profile, askDir string) (*Mounts, bool) {
	v, ok := project.Volumes[generator.MountsVolumeKey]
	svc, found := project.Services[generator.Service]
	if !ok || !found {
		return nil, false
	}
	var writes backend.Volume
	store, err := changeset.DefaultStore()
	if w, ok := project.Volumes[generator.WritesVolumeKey]; ok && err == nil {
		writes = backend.Volume{Name: w.Name, Image: svc.Image, Labels: withLabels(svc.Labels, launcherLabels(project.Name))}
	}
	own := []string{env.Dirs.Config, env.Dirs.State}
	if store.Dir != "" {
		own = append(own, store.Dir)
	}
	if askDir != "" {
		own = append(own, askDir)
	}
	return NewMounts(MountConfig{
		Runtime:    rt,
		Volume:     backend.Volume{Name: v.Name, Image: svc.Image, Labels: withLabels(svc.Labels, launcherLabels(project.Name))},
		Host:       env.GrantHost(),
		Own:        own,
		Hide:       p.Workspace.Hide,
		Max:        int64(p.Resources.Disk),
		Writes:     writes,
		Changesets: store,
		Workspace:  env.Workspace,
		Profile:    p.Meta.File,
	}), true
}

// mountPlan is a mount request judged: what is copied, and where to.
type mountPlan struct {
	name   string
	source string // resolved
	write  bool   // a writable copy, at generator.WritesTarget
	skip   map[string]bool
	files  int64
	bytes  int64
}

// Check judges a mount request before the user is asked: an error wrapping
// ErrMountRefused says why it is refused without asking.
func (m *Mounts) Check(req ask.Request) error {
	_, err := m.Resolve(req)
	return err
}

// Resolve judges a mount request before the user is asked (a
// RequestResolver), and returns it with the host path it would copy in
// Mount.Resolved: what the user is shown, and what Handle copies.
func (m *Mounts) Resolve(req ask.Request) (ask.Request, error) {
	pl, err := m.plan(req)
	if err != nil {
		return req, err
	}
	mo := *req.Mount
	mo.Resolved = pl.source
	req.Mount = &mo
	return req, nil
}

// Handle carries out a mount request the user allowed (a RequestHandler):
// it judges it again, copies the source into the mounts volume, and
// returns where the agent reads it.
func (m *Mounts) Handle(ctx context.Context, req ask.Request) (map[string]any, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	pl, err := m.plan(req)
	if err != nil {
		return nil, err
	}
	if shown := req.Mount.Resolved; shown != "" && shown != pl.source {
		return nil, refused("%s is %s now, not the %s you were shown: nothing was copied", req.Mount.Source, pl.source, shown)
	}
	budget := m.c.Max
	key := pl.name
	if pl.write {
		key = "w/" + pl.name
	}
	for n, b := range m.sizes {
		if n != key {
			budget -= b
		}
	}
	if pl.bytes > budget {
		return nil, refused("%s is %d bytes; the sandbox's copies may take %d bytes more (resources.disk, or %d bytes without it)", pl.source, pl.bytes, max(budget, 0), int64(DefaultMountMax))
	}
	if pl.write {
		return m.handleWrite(ctx, pl, budget)
	}
	copied, err := m.c.Runtime.CopyEntry(ctx, m.c.Volume, backend.Entry{Name: pl.name, From: pl.source, Skip: pl.skip, Max: budget})
	if err != nil {
		delete(m.sizes, pl.name) // what is left of it is the engine's to say
		return nil, err
	}
	m.sizes[pl.name] = copied.Bytes
	out := map[string]any{"path": path.Join(generator.MountsTarget, pl.name), "bytes": copied.Bytes, "files": copied.Files}
	if len(pl.skip) > 0 {
		out["left_out"] = slices.Sorted(maps.Keys(pl.skip))
	}
	return out, nil
}

func refused(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrMountRefused, fmt.Sprintf(format, args...))
}

// plan judges req: its source, its name, what it holds.
func (m *Mounts) plan(req ask.Request) (mountPlan, error) {
	mo := req.Mount
	if mo == nil || mo.Source == "" {
		return mountPlan{}, refused("a mount request names a host path in mount.source")
	}
	if mo.Write && m.c.Writes.Name == "" {
		return mountPlan{}, refused("this sandbox gives no write access: ask for read access (a copy at %s/NAME)", generator.MountsTarget)
	}
	source, err := m.source(mo.Source)
	if err != nil {
		return mountPlan{}, err
	}
	name, err := mountName(mo.Target, source)
	if err != nil {
		return mountPlan{}, err
	}
	pl := mountPlan{name: name, source: source, skip: map[string]bool{}, write: mo.Write}
	if err := m.measure(&pl); err != nil {
		return mountPlan{}, err
	}
	return pl, m.checkWrite(pl)
}

// kernelDirs are the kernel's views of the host, whose files are not what
// stat says of them (a process's environment, the host's devices): never
// copied, whatever holds them.
var kernelDirs = []string{"/proc", "/sys", "/dev"}

// source resolves a request's source, and refuses what must never be
// copied. The source must name the path it copies plainly: no ., .. or
// empty segment, and no symbolic link anywhere in it (the refusal names
// the path it leads to, which the agent may ask for instead), so that what
// the user is shown is what is copied.
func (m *Mounts) source(s string) (string, error) {
	if rest, ok := strings.CutPrefix(s, "~/"); ok && m.c.Host.Home != "" {
		if seg := uncleanSegment("/" + rest); seg != "" {
			return "", refused("mount.source %q is not a plain path (%s in it): ask for the path itself", s, seg)
		}
		s = filepath.Join(m.c.Host.Home, rest)
	}
	if !filepath.IsAbs(s) {
		return "", refused("mount.source %q is not an absolute host path", s)
	}
	if seg := uncleanSegment(s); seg != "" {
		return "", refused("mount.source %q is not a plain path (%s in it): ask for the path itself (%s)", s, seg, filepath.Clean(s))
	}
	s = filepath.Clean(s)
	if ds := m.c.Host.Dangers(s); len(ds) > 0 {
		return "", refused("%s (never given at run time: a profile of yours may mount it, naming %s in unsafe)", ds[0].What, ds[0].Name)
	}
	r, exists := fsutil.Resolve(s)
	if !exists {
		return "", refused("%s does not exist", s)
	}
	for _, k := range kernelDirs {
		if fsutil.Within(k, s) || fsutil.Within(k, r) {
			return "", refused("%s is in %s, the kernel's view of the host: never copied", r, k)
		}
	}
	if r != s {
		return "", refused("%s goes through a symbolic link, to %s: ask for that path, which is what you are shown", s, r)
	}
	if kfs := kernelFS(r); kfs != "" {
		return "", refused("%s is on a %s file system, the kernel's view of the host: never copied", r, kfs)
	}
	if ws := m.c.Host.Workspace; ws != "" {
		rws, _ := fsutil.Resolve(ws)
		if fsutil.Within(rws, r) {
			return "", refused("%s is in the workspace, which the sandbox sees at its workspace's target already", s)
		}
		if fsutil.Within(r, rws) {
			return "", refused("%s holds the workspace, whose hidden files a copy would show", s)
		}
	}
	for _, o := range m.c.Own {
		ro, _ := fsutil.Resolve(o)
		if fsutil.Within(ro, r) || fsutil.Within(r, ro) {
			return "", refused("%s is or holds propio-sandbox's own files (%s): its approvals, grants and changesets are not the agent's", s, o)
		}
	}
	if p := m.hidden(r); p != "" {
		return "", refused("%s is hidden by workspace.hide %q", s, p)
	}
	return r, nil
}

// uncleanSegment returns the first segment of the absolute path p that
// makes it name its file other than plainly ("." or "..", or "//" for an
// empty one), or "" when there is none. A final / is allowed.
func uncleanSegment(p string) string {
	body := strings.TrimSuffix(strings.TrimPrefix(p, "/"), "/")
	if body == "" {
		return ""
	}
	for _, seg := range strings.Split(body, "/") {
		switch seg {
		case "":
			return "//"
		case ".", "..":
			return seg
		}
	}
	return ""
}

// hidden returns the hide pattern naming a file that a segment of p
// matches, or "".
func (m *Mounts) hidden(p string) string {
	for _, pat := range m.c.Hide {
		pat = strings.TrimSuffix(pat, "/")
		if strings.Contains(pat, "/") {
			continue // a path in the workspace
		}
		for _, seg := range strings.Split(strings.TrimPrefix(p, "/"), "/") {
			if ok, _ := path.Match(pat, seg); ok {
				return pat
			}
		}
	}
	return ""
}

// mountName is the NAME a request's copy gets below MountsTarget: the last
// segment of its target, else of its source, with what is not a letter,
// digit, '.', '_' or '-' made '_'.
func mountName(target, source string) (string, error) {
	base := path.Base(filepath.ToSlash(source))
	if target != "" {
		base = path.Base(path.Clean(target))
	}
	name := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-' {
			return r
		}
		return '_'
	}, base)
	if name == "" || strings.Trim(name, ".") == "" || name == "_" {
		return "", refused("no name for the copy: mount.target names it (%s/NAME)", generator.MountsTarget)
	}
	return name, nil
}

// measure walks the source (bounded by MaxMountFiles): its size, the files
// hide leaves out, and the refusals a walk finds (another file system
// below it, another name of a key or credential).
func (m *Mounts) measure(pl *mountPlan) error {
	st, err := os.Lstat(pl.source)
	if err != nil {
		return refused("%s: %v", pl.source, err)
	}
	if !st.IsDir() && !st.Mode().IsRegular() {
		return refused("%s is a %s: only files and directories are copied", pl.source, fsutil.Kind(st.Mode()))
	}
	dev := devOf(st)
	guarded := m.guardedFiles()
	return filepath.WalkDir(pl.source, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return refused("reading %s: %v", p, err)
		}
		rel, _ := filepath.Rel(pl.source, p)
		rel = filepath.ToSlash(rel)
		if rel != "." && m.hidden(rel) != "" {
			pl.skip[rel] = true
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return refused("reading %s: %v", p, err)
		}
		if devOf(fi) != dev {
			return refused("%s is another file system mounted below %s: ask for it on its own", p, pl.source)
		}
		if fi.Mode().IsRegular() {
			if guarded[idOf(fi)] {
				return refused("%s is another name of a file of ~/.ssh, ~/.gnupg or a cloud tool's credentials", p)
			}
			pl.bytes += fi.Size()
		}
		if pl.write && !fi.IsDir() && !fi.Mode().IsRegular() && fi.Mode()&fs.ModeSymlink == 0 {
			return refused("%s is a %s, which a writable copy cannot carry: ask for read access", p, fsutil.Kind(fi.Mode()))
		}
		if !fi.IsDir() {
			if pl.files++; pl.files > MaxMountFiles {
				return refused("%s holds more than %d files", pl.source, MaxMountFiles)
			}
		}
		return nil
	})
}

// fileKey is a file's device and inode.
type fileKey struct{ dev, ino uint64 }

func idOf(fi fs.FileInfo) fileKey {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return fileKey{uint64(st.Dev), uint64(st.Ino)}
	}
	return fileKey{}
}

func devOf(fi fs.FileInfo) uint64 { return idOf(fi).dev }

// guardedFiles are the regular files of ~/.ssh, ~/.gnupg and the cloud
// credentials with another name (a hard link), which a copy must not
// carry under that other name.
func (m *Mounts) guardedFiles() map[fileKey]bool {
	out := map[fileKey]bool{}
	if m.c.Host.Home == "" {
		return out
	}
	for _, rel := range append([]string{".ssh", ".gnupg"}, profile.CloudCredentials...) {
		n := 0
		filepath.WalkDir(filepath.Join(m.c.Host.Home, rel), func(p string, d fs.DirEntry, err error) error {
			if err != nil || n > MaxMountFiles {
				return filepath.SkipDir
			}
			n++
			if fi, err := d.Info(); err == nil && fi.Mode().IsRegular() {
				if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Nlink > 1 {
					out[idOf(fi)] = true
				}
			}
			return nil
		})
	}
	return out
}
