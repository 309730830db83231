// Package guard keeps what a sandbox writes in the host directories it may
// write (the workspace, rw mounts) from running on the host afterwards.
//
// Git is the way in: the user runs git in the workspace after every run, and
// git runs programs named by files of the repository (hooks, core.fsmonitor
// and the other commands its configuration names). So, before a run, Scan
// finds each directory's git directory and its executable surface, and the
// sandbox gets them read-only: the configuration and the files it includes,
// the hooks (made empty when missing, as git init would), commondir,
// config.worktree, worktrees/, and the same in every submodule's git
// directory; the git directory itself is mounted on itself, so that the
// sandbox can neither rename nor remove nor replace it (a mount point is
// busy). What cannot be mounted because it does not exist yet, and every
// other git directory the sandbox could make or change anywhere below, is
// judged when the run has ended: Check puts aside (into a quarantine
// directory, never deleting it) what git would run, among it the state of
// every operation left in progress (rebase, am, cherry-pick, revert, merge,
// bisect) that changed, keeps what it would not, removes setuid and setgid
// bits and device nodes the sandbox made, names the files the user's hooks
// run by their path that the sandbox changed, and says what it did. A
// persistent sandbox's exec runs the same check for what changed while
// its command ran (CheckSince).
//
// The guard never runs git, and never follows a symbolic link below a
// directory the sandbox could write.
package guard

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/propio/propio-sandbox/internal/fsutil"
)

// Root is a host directory the sandbox may change.
type Root struct {
	// Name says which: "workspace", or "mount-I" for the profile's mounts[I]
	// ("extra-I" for the launch's PROPIO_SANDBOX_MOUNTS).
	Name string `json:"name"`
	// Source is the host directory, absolute, links resolved.
	Source string `json:"source"`
	// Changeset: the sandbox writes to a changeset of it, not to it; the
	// surface is still mounted read-only over the changeset, and what an
	// apply writes is checked by Sweep.
	Changeset bool `json:"changeset,omitempty"`
}

// Plan is the guard of one launch: what is mounted, and what is judged when
// the sandbox has ended. It is saved while the sandbox runs, so that gc can
// finish the job of a launcher that was killed.
type Plan struct {
	Project string    `json:"project"`
	Started time.Time `json:"started"`
	PID     int       `json:"launcher_pid"`
	Host    string    `json:"launcher_host"`
	Roots   []RootPlan
}

// RootPlan is the guard of one root.
type RootPlan struct {
	Root
	// GitDir is the root's own git directory (relative to the root: ".git",
	// "." for a bare repository), held in place by a mount on itself; empty
	// when there is none.
	GitDir string `json:"git_dir,omitempty"`
	// GitFile is a .git file (gitdir: ...) at the root, mounted read-only.
	GitFile string `json:"git_file,omitempty"`
	// ReadOnly are the paths of the executable surface that exist: mounted
	// read-only.
	ReadOnly []string `json:"read_only,omitempty"`
	// Absent are the paths of the surface that do not exist (git would
	// read them if they did): judged when the run ends.
	Absent []string `json:"absent,omitempty"`
	// MakeDirs are the hooks directories that do not exist: Prepare makes
	// them (empty, as git init does) so that they can be mounted read-only.
	MakeDirs []string `json:"make_dirs,omitempty"`
	// Protected are the git directories whose surface is mounted read-only.
	Protected []string `json:"protected,omitempty"`
	// Linked are the read-only files of the surface that have other names
	// (hard links) in the root, through which the sandbox could change
	// them: judged at the end, configurations as configurations.
	Linked []string `json:"linked,omitempty"`
	// Configs are the configuration files among the surface.
	Configs []string `json:"configs,omitempty"`
	// Named are the files in the root that the user's hooks run by their
	// path: the sandbox may change them, and the hook would run what it
	// wrote. Reported when the run ends, never put aside.
	Named []Named `json:"named,omitempty"`
	// Notes are what the scan found that the user should know.
	Notes []string `json:"notes,omitempty"`
}

