package hostinfo

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"unicode"

	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/profile"
)

// maxLinks is how many symbolic links a hide rule follows to find what a
// link reads, as the kernel's own limit.
const maxLinks = 40

// Match finds the workspace entries that p's workspace.readonly and
// workspace.hide rules select, and says, in warnings, which rules it did
// not follow through a symbolic link.
//
// A pattern without a slash matches a name at any depth, which takes a walk
// of the whole tree; one that starts with / or has a slash inside is
// matched from the workspace root, segment by segment against the entries
// of each directory (path.Match), without a walk. No symbolic link is
// followed, in any segment: the engine mounts a path by resolving it on the
// host, so a rule whose path is or passes a link would mount what the link
// points at, perhaps a host directory; such a rule mounts nothing there and
// gets a warning. A hide rule alone follows a link to what it reads inside
// the sandbox, when that is in the workspace (a relative target, or an
// absolute one beneath the workspace's target), and hides that: a link
// `.env -> config/prod.env` must not leave config/prod.env readable.
//
// Then every other name (hard link) of a hidden regular file, also of one
// below a hidden directory, is hidden too, wherever it is in the workspace;
// that takes a walk only when some hidden file has more than one name.
func Match(workspace string, p *profile.Profile) ([]generator.Match, []string, error) {
	m := &matcher{
		root:    workspace,
		target:  path.Clean(p.Workspace.Target),
		found:   map[string]generator.Match{},
		hidden:  map[fileID]bool{},
		scanned: map[string]bool{},
		others:  map[fileID][]string{},
	}
	if p.Workspace.Target == "" {
		m.target = profile.DefaultTarget
	}
	var names []rule
	for _, r := range rulesOf(p) {
		if r.name {
			names = append(names, r)
			continue
		}
		if err := m.segments(r, "", r.segs); err != nil {
			return nil, nil, fmt.Errorf("matching %s %q: %w", r.field, r.pattern, err)
		}
	}
	if err := m.scanHidden(); err != nil {
		return nil, nil, err
	}
	// When hidden files have other names already, the walk for names
	// collects the files with several names as it goes.
	collect := len(m.hidden) > 0
	if len(names) > 0 {
		if err := m.walk("", names, collect); err != nil {
			return nil, nil, fmt.Errorf("matching workspace paths: %w", err)
		}
		if err := m.scanHidden(); err != nil {
			return nil, nil, err
		}
	} else {
		collect = false
	}
	if len(m.hidden) > 0 {
		if !collect {
			if err := m.walk("", nil, true); err != nil {
				return nil, nil, fmt.Errorf("looking for other names of hidden files: %w", err)
			}
		}
		for id := range m.hidden {
			for _, rel := range m.others[id] {
				m.add(rel, false, true)
			}
		}
	}
	out := make([]generator.Match, 0, len(m.found))
	for _, f := range m.found {
		out = append(out, f)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, m.warnings, nil
}

// rule is one readonly or hide pattern, as the matcher uses it.
type rule struct {
	field   string // workspace.hide[2]
	pos     profile.Pos
	pattern string   // as written
	segs    []string // the path's segments from the workspace root; the name alone for a name pattern
	name    bool     // no slash: matches a name at any depth
	hide    bool
}

// rulesOf returns p's readonly rules, then its hide rules.
func rulesOf(p *profile.Profile) []rule {
	var out []rule
	for _, list := range []struct {
		key  string
		pats []string
	}{{"readonly", p.Workspace.ReadOnly}, {"hide", p.Workspace.Hide}} {
		for i, pat := range list.pats {
			r := rule{
				field:   fmt.Sprintf("workspace.%s[%d]", list.key, i),
				pos:     p.Pos("workspace", list.key, strconv.Itoa(i)),
				pattern: pat,
				hide:    list.key == "hide",
			}
			trimmed := strings.TrimSuffix(pat, "/")
			anchored, rooted := strings.CutPrefix(trimmed, "/")
			r.name = !rooted && !strings.Contains(trimmed, "/")
			for _, seg := range strings.Split(anchored, "/") {
				if seg != "" {
					r.segs = append(r.segs, seg)
				}
			}
			if len(r.segs) > 0 {
				out = append(out, r)
			}
		}
	}
	return out
}

// hiddenPath reports whether a workspace path (relative, forward slashes)
// is hidden by one of patterns, by the rules Match applies to what exists:
// a name pattern hides the path when it matches any of its segments (a
// hidden directory hides all below it), an anchored one when it matches
// its first segments. Links and other names are not considered: a path is
// not looked up.
func hiddenPath(patterns []string, rel string) bool {
	segs := strings.Split(rel, "/")
	p := &profile.Profile{Workspace: profile.Workspace{Hide: patterns}}
	for _, r := range rulesOf(p) {
		if r.name {
			for _, s := range segs {
				if ok, _ := path.Match(r.segs[0], s); ok {
					return true
				}
			}
			continue
		}
		if len(r.segs) > len(segs) {
			continue
		}
		all := true
		for i, pat := range r.segs {
			if ok, _ := path.Match(pat, segs[i]); !ok {
				all = false
				break
			}
		}
		if all {
			return true
		}
	}
	return false
}

// fileID is a file's device and inode: what its names have in common.
type fileID struct{ dev, ino uint64 }

// idOf returns the device and inode of a regular file with more than one name.
func idOf(fi fs.FileInfo) (fileID, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || !fi.Mode().IsRegular() || st.Nlink < 2 {
		return fileID{}, false
	}
	return fileID{dev: uint64(st.Dev), ino: uint64(st.Ino)}, true
}

type matcher struct {
	root     string // the workspace on the host: absolute, free of links
	target   string // where the sandbox sees it
	found    map[string]generator.Match
	warnings []string
	// hidden are the hidden regular files that have other names; scanned,
	// the hidden paths looked at for them.
	hidden  map[fileID]bool
	scanned map[string]bool
	// others are the workspace's regular files with several names, when a
	// walk collected them.
	others map[fileID][]string
}

func (m *matcher) abs(rel string) string { return filepath.Join(m.root, filepath.FromSlash(rel)) }

func (m *matcher) add(rel string, dir, hide bool) {
	f := m.found[rel]
	f.Path, f.Dir = rel, dir
	f.Hide = f.Hide || hide
	m.found[rel] = f
}

func (m *matcher) warn(r rule, format string, args ...any) {
	m.warnings = append(m.warnings, fmt.Sprintf("%s (%s): ", r.field, r.pos)+fmt.Sprintf(format, args...))
}

// segments matches segs against the entries of the workspace directory dir
// ("" for the root; a path free of links) and below.
func (m *matcher) segments(r rule, dir string, segs []string) error {
	seg, last := segs[0], len(segs) == 1
	names := []string{seg}
	if strings.ContainsAny(seg, `*?[\`) {
		entries, err := os.ReadDir(m.abs(dir))
		if err != nil {
			return ignorable(err)
		}
		names = names[:0]
		for _, e := range entries {
			if ok, _ := path.Match(seg, e.Name()); ok {
				names = append(names, e.Name())
			}
		}
	}
	for _, name := range names {
		rel := path.Join(dir, name)
		fi, err := os.Lstat(m.abs(rel))
		switch {
		case err != nil:
			if err := ignorable(err); err != nil {
				return err
			}
		case fi.Mode()&fs.ModeSymlink != 0:
			to, dir, ok := m.link(r, rel, last)
			switch {
			case !ok:
			case last:
				m.add(to, dir, true)
			case dir:
				if err := m.segments(r, to, segs[1:]); err != nil {
					return err
				}
			}
		case last:
			m.add(rel, fi.IsDir(), r.hide)
		case fi.IsDir():
			if err := m.segments(r, rel, segs[1:]); err != nil {
				return err
			}
		}
	}
	return nil
}

// link handles a symbolic link at rel on the way of rule r: a readonly rule
// stops there, with a warning; a hide rule goes on to what the link reads
// inside the sandbox, when that is in the workspace, else stops with a
// warning; and so does one whose last segment leads to the workspace root.
// It returns where the rule goes on, and whether that is a directory.
func (m *matcher) link(r rule, rel string, last bool) (to string, dir, ok bool) {
	target := readlink(m.abs(rel))
	if !r.hide {
		m.warn(r, "%s is a symbolic link (to %s): not followed, nothing mounted for %s", show(rel), show(target), show(r.pattern))
		return "", false, false
	}
	to, fi, why := m.resolve(rel)
	if why == "" && last && to == "" {
		why = "leads to the workspace itself"
	}
	if why != "" {
		m.warn(r, "%s is a symbolic link (to %s) that %s: not followed, nothing mounted for %s", show(rel), show(target), why, show(r.pattern))
		return "", false, false
	}
	return to, fi.IsDir(), true
}

// resolve follows the symbolic link at rel as the sandbox would, staying in
// the workspace: a relative target from the link's directory, an absolute
// one only beneath the workspace's target; further links likewise, at most
// maxLinks in all. It returns the path it leads to (free of links, "" for
// the workspace root) and what is there, or why it leads nowhere in the
// workspace.
func (m *matcher) resolve(rel string) (string, fs.FileInfo, string) {
	var cur []string // the directory reached, as segments
	if d := path.Dir(rel); d != "." {
		cur = strings.Split(d, "/")
	}
	var todo []string
	links := 0
	// expand puts the target of the link at p in front of what is left to do.
	expand := func(p string) string {
		links++
		if links > maxLinks {
			return fmt.Sprintf("passes more than %d symbolic links", maxLinks)
		}
		t, err := os.Readlink(m.abs(p))
		if err != nil {
			return fmt.Sprintf("cannot be read (%v)", err)
		}
		if path.IsAbs(t) {
			in, ok := beneath(m.target, path.Clean(t))
			if !ok {
				if _, host := beneath(m.root, path.Clean(t)); host {
					// Inside, the workspace is at its target, not here.
					return "names the workspace by its host path, which the sandbox does not have (make the link relative)"
				}
				return "leads out of the workspace"
			}
			cur, t = nil, in
		}
		todo = append(strings.Split(t, "/"), todo...)
		return ""
	}
	if why := expand(rel); why != "" {
		return "", nil, why
	}
	var fi fs.FileInfo
	for len(todo) > 0 {
		seg := todo[0]
		todo = todo[1:]
		switch seg {
		case "", ".":
			continue
		case "..":
			if len(cur) == 0 {
				return "", nil, "leads out of the workspace"
			}
			cur = cur[:len(cur)-1]
			continue
		}
		p := strings.Join(append(cur[:len(cur):len(cur)], seg), "/")
		st, err := os.Lstat(m.abs(p))
		switch {
		case err != nil:
			return "", nil, fmt.Sprintf("leads to %s, which does not exist in the workspace", show(p))
		case st.Mode()&fs.ModeSymlink != 0:
			if why := expand(p); why != "" {
				return "", nil, why
			}
			continue
		case !st.IsDir() && strings.Trim(strings.Join(todo, ""), ".") != "":
			return "", nil, fmt.Sprintf("leads through %s, which is not a directory", show(p))
		}
		cur = append(cur, seg)
		fi = st
	}
	if len(cur) == 0 {
		st, err := os.Lstat(m.root)
		if err != nil {
			return "", nil, fmt.Sprintf("cannot be followed (%v)", err)
		}
		fi = st
	}
	return strings.Join(cur, "/"), fi, ""
}

// beneath returns p relative to dir when p is dir or beneath it.
func beneath(dir, p string) (string, bool) {
	switch {
	case p == dir:
		return "", true
	case dir == "/":
		return p[1:], true
	case strings.HasPrefix(p, dir+"/"):
		return p[len(dir)+1:], true
	}
	return "", false
}

// walk goes through the workspace directory dir and below, never through
// a link, matching the entries' names against the name rules; with
// collect, it also notes the regular files with several names. Hidden
// directories are not entered (scanHidden looks below them).
func (m *matcher) walk(dir string, names []rule, collect bool) error {
	entries, err := os.ReadDir(m.abs(dir))
	if err != nil {
		return ignorable(err)
	}
	for _, e := range entries {
		rel := path.Join(dir, e.Name())
		if f := m.found[rel]; f.Hide && f.Dir {
			continue
		}
		hidden := false
		for _, r := range names {
			if ok, _ := path.Match(r.segs[0], e.Name()); !ok {
				continue
			}
			if e.Type()&fs.ModeSymlink != 0 {
				if to, dir, ok := m.link(r, rel, true); ok {
					m.add(to, dir, true)
				}
				continue
			}
			m.add(rel, e.IsDir(), r.hide)
			hidden = hidden || (r.hide && e.IsDir())
		}
		switch {
		case hidden:
		case e.IsDir():
			if err := m.walk(rel, names, collect); err != nil {
				return err
			}
		case collect && e.Type().IsRegular():
			fi, err := e.Info()
			if err != nil {
				if err := ignorable(err); err != nil {
					return err
				}
				continue
			}
			if id, ok := idOf(fi); ok {
				m.others[id] = append(m.others[id], rel)
			}
		}
	}
	return nil
}

// scanHidden notes the hidden regular files that have other names, looking
// below hidden directories too; each hidden path once.
func (m *matcher) scanHidden() error {
	for rel, f := range m.found {
		if !f.Hide || m.scanned[rel] {
			continue
		}
		m.scanned[rel] = true
		if !f.Dir {
			fi, err := os.Lstat(m.abs(rel))
			if err != nil {
				if err := ignorable(err); err != nil {
					return err
				}
				continue
			}
			if id, ok := idOf(fi); ok {
				m.hidden[id] = true
			}
			continue
		}
		err := filepath.WalkDir(m.abs(rel), func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return ignorable(err)
			}
			if !d.Type().IsRegular() {
				return nil
			}
			fi, err := d.Info()
			if err != nil {
				return ignorable(err)
			}
			if id, ok := idOf(fi); ok {
				m.hidden[id] = true
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("looking below the hidden directory %s: %w", rel, err)
		}
	}
	return nil
}

// ignorable is nil for an error that only means there is nothing to match:
// the entry is gone, or unreadable (here, and so in the sandbox too).
func ignorable(err error) error {
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) || errors.Is(err, syscall.ENOTDIR) {
		return nil
	}
	return err
}

func readlink(p string) string {
	t, err := os.Readlink(p)
	if err != nil {
		return "?"
	}
	return t
}

// show returns a name as it is when it prints as itself, else quoted: a
// name in the workspace may hold anything, terminal escapes included.
func show(s string) string {
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	return s
}

// HiddenTracked returns those of paths (relative to the workspace, such as
// what git tracks) that the sandbox hides: matched by a hide pattern
// (hiddenPath), or at or below a path that Match hid (the target of a
// link, another name of a hidden file).
func HiddenTracked(hide []string, matches []generator.Match, paths []string) []string {
	hidden := map[string]bool{}
	for _, m := range matches {
		if m.Hide {
			hidden[m.Path] = true
		}
	}
	var out []string
	for _, p := range paths {
		in := hiddenPath(hide, p)
		for q := p; !in && q != "."; q = path.Dir(q) {
			in = hidden[q]
		}
		if in {
			out = append(out, p)
		}
	}
	return out
}
