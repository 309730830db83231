package guard

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/propio/propio-sandbox/internal/fsutil"
)

// Item is one thing Check did to what the sandbox left.
type Item struct {
	Root   string // the root's name
	Source string // the root's host directory
	Path   string // relative to the root
	Action string // what was done
	Why    string // why git (or the host) would have run it
	Where  string // where it was put aside, if it was
}

// String says what was done; the paths, which the sandbox named, are
// quoted when they hold what a terminal would not print as itself.
func (it Item) String() string {
	s := fmt.Sprintf("%s: %s (%s)", shown(filepath.Join(it.Source, it.Path)), it.Action, shown(it.Why))
	if it.Where != "" {
		s += ": now in " + shown(it.Where)
	}
	return s
}

// shown is s as it is when every character prints as itself, else
// quoted (escapes, bidi controls).
func shown(s string) string {
	if strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
		return strconv.Quote(s)
	}
	return s
}

// Report is what Check did, and what it could not do.
type Report struct {
	Items []Item
	// Named are the files the user's hooks run that the sandbox changed:
	// left in place (the change may be the work asked for), for the user
	// to read before git runs the hook.
	Named  []Item
	Errors []error
}

// Err is the report's errors joined, or nil.
func (r Report) Err() error { return errors.Join(r.Errors...) }

// Actions for Item.
const (
	PutAside     = "put aside"
	Cleaned      = "kept without the settings git would run"
	SetIDRemoved = "setuid/setgid bits removed"
	NodeRemoved  = "device node removed"
	HookRuns     = "changed in the sandbox, and a hook of yours runs it: read it before git runs that hook"
)

// Check judges, once the sandbox has ended, what it left in the plan's
// roots: what git on the host would run is put aside under
// quarantine/PROJECT/ROOT/PATH (never deleted), setuid and setgid bits the
// sandbox set are removed, device nodes it made are removed. Only what
// changed since the plan's start is judged. Roots in changeset mode are
// left alone: nothing reached them (apply calls Sweep).
func (p Plan) Check(quarantine string) Report {
	c := &checker{since: p.Started, quarantine: filepath.Join(quarantine, p.Project)}
	for _, rp := range p.Roots {
		if rp.Changeset {
			continue
		}
		for _, rel := range rp.Absent {
			if c.touched(rp.Source, rel) {
				c.putAside(rp.Root, rel, "git would read it, and it did not exist (or was a link) when the sandbox started")
			}
		}
		for _, rel := range rp.Linked {
			switch {
			case !c.touched(rp.Source, rel):
			case slices.Contains(rp.Configs, rel):
				c.config(rp.Root, rel)
			default:
				c.putAside(rp.Root, rel, "git runs it, and it was changed through another name")
			}
		}
		c.sweep(rp.Root, rp.Protected)
		for _, n := range rp.Named {
			if changed, ok := c.changedBelow(rp.Source, n.Path); ok {
				c.report.Named = append(c.report.Named, Item{Root: rp.Name, Source: rp.Source, Path: changed, Action: HookRuns, Why: n.Hook + " runs " + n.Path})
			}
		}
	}
	return c.report
}

// CheckSince is Check for what changed since a later moment than the
// plan's start: what one command of a persistent sandbox changed.
func (p Plan) CheckSince(quarantine string, since time.Time) Report {
	p.Started = since.Add(-clockSlack)
	return p.Check(quarantine)
}

// Sweep judges a root as Check does, for what changed since: it is for
// what a changeset apply wrote, where no surface was held (the apply is
// the user's, but what it writes is the sandbox's).
func Sweep(root Root, since time.Time, quarantine, id string) Report {
	c := &checker{since: since.Add(-clockSlack), quarantine: filepath.Join(quarantine, id)}
	c.sweep(root, nil)
	return c.report
}

type checker struct {
	since      time.Time
	quarantine string
	report     Report
}

func (c *checker) fail(err error) { c.report.Errors = append(c.report.Errors, err) }

func (c *checker) did(r Root, rel, action, why, where string) {
	c.report.Items = append(c.report.Items, Item{Root: r.Name, Source: r.Source, Path: rel, Action: action, Why: why, Where: where})
}