// Named is a path a hook names.
type Named struct {
	Hook string `json:"hook"` // the hook, relative to the root
	Path string `json:"path"` // a file or directory (a package's) it runs, relative to the root
}

// Scan finds the executable surface of each root's git directory. It
// changes nothing on the host (render calls it); Prepare does.
func Scan(roots []Root) Plan {
	var plan Plan
	for _, r := range roots {
		plan.Roots = append(plan.Roots, scanRoot(r))
	}
	return plan
}

func scanRoot(r Root) RootPlan {
	rp := RootPlan{Root: r}
	switch {
	case isGitDir(r.Source, "."):
		// A bare repository mounted as it is: the root is its git
		// directory, and a mount point already.
		rp.GitDir = "."
	default:
		st, err := lstat(r.Source, ".git")
		switch {
		case err != nil:
			return rp
		case st.mode&fs.ModeSymlink != 0:
			target, _ := os.Readlink(filepath.Join(r.Source, ".git"))
			rp.Notes = append(rp.Notes, fmt.Sprintf(".git is a symbolic link (to %s): not followed; nothing of it is mounted", target))
			return rp
		case st.mode.IsRegular():
			rp.GitFile = ".git"
			if dir, ok := gitFileTarget(r.Source, ".git"); ok && dir != "" {
				// A gitfile pointing inside the root: guard that directory.
				rp.GitDir = dir
			}
			if rp.GitDir == "" {
				return rp
			}
		case st.mode.IsDir():
			rp.GitDir = ".git"
		default:
			rp.Notes = append(rp.Notes, fmt.Sprintf(".git is a %s, not a repository", st.mode.Type()))
			return rp
		}
	}
	rp.protect(rp.GitDir)
	for _, m := range modules(r.Source, rp.GitDir) {
		rp.protect(m)
	}
	rp.configFiles()
	rp.hookConfigs()
	slices.Sort(rp.ReadOnly)
	rp.ReadOnly = slices.Compact(rp.ReadOnly)
	rp.hookNamed()
	rp.linked()
	slices.Sort(rp.Absent)
	rp.Absent = slices.Compact(rp.Absent)
	return rp
}

// surface are the entries of a git directory that make git run something
// or read other files: what the sandbox must not change.
var surface = []string{"config", "hooks", "commondir", "config.worktree", "worktrees"}

// protect adds the surface of the git directory gd (relative to the root).
func (rp *RootPlan) protect(gd string) {
	rp.Protected = append(rp.Protected, gd)
	for _, name := range surface {
		rel := path.Join(gd, name)
		st, err := lstat(rp.Source, rel)
		switch {
		case err != nil && name == "hooks" && rp.Changeset:
			// Nothing is made in a directory in changeset mode: hooks the
			// sandbox adds are in the changeset, judged when applied.
		case err != nil && name == "hooks":
			rp.MakeDirs = append(rp.MakeDirs, rel)
			rp.ReadOnly = append(rp.ReadOnly, rel)
		case err != nil && name == "worktrees":
			// Worktrees the sandbox adds are git directories of their own,
			// judged as such at the end (their commondir must lead back).
		case err != nil:
			rp.Absent = append(rp.Absent, rel)
		case st.mode&fs.ModeSymlink != 0:
			// A link cannot be mounted without following it: judged at the end.
			rp.Absent = append(rp.Absent, rel)
			rp.Notes = append(rp.Notes, rel+" is a symbolic link: not mounted read-only; checked when the sandbox ends")
		default:
			rp.ReadOnly = append(rp.ReadOnly, rel)
		}
	}
}

