package profile

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/propio/propio-sandbox/internal/fsutil"
	"github.com/propio/propio-sandbox/profiles"
	"go.yaml.in/yaml/v3"
)

// RepoProfile is where a repository checks in its profile, relative to the workspace.
const RepoProfile = ".propio/sandbox.yaml"

// DefaultBuiltin is the built-in profile used when nothing else is chosen.
const DefaultBuiltin = "standard"

// maxDepth bounds an extends chain.
const maxDepth = 16

// Locations says where profiles are looked for.
type Locations struct {
	// ConfigDir holds user profiles as NAME.yaml
	// ($XDG_CONFIG_HOME/propio-sandbox/profiles).
	ConfigDir string
	// Workspace is the directory the command runs in; its RepoProfile is used
	// when no profile is named. Profile files inside it are repository
	// profile files.
	Workspace string
	// Host, when set, has Load judge mount sources on these host facts too
	// (see Profile.Grants), reporting what it refuses with the rest.
	Host *GrantHost
}

// IsPath reports whether a profile reference names a file rather than a profile.
func IsPath(ref string) bool {
	return strings.Contains(ref, "/") || strings.HasSuffix(ref, ".yaml") || strings.HasSuffix(ref, ".yml")
}

// Load finds the profile named by ref (a name, a path, or "" for the
// repository's profile or else the default built-in), resolves its extends
// chain, applies defaults and checks it. Every problem found, by the schema
// and by Check, is returned in one List, in file order. What it gives does
// not depend on the host's cores and memory: preflight judges those.
func (l Locations) Load(ref string) (*Profile, error) {
	leaf, err := l.find(ref)
	return l.load(ref, leaf, err)
}

// LoadFile is Load for a profile file (as `validate FILE` does).
func (l Locations) LoadFile(path string) (*Profile, error) {
	leaf, err := l.readFile(path, path)
	return l.load(path, leaf, err)
}

// Resolve is Load without the final Check: extends merged and defaults
// applied. Schema problems are returned without a profile.
func (l Locations) Resolve(ref string) (*Profile, error) {
	leaf, err := l.find(ref)
	return l.resolveOnly(ref, leaf, err)
}

// ResolveFile is Resolve for a profile file.
func (l Locations) ResolveFile(path string) (*Profile, error) {
	leaf, err := l.readFile(path, path)
	return l.resolveOnly(path, leaf, err)
}

func (l Locations) resolveOnly(ref string, leaf *Document, leafErr error) (*Profile, error) {
	if leaf == nil {
		return nil, leafErr
	}
	p, problems, err := l.resolve(ref, leaf, leafErr)
	switch {
	case err != nil:
		return nil, err
	case len(problems) > 0:
		return nil, problems
	}
	return p, nil
}

func (l Locations) load(ref string, leaf *Document, leafErr error) (*Profile, error) {
	if leaf == nil {
		return nil, leafErr
	}
	p, problems, err := l.resolve(ref, leaf, leafErr)
	if err != nil {
		return nil, err
	}
	if p == nil {
		return nil, problems
	}
	var checked List
	if err := p.Check(); err != nil {
		checked = err.(List)
	}
	if l.Host != nil {
		// Mount sources judged on the host; Check has judged the rest.
		hd := p.hostDangers(*l.Host)
		errs, _ := p.judge(hd)
		checked = append(checked, errs...)
		_, p.granted = p.judge(append(p.hostFreeDangers(), hd...))
	}
	// A field the schema rejected is reported once, by the schema.
	flagged := map[string]bool{}
	for _, e := range problems {
		flagged[e.Field] = true
	}
	for _, e := range checked {
		if !flagged[e.Field] {
			problems = append(problems, e)
		}
	}
	if len(problems) > 0 {
		p.sortByPos(problems)
		return nil, problems
	}
	return p, nil
}