// touched reports whether root/rel changed since the start (its inode's
// ctime, which no one can set back), or, for a link inside the root, the
// entry it leads to did.
func (c *checker) touched(root, rel string) bool {
	st, err := lstat(root, rel)
	if err != nil {
		return false
	}
	if !st.ctime.Before(c.since) {
		return true
	}
	if st.mode&fs.ModeSymlink != 0 {
		if target, ok := resolveLink(root, rel); ok {
			if tst, err := lstat(root, target); err == nil && !tst.ctime.Before(c.since) {
				return true
			}
		}
	}
	return false
}

// resolveLink follows the link root/rel inside the root (at most 40 links)
// and returns where it leads, relative to the root; ok is false when it
// leaves the root or does not resolve.
func resolveLink(root, rel string) (string, bool) {
	cur := rel
	for range 40 {
		st, err := lstat(root, cur)
		if err != nil {
			return "", false
		}
		if st.mode&fs.ModeSymlink == 0 {
			return cur, true
		}
		target, err := os.Readlink(filepath.Join(root, cur))
		if err != nil || filepath.IsAbs(target) {
			return "", false
		}
		next := path.Join(path.Dir(cur), filepath.ToSlash(target))
		if next == ".." || strings.HasPrefix(next, "../") {
			return "", false
		}
		cur = next
	}
	return "", false
}

// putAside moves root/rel into the quarantine.
func (c *checker) putAside(r Root, rel, why string) {
	dest, err := c.destination(r, rel)
	if err == nil {
		err = moveOut(r.Source, rel, dest)
	}
	if err != nil {
		c.fail(fmt.Errorf("putting aside %s: %w", filepath.Join(r.Source, rel), err))
		return
	}
	c.did(r, rel, PutAside, why, dest)
}

// destination is a free path for root/rel in the quarantine, its parent made.
func (c *checker) destination(r Root, rel string) (string, error) {
	dest := filepath.Join(c.quarantine, r.Name, filepath.FromSlash(rel))
	if err := os.MkdirAll(filepath.Dir(dest), 0o700); err != nil {
		return "", err
	}
	for i := 1; ; i++ {
		if _, err := os.Lstat(dest); errors.Is(err, fs.ErrNotExist) {
			return dest, nil
		}
		dest = filepath.Join(c.quarantine, r.Name, filepath.FromSlash(rel)) + "." + strconv.Itoa(i)
	}
}

// sweep walks the root, never following a link, and judges every git
// directory (but the protected ones, whose surface the sandbox could not
// change), every .git entry, and the files' setuid bits and device nodes.
// The walk only gathers; the judging follows, in path order.
func (c *checker) sweep(r Root, protected []string) {
	var (
		mu                        sync.Mutex
		gitDirs, dotGits, devices []string
		setIDs                    []string
	)
	err := walkTree(r.Source, func(dir string, entries []entry) {
		var g, d, n, s []string
		for _, e := range entries {
			rel := path.Join(dir, e.name)
			changed := !e.ctime.Before(c.since)
			switch {
			case e.name == "HEAD" && !e.mode.IsDir():
				g = append(g, dir)
			case e.name == ".git" && !e.mode.IsDir() && changed:
				d = append(d, rel)
			case e.mode&fs.ModeDevice != 0 && changed:
				n = append(n, rel)
			case e.mode.IsRegular() && e.mode&(fs.ModeSetuid|fs.ModeSetgid) != 0 && changed:
				s = append(s, rel)
			}
		}
		mu.Lock()
		gitDirs, dotGits, devices, setIDs = append(gitDirs, g...), append(dotGits, d...), append(devices, n...), append(setIDs, s...)
		mu.Unlock()
	})
	if err != nil {
		c.fail(fmt.Errorf("checking %s: %w", r.Source, err))
	}
	for _, list := range [][]string{gitDirs, dotGits, devices, setIDs} {
		slices.Sort(list)
	}
	for _, gd := range gitDirs {
		if !isGitDir(r.Source, gd) {
			continue
		}
		if !slices.Contains(protected, gd) {
			c.gitDir(r, gd)
		}
		c.inProgress(r, gd)
	}
	for _, rel := range dotGits {
		if st, err := lstat(r.Source, rel); err == nil {
			c.dotGit(r, rel, st.mode.Type())
		}
	}
	for _, rel := range devices {
		if err := remove(r.Source, rel); err != nil {
			c.fail(err)
		} else {
			c.did(r, rel, NodeRemoved, "a device node made in the sandbox opens a device of the host", "")
		}
	}
	for _, rel := range setIDs {
		c.setID(r, rel)
	}
}