// configFiles adds what the protected configurations name inside the root:
// the files they include and the hooks directory core.hooksPath names.
func (rp *RootPlan) configFiles() {
	seen := map[string]bool{}
	queue := []string{}
	for _, gd := range rp.Protected {
		queue = append(queue, path.Join(gd, "config"))
	}
	for len(queue) > 0 && len(seen) < 64 {
		file := queue[0]
		queue = queue[1:]
		if seen[file] {
			continue
		}
		seen[file] = true
		rp.Configs = append(rp.Configs, file)
		data, err := readFile(rp.Source, file)
		if err != nil {
			continue
		}
		entries, err := parseGitConfig(data)
		if err != nil {
			rp.Notes = append(rp.Notes, fmt.Sprintf("%s cannot be read as git does (%v): the files it names are not protected", file, err))
			continue
		}
		var includes []string
		includes = append(includes, configValues(entries, "include", "", "path")...)
		includes = append(includes, configValues(entries, "includeif", "*", "path")...)
		for _, inc := range includes {
			rel, ok := rp.inside(path.Dir(file), inc)
			if !ok {
				continue
			}
			rp.addFile(rel)
			queue = append(queue, rel)
		}
		for _, hp := range configValues(entries, "core", "", "hookspath") {
			// Relative to where hooks run: the top of the worktree.
			top := path.Dir(rp.GitDir)
			if rp.GitDir == "." {
				top = "."
			}
			rel, ok := rp.inside(top, hp)
			if !ok {
				continue
			}
			rp.addFile(rel)
			// husky (core.hooksPath = .husky/_) runs the scripts one level up.
			if path.Base(rel) == "_" && path.Dir(rel) != "." {
				rp.addFile(path.Dir(rel))
			}
		}
	}
}

// linked finds the files of the read-only surface that have other names:
// a write through one of those changes them.
func (rp *RootPlan) linked() {
	var visit func(rel string, depth int)
	visit = func(rel string, depth int) {
		st, err := lstat(rp.Source, rel)
		switch {
		case err != nil || depth > 4:
		case st.mode.IsRegular() && st.nlink > 1:
			rp.Linked = append(rp.Linked, rel)
			rp.Notes = append(rp.Notes, rel+" has other names (hard links) in the directory: checked when the sandbox ends")
		case st.mode.IsDir():
			names, _ := readDir(rp.Source, rel)
			slices.Sort(names)
			for _, n := range names {
				visit(path.Join(rel, n), depth+1)
			}
		}
	}
	for _, rel := range rp.ReadOnly {
		if path.Base(rel) != "worktrees" {
			visit(rel, 0)
		}
	}
}

// hookFrameworks are hook managers whose hooks run what files of the
// worktree say: the hook is the user's, but it would run the sandbox's
// commands if those files changed. marker is a string their hooks hold.
var hookFrameworks = []struct {
	marker string
	files  []string
}{
	{"pre-commit.com", []string{".pre-commit-config.yaml", ".pre-commit-config.yml"}},
	{"lefthook", []string{"lefthook.yml", "lefthook.yaml", ".lefthook.yml", ".lefthook.yaml", "lefthook-local.yml", "lefthook-local.yaml", ".lefthook-local.yml", ".lefthook", ".lefthook-local"}},
}

// preCommitConfig finds the --config=FILE a pre-commit hook passes.
var preCommitConfig = regexp.MustCompile(`--config=([^'"\s]+)`)

// hookConfigs protects the files that installed hook managers read from
// the worktree (pre-commit's configuration, lefthook's).
func (rp *RootPlan) hookConfigs() {
	top := path.Dir(rp.GitDir)
	if rp.GitDir == "." {
		return // a bare repository has no worktree here
	}
	for _, hook := range rp.hooks() {
		data, err := readFile(rp.Source, hook)
		if err != nil {
			continue
		}
		for _, fw := range hookFrameworks {
			if !strings.Contains(string(data), fw.marker) {
				continue
			}
			files := slices.Clone(fw.files)
			for _, m := range preCommitConfig.FindAllStringSubmatch(string(data), -1) {
				files = append(files, m[1])
			}
			for _, f := range files {
				if rel, ok := rp.inside(top, f); ok && exists(rp.Source, rel) {
					rp.addFile(rel)
				}
			}
		}
	}
}