// Source reports which file ref would load, without parsing it: a path, or
// builtin:NAME.
func (l Locations) Source(ref string) (string, error) {
	switch {
	case ref == "":
		repo := filepath.Join(l.Workspace, RepoProfile)
		// Lstat: a link there that leads nowhere, or in a loop, is the
		// repository's profile failing to load, not a reason to fall back.
		if _, err := os.Lstat(repo); err == nil {
			return repo, nil
		}
		return "builtin:" + DefaultBuiltin, nil
	case IsPath(ref):
		return ref, nil
	}
	if path, ok := l.userProfile(ref); ok {
		return path, nil
	}
	if _, err := fs.Stat(profiles.FS, ref+".yaml"); err == nil {
		return "builtin:" + ref, nil
	}
	return "", l.notFound(ref)
}

func (l Locations) find(ref string) (*Document, error) {
	src, err := l.Source(ref)
	if err != nil {
		return nil, err
	}
	if name, ok := strings.CutPrefix(src, "builtin:"); ok {
		return readBuiltin(name)
	}
	display := src
	if ref == "" {
		display = RepoProfile
	}
	return l.readFile(src, display)
}

func (l Locations) userProfile(name string) (string, bool) {
	if l.ConfigDir == "" {
		return "", false
	}
	for _, ext := range []string{".yaml", ".yml"} {
		path := filepath.Join(l.ConfigDir, name+ext)
		if _, err := os.Stat(path); err == nil {
			return path, true
		}
	}
	return "", false
}

func (l Locations) notFound(name string) error {
	where := "built-ins: " + strings.Join(profiles.Names(), ", ")
	if l.ConfigDir != "" {
		where = filepath.Join(l.ConfigDir, name+".yaml") + ", " + where
	}
	return fmt.Errorf("profile %q: %w (looked in %s)", name, ErrNotFound, where)
}

func readBuiltin(name string) (*Document, error) {
	data, err := fs.ReadFile(profiles.FS, name+".yaml")
	if err != nil {
		return nil, fmt.Errorf("reading built-in profile %q: %w", name, err)
	}
	return Parse("builtin:"+name, "", bytes.NewReader(data))
}

func (l Locations) readFile(path, display string) (*Document, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("reading profile %s: %w", display, err)
	}
	// The file's path with its directory's links resolved too, so that a
	// file of the workspace reached through a link is known as one (the
	// workspace has none); the path as named stays what the file is known by.
	real := abs
	if dir, err := filepath.EvalSymlinks(filepath.Dir(abs)); err == nil {
		real = filepath.Join(dir, filepath.Base(abs))
	}
	// The file may be one the agent made: never block on it (a FIFO), never
	// open a device.
	f, err := fsutil.OpenRegular(abs)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("profile file %s: %w", display, ErrNotFound)
		}
		return nil, &ReadError{File: display, err: err}
	}
	defer f.Close()
	d, err := Parse(display, filepath.Dir(abs), f)
	if d != nil {
		d.Path, d.Real = abs, real
	}
	return d, err
}

// key identifies a document for cycle detection.
func key(d *Document) string {
	if d.Path == "" {
		return d.File
	}
	return d.Path
}

// parent finds the document that d extends, or nil when it extends nothing.
func (l Locations) parent(d *Document) (*Document, error) {
	ref, node := d.Extends()
	if ref == "" {
		return nil, nil
	}
	at := posOf(d.File, node)
	if IsPath(ref) {
		if d.Dir == "" {
			return nil, List{{Pos: at, Field: "extends", Msg: fmt.Sprintf("a built-in profile cannot extend a path (%q)", ref)}}
		}
		path := ref
		if !filepath.IsAbs(path) {
			path = filepath.Join(d.Dir, ref)
		}
		p, err := l.readFile(path, relDisplay(path))
		if errors.Is(err, ErrNotFound) {
			return nil, List{{Pos: at, Field: "extends", Msg: fmt.Sprintf("%q does not exist (looked for %s)", ref, path), Hint: "extends takes a built-in name, a user profile name, or a path relative to this file"}}
		}
		return p, extendsError(at, err)
	}
	// A user profile that extends its own name means the built-in of that name.
	if path, ok := l.userProfile(ref); ok && !fsutil.SameFile(path, d.Path) {
		p, err := l.readFile(path, path)
		return p, extendsError(at, err)
	}
	if _, err := fs.Stat(profiles.FS, ref+".yaml"); err == nil {
		return readBuiltin(ref)
	}
	return nil, List{{Pos: at, Field: "extends", Msg: l.notFound(ref).Error(), Hint: "run `propio-sandbox profiles` to list the profiles there are"}}
}