// setID removes the setuid and setgid bits of a file the sandbox changed:
// run on the host, it would run as its owner (root, when the sandbox ran as
// root on a rootful engine).
func (c *checker) setID(r Root, rel string) {
	st, err := lstat(r.Source, rel)
	if err != nil || st.mode&(fs.ModeSetuid|fs.ModeSetgid) == 0 || st.ctime.Before(c.since) {
		return
	}
	if err := clearSetID(r.Source, rel, st); err != nil {
		c.fail(err)
		return
	}
	c.did(r, rel, SetIDRemoved, "a setuid or setgid file runs as its owner for whoever starts it on the host", "")
}

// dotGit judges a .git file or link the sandbox made or changed: git
// follows it to a git directory, which must be one inside the root (judged
// by the sweep in turn).
func (c *checker) dotGit(r Root, rel string, t fs.FileMode) {
	switch {
	case t&fs.ModeSymlink != 0:
		target, ok := resolveLink(r.Source, rel)
		if !ok || !isGitDir(r.Source, target) {
			c.putAside(r, rel, "a .git link that does not lead to a git directory inside "+r.Name)
		}
	case t.IsRegular():
		dir, ok := gitFileTarget(r.Source, rel)
		if ok && (dir == "" || !isGitDir(r.Source, dir)) {
			c.putAside(r, rel, "a .git file whose gitdir is not a git directory inside "+r.Name)
		}
	}
}

// gitDir judges a git directory the sandbox could change: its
// configuration keeps only what runs nothing, new hooks and links go aside,
// and commondir must lead to a git directory inside the root.
func (c *checker) gitDir(r Root, gd string) {
	if rel := path.Join(gd, "config"); c.touched(r.Source, rel) {
		c.config(r, rel)
	}
	hooks := path.Join(gd, "hooks")
	if st, err := lstat(r.Source, hooks); err == nil {
		switch {
		case st.mode&fs.ModeSymlink != 0 || !st.mode.IsDir():
			if c.touched(r.Source, hooks) {
				c.putAside(r, hooks, "git runs the hooks it finds there")
			}
		default:
			names, err := readDir(r.Source, hooks)
			if err != nil {
				c.fail(err)
			}
			slices.Sort(names)
			for _, n := range names {
				rel := path.Join(hooks, n)
				if !strings.HasSuffix(n, ".sample") && c.touched(r.Source, rel) {
					c.putAside(r, rel, "git runs it as a hook")
				}
			}
		}
	}
	if rel := path.Join(gd, "commondir"); c.touched(r.Source, rel) {
		if target, ok := c.commondir(r, rel); !ok {
			c.putAside(r, rel, "git takes its configuration and hooks from the directory it names"+target)
		}
	}
	if rel := path.Join(gd, "config.worktree"); c.touched(r.Source, rel) {
		c.putAside(r, rel, "git reads it as configuration")
	}
}

// commondir reports whether the commondir file names a git directory
// inside the root.
func (c *checker) commondir(r Root, rel string) (string, bool) {
	data, err := readFile(r.Source, rel)
	if err != nil {
		return "", false
	}
	target := strings.TrimRight(strings.TrimSpace(string(data)), "\r\n")
	var abs string
	if filepath.IsAbs(target) {
		abs = filepath.Clean(target)
	} else {
		abs = filepath.Join(r.Source, path.Dir(rel), target)
	}
	in, ok := fsutil.Rel(r.Source, abs)
	if !ok {
		return " (" + target + ", outside)", false
	}
	return "", isGitDir(r.Source, in)
}