// hooks are the hooks that the held surface holds, in path order: those
// of each protected git directory, and of a hooks directory that
// core.hooksPath names in the root (hooks held read-only: what they are at
// the start, they are at the end).
func (rp *RootPlan) hooks() []string {
	var dirs []string
	for _, gd := range rp.Protected {
		dirs = append(dirs, path.Join(gd, "hooks"))
	}
	for _, rel := range rp.ReadOnly {
		if st, err := lstat(rp.Source, rel); err == nil && st.mode.IsDir() && !slices.Contains(dirs, rel) && !strings.HasSuffix(rel, "/worktrees") {
			dirs = append(dirs, rel) // a core.hooksPath inside the root
		}
	}
	var out []string
	for _, dir := range dirs {
		names, err := readDir(rp.Source, dir)
		if err != nil {
			continue
		}
		slices.Sort(names)
		for _, n := range names {
			if !strings.HasSuffix(n, ".sample") {
				out = append(out, path.Join(dir, n))
			}
		}
	}
	return out
}

// inside resolves a path from a configuration (relative to dir, or
// absolute) and reports whether it is inside the root. ~ paths are the
// user's, outside.
func (rp *RootPlan) inside(dir, p string) (string, bool) {
	if p == "" || strings.HasPrefix(p, "~") || strings.HasPrefix(p, "%(prefix)") {
		return "", false
	}
	var abs string
	if filepath.IsAbs(p) {
		abs = filepath.Clean(p)
	} else {
		abs = filepath.Join(rp.Source, dir, p)
	}
	return fsutil.Rel(rp.Source, abs)
}

// addFile protects a path the configuration names: read-only when it
// exists (and no link is on its way), else judged at the end.
func (rp *RootPlan) addFile(rel string) {
	st, err := lstat(rp.Source, rel)
	switch {
	case errors.Is(err, errLink) || err == nil && st.mode&fs.ModeSymlink != 0:
		rp.Absent = append(rp.Absent, rel)
		rp.Notes = append(rp.Notes, rel+" (named by git's configuration) is, or is below, a symbolic link: not mounted read-only; checked when the sandbox ends")
	case err != nil:
		rp.Absent = append(rp.Absent, rel)
	default:
		rp.ReadOnly = append(rp.ReadOnly, rel)
	}
}

// Path is a path the plan mounts beyond the profile's rules: a held git
// directory (on itself, read-write) or a part of the surface (read-only).
type Path struct {
	Root     string // the root's name
	Path     string // relative to the root, with forward slashes
	ReadOnly bool
}

// Paths are what the plan mounts: each held git directory on itself, a
// .git file and the surface read-only; in path order.
func (p Plan) Paths() []Path {
	var out []Path
	for _, rp := range p.Roots {
		if rp.GitFile != "" {
			out = append(out, Path{Root: rp.Name, Path: rp.GitFile, ReadOnly: true})
		}
		if rp.GitDir != "" && rp.GitDir != "." && !rp.Changeset {
			out = append(out, Path{Root: rp.Name, Path: rp.GitDir})
		}
		for _, rel := range rp.ReadOnly {
			out = append(out, Path{Root: rp.Name, Path: rel, ReadOnly: true})
		}
	}
	slices.SortStableFunc(out, func(a, b Path) int { return cmp.Or(cmp.Compare(a.Root, b.Root), cmp.Compare(a.Path, b.Path)) })
	return out
}

// Notes are the plan's notes, each prefixed with the root's name.
func (p Plan) Notes() []string {
	var out []string
	for _, rp := range p.Roots {
		for _, n := range rp.Notes {
			out = append(out, rp.Name+": "+n)
		}
	}
	return out
}