// ReadError is a profile file that could not be read: it is not a regular
// file (a FIFO, a device, a socket, a directory), a symbolic link loop, or
// unreadable.
type ReadError struct {
	File string // as shown
	err  error
}

func (e *ReadError) Error() string { return "profile file " + e.File + " " + fsutil.Problem(e.err) }
func (e *ReadError) Unwrap() error { return e.err }

// extendsError puts an extends target that could not be read at the extends
// line; the problems of a target that was read (a List) stay where they are.
func extendsError(at Pos, err error) error {
	var re *ReadError
	if errors.As(err, &re) {
		return List{{Pos: at, Field: "extends", Msg: re.Error(), Hint: "extends must name a profile file: a regular YAML file"}}
	}
	return err
}

// relDisplay shows a path relative to the current directory when that is shorter.
func relDisplay(path string) string {
	wd, err := os.Getwd()
	if err != nil {
		return path
	}
	if rel, err := filepath.Rel(wd, path); err == nil && !strings.HasPrefix(rel, "..") {
		return rel
	}
	return path
}

// resolve follows the extends chain of leaf and merges it. Schema problems
// of the files (leafErr for the leaf) are gathered into problems; the profile
// is still returned when the merged files decode, so that Check can add its
// own. err is for failures that are not about the profile's content.
func (l Locations) resolve(ref string, leaf *Document, leafErr error) (p *Profile, problems List, err error) {
	gather := func(err error) error {
		var list List
		if errors.As(err, &list) {
			problems = append(problems, list...)
			return nil
		}
		return err
	}
	if err := gather(leafErr); err != nil {
		return nil, nil, err
	}
	chain := []*Document{leaf}
	seen := map[string]bool{key(leaf): true}
	for d := leaf; ; {
		parent, err := l.parent(d)
		if err := gather(err); err != nil {
			return nil, nil, err
		}
		if parent == nil {
			if err != nil { // the parent is missing or unusable: nothing to merge
				return nil, problems, nil
			}
			break
		}
		_, node := d.Extends()
		if seen[key(parent)] || len(chain) >= maxDepth {
			names := make([]string, 0, len(chain)+1)
			for _, c := range chain {
				names = append(names, c.File)
			}
			names = append(names, parent.File)
			msg := "extends cycle: " + strings.Join(names, " -> ")
			if !seen[key(parent)] {
				msg = fmt.Sprintf("extends chain is deeper than %d: %s", maxDepth, strings.Join(names, " -> "))
			}
			return nil, append(problems, &Error{Pos: posOf(d.File, node), Field: "extends", Msg: msg}), nil
		}
		seen[key(parent)] = true
		chain = append(chain, parent)
		d = parent
	}

	return decodeChain(ref, chain, problems, l.Workspace, l.ConfigDir)
}