// config keeps a changed configuration's safe settings: the original goes
// into the quarantine, a copy with only what runs nothing takes its place.
func (c *checker) config(r Root, rel string) {
	st, err := lstat(r.Source, rel)
	if err != nil {
		return
	}
	if !st.mode.IsRegular() {
		c.putAside(r, rel, "git reads it as configuration, and it is a "+st.mode.Type().String()+", not a file")
		return
	}
	data, err := readFile(r.Source, rel)
	if err != nil {
		c.putAside(r, rel, "git reads it as configuration, and it cannot be checked: "+err.Error())
		return
	}
	clean, dropped := sanitizeConfig(data)
	if len(dropped) == 0 {
		return
	}
	dest, err := c.destination(r, rel)
	if err == nil {
		err = os.WriteFile(dest, data, 0o600)
	}
	if err == nil {
		err = replaceFile(r.Source, rel, clean, 0o644)
	}
	if err != nil {
		c.fail(fmt.Errorf("cleaning %s: %w", filepath.Join(r.Source, rel), err))
		return
	}
	c.did(r, rel, Cleaned, "it set "+strings.Join(dropped, ", "), dest)
}

// operations are the names under which git keeps an operation left in
// progress (a rebase, am, cherry-pick, revert, merge, bisect or notes
// merge) and reads it back when the operation is continued; names ending
// in "*" are prefixes. What they hold makes git run programs: a merge strategy is
// run as git-merge-NAME, found on PATH or by a path relative to the
// worktree (rebase-merge/strategy, sequencer/opts' options.strategy), a
// rebase's steps run commands (exec), am passes apply-opt to git apply,
// and strategy options go to the strategy.
var operations = []string{
	"rebase-merge", "rebase-apply", "sequencer",
	"MERGE_HEAD", "MERGE_MSG", "MERGE_MODE", "MERGE_AUTOSTASH", "AUTO_MERGE", "SQUASH_MSG",
	"CHERRY_PICK_HEAD", "REVERT_HEAD", "REBASE_HEAD", "BISECT_*", "NOTES_MERGE_*",
}

// inProgress puts aside the state of each operation left in progress in
// the git directory gd that changed while the sandbox ran (made, or any
// file of it written): git on the host never continues an operation with
// what the sandbox wrote. Nothing of it is judged finer: a built-in
// strategy name today may be a program's name for another git, and git
// reads more of an operation's state than any list here would keep up
// with.
func (c *checker) inProgress(r Root, gd string) {
	names, err := readDir(r.Source, gd)
	if err != nil {
		return
	}
	slices.Sort(names)
	for _, n := range names {
		if !isOperation(n) {
			continue
		}
		rel := path.Join(gd, n)
		if changed, ok := c.changedBelow(r.Source, rel); ok {
			why := "git continues the operation left in progress with what it holds (strategies, commands, options)"
			if changed != rel {
				why += "; " + changed + " changed"
			}
			c.putAside(r, rel, why)
		}
	}
}

// isOperation reports whether name is one of git's operations' state.
func isOperation(name string) bool {
	for _, op := range operations {
		if prefix, ok := strings.CutSuffix(op, "*"); ok && strings.HasPrefix(name, prefix) || name == op {
			return true
		}
	}
	return false
}

// maxBelow bounds the entries changedBelow looks at: past it, what is
// left counts as changed.
const maxBelow = 4096

// changedBelow reports whether root/rel, or anything below it, changed
// since the start (never following a link), and the first path found that
// did. A tree too large to look through counts as changed.
func (c *checker) changedBelow(root, rel string) (string, bool) {
	seen := 0
	var visit func(rel string, depth int) (string, bool)
	visit = func(rel string, depth int) (string, bool) {
		seen++
		if c.touched(root, rel) {
			return rel, true
		}
		st, err := lstat(root, rel)
		if err != nil || !st.mode.IsDir() {
			return "", false
		}
		if depth > 16 || seen > maxBelow {
			return rel, true
		}
		names, err := readDir(root, rel)
		if err != nil {
			return rel, true
		}
		slices.Sort(names)
		for _, n := range names {
			if p, ok := visit(path.Join(rel, n), depth+1); ok {
				return p, true
			}
		}
		return "", false
	}
	return visit(rel, 0)
}