// Prepare makes what the plan mounts but does not exist yet (empty hooks
// directories), records when the sandbox starts, and saves the plan under
// dir so that gc can check a sandbox whose launcher was killed.
func (p *Plan) Prepare(dir, project string, now time.Time) error {
	p.Project = project
	// ctime is kept by a coarse clock (a tick, 1 to 4 ms): a change a
	// moment after now may be stamped a little before it.
	p.Started = now.Add(-clockSlack)
	p.PID = os.Getpid()
	p.Host, _ = os.Hostname()
	for _, rp := range p.Roots {
		for _, rel := range rp.MakeDirs {
			if err := mkdir(rp.Source, rel, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
				return fmt.Errorf("making %s so that the sandbox cannot add hooks: %w", filepath.Join(rp.Source, rel), err)
			}
		}
	}
	return p.save(dir)
}

// clockSlack covers the coarseness of the clock that stamps ctime.
const clockSlack = 10 * time.Millisecond

// fileName is where a plan is saved under dir.
func fileName(dir, project string) string { return filepath.Join(dir, project+".json") }

func (p *Plan) save(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("saving the guard of %s: %w", p.Project, err)
	}
	data, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return err
	}
	return fsutil.WriteFileAtomic(fileName(dir, p.Project), append(data, '\n'), 0o600)
}

// Pending returns the saved plans under dir, oldest first.
func Pending(dir string) ([]Plan, error) {
	names, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	var out []Plan
	for _, n := range names {
		data, err := os.ReadFile(n)
		if err != nil {
			continue
		}
		var p Plan
		if json.Unmarshal(data, &p) == nil && p.Project != "" {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b Plan) int { return a.Started.Compare(b.Started) })
	return out, nil
}

// Done forgets the saved plan of project.
func Done(dir, project string) error {
	err := os.Remove(fileName(dir, project))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

// isGitDir reports whether git would take root/rel for a git directory: a
// HEAD, and objects, refs or a commondir (liberal: more than git accepts
// is judged, never less).
func isGitDir(root, rel string) bool {
	st, err := lstat(root, path.Join(rel, "HEAD"))
	if err != nil || st.mode.IsDir() {
		return false
	}
	for _, name := range []string{"objects", "refs", "commondir"} {
		if exists(root, path.Join(rel, name)) {
			return true
		}
	}
	return false
}

// gitFileTarget reads the gitfile root/rel and returns the git directory it
// names, relative to the root, when it is inside; ok is false when the file
// is not a gitfile.
func gitFileTarget(root, rel string) (dir string, ok bool) {
	data, err := readFile(root, rel)
	if err != nil {
		return "", false
	}
	line, _, _ := strings.Cut(string(data), "\n")
	target, found := strings.CutPrefix(strings.TrimRight(line, "\r"), "gitdir:")
	if !found {
		return "", false
	}
	target = strings.TrimSpace(target)
	var abs string
	if filepath.IsAbs(target) {
		abs = filepath.Clean(target)
	} else {
		abs = filepath.Join(root, path.Dir(rel), target)
	}
	r, _ := fsutil.Rel(root, abs) // "" when it leads out
	return r, true
}

// modules finds the submodules' git directories below gd/modules.
func modules(root, gd string) []string {
	var out []string
	var walk func(rel string, depth int)
	walk = func(rel string, depth int) {
		if depth > 8 {
			return
		}
		names, err := readDir(root, rel)
		if err != nil {
			return
		}
		slices.Sort(names)
		for _, n := range names {
			sub := path.Join(rel, n)
			st, err := lstat(root, sub)
			if err != nil || !st.mode.IsDir() {
				continue
			}
			if isGitDir(root, sub) {
				out = append(out, sub)
				walk(path.Join(sub, "modules"), depth+1)
				continue
			}
			// A submodule named a/b has its git directory at modules/a/b.
			walk(sub, depth+1)
		}
	}
	walk(path.Join(gd, "modules"), 0)
	return out
}