// decodeChain merges chain (a leaf first, then each file it extends) and
// decodes it, with defaults applied; problems are those found so far, to
// which it adds its own.
func decodeChain(ref string, chain []*Document, problems List, workspace, configDir string) (*Profile, List, error) {
	leaf := chain[0]
	origin := map[*yaml.Node]*Document{}
	for _, d := range chain {
		recordOrigin(d.Root, d, origin)
	}
	root := chain[len(chain)-1].Root
	for i := len(chain) - 2; i >= 0; i-- {
		if ownsImage(root, chain[i].Root) {
			root = without(root, "build", origin)
		}
		root = merge("", root, chain[i].Root, origin, chain[i])
	}
	root = without(root, "extends", origin)
	if b := lookup(root, "build"); b != nil && b.Tag == "!!null" {
		root = without(root, "build", origin) // build: null drops the parent's
	}
	for _, d := range chain {
		if b := lookup(d.Root, "build"); b != nil && b.Kind == yaml.MappingNode && len(b.Content) == 0 {
			problems = append(problems, &Error{Pos: posOf(d.File, b), Field: "build", Msg: "an empty build changes nothing (maps merge under extends)",
				Hint: "write build: null to drop an inherited build, or give it a context"})
		}
	}

	p := &Profile{}
	if err := root.Decode(p); err != nil {
		if len(problems) > 0 { // the schema has said what is wrong
			return nil, problems, nil
		}
		return nil, List{{Pos: posOf(leaf.File, root), Msg: "decoding profile: " + err.Error()}}, nil
	}
	p.src = &resolved{root: root, origin: origin, leaf: leaf, chain: chain, workspace: workspace, configDir: configDir}
	p.Meta = Meta{Name: ref, File: leaf.File}
	for _, d := range chain {
		s := Source{File: d.File, Path: d.Path, Real: d.Real, SHA256: d.SHA256}
		p.Meta.Chain = append(p.Meta.Chain, s)
	}
	if p.Build != nil {
		p.Build.Dir = p.src.dirOf("build", "context")
	}
	for i := range p.Mounts {
		p.Mounts[i].Dir = p.src.dirOf("mounts", fmt.Sprint(i))
	}
	if p.Network.UpstreamCA != "" {
		p.Network.UpstreamCADir = p.src.dirOf("network", "upstream_ca")
	}
	p.settleSecrets()
	p.applyDefaults()
	return p, problems, nil
}

// ownsImage reports whether child names another image than parent: the
// parent's build makes the parent's image, and must never be run under the
// child's tag, so the child's build (or none) is the whole of it.
func ownsImage(parent, child *yaml.Node) bool {
	img := lookup(child, "image")
	if img == nil {
		return false
	}
	prev := lookup(parent, "image")
	return prev == nil || prev.Value != img.Value
}

// without returns a copy of mapping m lacking key.
func without(m *yaml.Node, key string, origin map[*yaml.Node]*Document) *yaml.Node {
	if lookup(m, key) == nil {
		return m
	}
	out := *m
	out.Content = nil
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value != key {
			out.Content = append(out.Content, m.Content[i], m.Content[i+1])
		}
	}
	origin[&out] = origin[m]
	return &out
}

// Entry describes one available profile.
type Entry struct {
	Name        string
	Source      string // a path, or "built-in"
	Description string
	Shadowed    bool // a built-in hidden by a user profile of the same name
}

// List returns the user profiles and the built-ins, sorted by name. A user
// profile that fails to parse is listed with its error as description.
func (l Locations) List() []Entry {
	var out []Entry
	users := map[string]bool{}
	if l.ConfigDir != "" {
		matches, _ := filepath.Glob(filepath.Join(l.ConfigDir, "*.y*ml"))
		for _, path := range matches {
			name := strings.TrimSuffix(strings.TrimSuffix(filepath.Base(path), ".yaml"), ".yml")
			if users[name] {
				continue
			}
			users[name] = true
			e := Entry{Name: name, Source: path}
			if doc, err := l.readFile(path, path); err != nil {
				e.Description = "(invalid: run `propio-sandbox validate " + path + "`)"
			} else {
				e.Description = description(doc)
			}
			out = append(out, e)
		}
	}
	for _, name := range profiles.Names() {
		doc, err := readBuiltin(name)
		e := Entry{Name: name, Source: "built-in", Shadowed: users[name]}
		if err == nil {
			e.Description = description(doc)
		}
		out = append(out, e)
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return !out[i].Shadowed && out[j].Shadowed
	})
	return slices.Clip(out)
}

func description(d *Document) string {
	if v := lookup(d.Root, "description"); v != nil {
		return v.Value
	}
	return ""
}
