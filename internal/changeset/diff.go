package changeset

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// Changes returns the changes of a sealed changeset that are not applied
// yet, sorted by mount (as listed) then path.
func (c *Changeset) Changes() ([]Change, error) {
	if c.State == StateRunning {
		return nil, fmt.Errorf("changeset %s is not sealed yet: its sandbox is running", c.ID)
	}
	data, err := os.ReadFile(filepath.Join(c.dir, changesFile))
	if err != nil {
		return nil, fmt.Errorf("reading the changes of %s: %w", c.ID, err)
	}
	var doc changesDoc
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("reading the changes of %s: %w", c.ID, err)
	}
	applied, err := c.applied()
	if err != nil {
		return nil, err
	}
	order := map[string]int{}
	for i, m := range c.Mounts {
		order[m.Name] = i
	}
	out := doc.Changes[:0]
	for _, ch := range doc.Changes {
		if !applied[key(ch.Mount, ch.Path)] {
			out = append(out, ch)
		}
	}
	sortChanges(out, order)
	return out, nil
}

func sortChanges(cs []Change, order map[string]int) {
	// Stable by mount order; within a mount Seal wrote them sorted.
	buckets := make([][]Change, len(order)+1)
	for _, ch := range cs {
		i, ok := order[ch.Mount]
		if !ok {
			i = len(order)
		}
		buckets[i] = append(buckets[i], ch)
	}
	cs = cs[:0]
	for _, b := range buckets {
		cs = append(cs, b...)
	}
}

func key(mount, p string) string { return mount + "\x00" + p }

// applied reads the paths an earlier apply finished.
func (c *Changeset) applied() (map[string]bool, error) {
	f, err := os.Open(filepath.Join(c.dir, appliedFile))
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]bool{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the applied paths of %s: %w", c.ID, err)
	}
	defer f.Close()
	done := map[string]bool{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		var p struct{ Mount, Path string }
		if json.Unmarshal(sc.Bytes(), &p) == nil { // a line cut by a kill is skipped
			done[key(p.Mount, p.Path)] = true
		}
	}
	return done, sc.Err()
}

// Ref names a path of a mount, as a filter for Select.
type Ref struct {
	Mount string
	Path  string // slash-separated, relative to the mount; "" = the whole mount
}

// Resolve turns a path given on the command line into a Ref:
//
//   - NAME:PATH, NAME a mount's name ("workspace", "mount-1"): PATH in that mount;
//   - an absolute path under a mount's target in the sandbox (/workspace/src,
//     /repo2/x) or under its source on the host: that mount;
//   - a relative path: relative to cwd when cwd is inside a mount's source
//     (as with git), else relative to the workspace's root.
func (c *Changeset) Resolve(arg, cwd string) (Ref, error) {
	if name, rest, ok := strings.Cut(arg, ":"); ok {
		if _, found := c.Mount(name); found {
			return Ref{name, cleanRel(rest)}, nil
		}
	}
	if filepath.IsAbs(arg) {
		clean := filepath.Clean(arg)
		// The longest matching target or source wins (/repo2 inside /workspace).
		best, bestLen := Ref{}, -1
		for _, m := range c.Mounts {
			for _, root := range []string{m.Target, m.Source} {
				if root == "" {
					continue
				}
				if rel, ok := within(root, clean); ok && len(root) > bestLen {
					best, bestLen = Ref{m.Name, rel}, len(root)
				}
			}
		}
		if bestLen < 0 {
			return Ref{}, fmt.Errorf("%s is in none of the changeset's mounts (%s)", arg, c.mountList())
		}
		return best, nil
	}
	if cwd != "" {
		for _, m := range c.Mounts {
			if rel, ok := within(m.Source, filepath.Join(cwd, arg)); ok {
				return Ref{m.Name, rel}, nil
			}
		}
	}
	rel := cleanRel(arg)
	if rel == ".." || strings.HasPrefix(rel, "../") {
		return Ref{}, fmt.Errorf("%s is outside the workspace", arg)
	}
	return Ref{c.Mounts[0].Name, rel}, nil
}

func (c *Changeset) mountList() string {
	var s []string
	for _, m := range c.Mounts {
		s = append(s, m.Target)
	}
	return strings.Join(s, ", ")
}

// within returns p relative to root, slash-separated, when p is root or below it.
func within(root, p string) (string, bool) {
	root = filepath.Clean(root)
	if p == root {
		return "", true
	}
	prefix := root + string(filepath.Separator)
	if root == string(filepath.Separator) {
		prefix = root
	}
	if strings.HasPrefix(p, prefix) {
		return filepath.ToSlash(p[len(prefix):]), true
	}
	return "", false
}

func cleanRel(p string) string {
	p = path.Clean(filepath.ToSlash(p))
	p = strings.TrimPrefix(p, "/")
	if p == "." {
		return ""
	}
	return p
}

// Select keeps the changes at or under one of refs (all when refs is empty).
func Select(cs []Change, refs []Ref) []Change {
	if len(refs) == 0 {
		return cs
	}
	var out []Change
	for _, ch := range cs {
		for _, r := range refs {
			if ch.Mount == r.Mount && (r.Path == "" || ch.Path == r.Path || strings.HasPrefix(ch.Path, r.Path+"/")) {
				out = append(out, ch)
				break
			}
		}
	}
	return out
}

// Display is how a path of a mount is shown: relative for the workspace,
// the sandbox's absolute path (the mount's target) for other mounts.
func (c *Changeset) Display(mount, p string) string {
	if mount == WorkspaceMount || len(c.Mounts) > 0 && c.Mounts[0].Name == mount {
		return p
	}
	m, _ := c.Mount(mount)
	if p == "" {
		return m.Target
	}
	return path.Join(m.Target, p)
}

// source is the original of a change's path on the host.
func (c *Changeset) source(mount, p string) string {
	m, _ := c.Mount(mount)
	return filepath.Join(m.Source, filepath.FromSlash(p))
}

// result is where the changeset holds the new content of a path.
func (c *Changeset) result(mount, p string) string {
	if c.Mode == ModeCopy {
		return filepath.Join(c.TreeDir(mount), filepath.FromSlash(p))
	}
	full := filepath.Join(c.UpperDir(mount), filepath.FromSlash(p))
	if isMetacopy(full) {
		// Metadata copied up only (metacopy=on): the content is the lower's.
		return c.source(mount, p)
	}
	return full
}

func isMetacopy(p string) bool {
	for _, attr := range []string{"trusted.overlay.metacopy", "user.overlay.metacopy"} {
		if _, err := lgetxattrSize(p, attr); err == nil {
			return true
		}
	}
	return false
}

// FileDiff is one change with what a review shows of it.
type FileDiff struct {
	Change
	Display  string // the path as shown (see Display)
	Binary   bool   // either side is binary: no line diff
	Added    int    // lines added (0 for binary files and directories)
	Removed  int    // lines removed
	Conflict bool   // the original changed since the run started (apply refuses it without --force)

	a, b  [][]byte
	edits []edit
}

// binarySniff is how much of a file is looked at for a NUL byte, as git does.
const binarySniff = 8000

func isBinary(data []byte) bool {
	return bytes.IndexByte(data[:min(len(data), binarySniff)], 0) >= 0
}

// content is what a side shows as text: a file's bytes, a symlink's target
// (without a newline, as git shows it), nothing for a directory.
func content(s Side, file string) ([]byte, error) {
	switch s.Type {
	case TypeFile:
		data, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", file, err)
		}
		return data, nil
	case TypeSymlink:
		return []byte(s.Target), nil
	}
	return nil, nil
}

// Diff computes the line diff of each change: the original as it is now
// against the changeset's result.
func (c *Changeset) Diff(cs []Change) ([]FileDiff, error) {
	out := make([]FileDiff, 0, len(cs))
	for _, ch := range cs {
		fd := FileDiff{Change: ch, Display: c.Display(ch.Mount, ch.Path)}
		st, err := c.status(ch)
		if err != nil {
			return nil, err
		}
		fd.Conflict = st == statusConflict
		before := ch.Before
		if cur, err := lstatEntry(c.source(ch.Mount, ch.Path), ch.Path); err == nil && cur.Type != before.Type && cur.Type != TypeNone && before.Type != TypeNone {
			// The original is no longer what the changeset started from:
			// show what applying would replace.
			before = sideOf(cur)
		}
		a, err := content(before, c.source(ch.Mount, ch.Path))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		b, err := content(ch.After, c.result(ch.Mount, ch.Path))
		if err != nil {
			return nil, err
		}
		if before.Type == TypeFile && isBinary(a) || ch.After.Type == TypeFile && isBinary(b) {
			fd.Binary = true
		} else {
			fd.a, fd.b = splitLines(a), splitLines(b)
			if ch.Kind != KindMode {
				fd.edits = lineDiff(fd.a, fd.b)
				fd.Added, fd.Removed = counts(fd.edits)
			}
		}
		out = append(out, fd)
	}
	return out, nil
}

// gitMode is git's way of writing a type and mode: 100644, 100755, 120000, 040755.
func gitMode(s Side) string {
	switch s.Type {
	case TypeFile:
		if s.Mode&0o111 != 0 {
			return "100755"
		}
		return "100644"
	case TypeSymlink:
		return "120000"
	case TypeDir:
		return fmt.Sprintf("040%03o", s.Mode.Perm())
	}
	return ""
}

// unixMode is the mode as chmod takes it: 0644, 4755.
func unixMode(s Side) string {
	if s.Type == TypeNone {
		return ""
	}
	m := uint32(s.Mode.Perm())
	if s.Mode&fs.ModeSetuid != 0 {
		m |= 0o4000
	}
	if s.Mode&fs.ModeSetgid != 0 {
		m |= 0o2000
	}
	if s.Mode&fs.ModeSticky != 0 {
		m |= 0o1000
	}
	return fmt.Sprintf("%04o", m)
}

// WriteUnified writes the diffs as git-style unified diffs with three lines
// of context. Workspace paths appear as a/PATH and b/PATH; paths of other
// mounts as a/TARGET/PATH. A type change is written as the deletion of the
// old entry then the creation of the new one, as git does. Directories,
// which git does not know, appear as lines of text between the file
// patches ("directory PATH: added, mode 0755"), which git apply skips.
func WriteUnified(w io.Writer, fds []FileDiff) error {
	bw := bufio.NewWriter(w)
	for _, fd := range fds {
		if fd.Kind == KindType {
			del, add := fd, fd
			del.Kind, del.After, del.b = KindDeleted, Side{}, nil
			add.Kind, add.Before, add.a = KindAdded, Side{}, nil
			del.edits = lineDiff(del.a, nil)
			add.edits = lineDiff(nil, add.b)
			if fd.Binary {
				del.edits, add.edits = nil, nil
			}
			writeOne(bw, del)
			writeOne(bw, add)
			continue
		}
		writeOne(bw, fd)
	}
	return bw.Flush()
}

func writeOne(w *bufio.Writer, fd FileDiff) {
	name := strings.TrimPrefix(fd.Display, "/")
	a, b := quoteGit("a/"+name), quoteGit("b/"+name)
	if fd.Before.Type == TypeDir || fd.After.Type == TypeDir {
		// git has no directories: a line of text between the file patches,
		// which git apply and patch pass over.
		dir := quoteGit(fd.Display)
		switch fd.Kind {
		case KindAdded:
			fmt.Fprintf(w, "directory %s: added, mode %s\n", dir, unixMode(fd.After))
		case KindDeleted:
			fmt.Fprintf(w, "directory %s: deleted\n", dir)
		default:
			fmt.Fprintf(w, "directory %s: mode %s -> %s\n", dir, unixMode(fd.Before), unixMode(fd.After))
		}
		return
	}
	fmt.Fprintf(w, "diff --git %s %s\n", a, b)
	switch fd.Kind {
	case KindAdded:
		fmt.Fprintf(w, "new file mode %s\n", gitMode(fd.After))
	case KindDeleted:
		fmt.Fprintf(w, "deleted file mode %s\n", gitMode(fd.Before))
	default:
		if gm, ga := gitMode(fd.Before), gitMode(fd.After); gm != ga || unixMode(fd.Before) != unixMode(fd.After) {
			if gm == ga { // setuid and the like: git cannot say it, chmod can
				gm, ga = unixMode(fd.Before), unixMode(fd.After)
			}
			fmt.Fprintf(w, "old mode %s\nnew mode %s\n", gm, ga)
		}
		if fd.Kind == KindMode {
			return
		}
	}
	from, to := a, b
	if fd.Before.Type == TypeNone {
		from = "/dev/null"
	}
	if fd.After.Type == TypeNone {
		to = "/dev/null"
	}
	if fd.Binary {
		fmt.Fprintf(w, "Binary files %s and %s differ (%d -> %d bytes)\n", from, to, fd.Before.Size, fd.After.Size)
		return
	}
	if len(fd.edits) == 0 {
		return
	}
	// git ends a name holding a space with a tab, for patch(1).
	fmt.Fprintf(w, "--- %s%s\n+++ %s%s\n", from, tabIfSpace(from), to, tabIfSpace(to))
	writeHunks(w, fd.a, fd.b, fd.edits, 3)
}

func tabIfSpace(name string) string {
	if strings.Contains(name, " ") {
		return "\t"
	}
	return ""
}

// quoteGit quotes a path as git does (core.quotePath): in double quotes,
// with C escapes, when it holds a quote, a backslash, a control character
// or a byte outside ASCII; as it is otherwise.
func quoteGit(p string) string {
	needs := false
	for i := 0; i < len(p); i++ {
		if c := p[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' {
			needs = true
			break
		}
	}
	if !needs {
		return p
	}
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(p); i++ {
		switch c := p[i]; c {
		case '"', '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case '\a':
			b.WriteString(`\a`)
		case '\b':
			b.WriteString(`\b`)
		case '\t':
			b.WriteString(`\t`)
		case '\n':
			b.WriteString(`\n`)
		case '\v':
			b.WriteString(`\v`)
		case '\f':
			b.WriteString(`\f`)
		case '\r':
			b.WriteString(`\r`)
		default:
			if c < 0x20 || c >= 0x7f {
				fmt.Fprintf(&b, "\\%03o", c)
			} else {
				b.WriteByte(c)
			}
		}
	}
	b.WriteByte('"')
	return b.String()
}

// WriteStat writes a git-style --stat: one line per changed file or
// symlink (directories are not listed unless their mode changed), a bar
// of + and - scaled to width columns, and a summary line.
func WriteStat(w io.Writer, fds []FileDiff, width int) error {
	if width <= 0 {
		width = 80
	}
	type row struct {
		name, count string
		plus, minus int
	}
	var rows []row
	files, ins, del := 0, 0, 0
	maxName, maxCount, maxChange := 0, 0, 0
	for _, fd := range fds {
		isDir := fd.Before.Type == TypeDir && fd.After.Type != TypeFile && fd.After.Type != TypeSymlink ||
			fd.After.Type == TypeDir && fd.Before.Type != TypeFile && fd.Before.Type != TypeSymlink
		if isDir && fd.Kind != KindMode {
			continue
		}
		files++
		name := fd.Display
		if isDir {
			name += "/"
		}
		r := row{name: quoteGit(name)} // ASCII: a name the sandbox chose may hold a terminal's escape
		if fd.Binary {
			r.count = fmt.Sprintf("Bin %d -> %d bytes", fd.Before.Size, fd.After.Size)
		} else {
			r.count = fmt.Sprint(fd.Added + fd.Removed)
			r.plus, r.minus = fd.Added, fd.Removed
			ins += fd.Added
			del += fd.Removed
			maxChange = max(maxChange, fd.Added+fd.Removed)
			maxCount = max(maxCount, len(r.count))
		}
		maxName = max(maxName, len(r.name))
		rows = append(rows, r)
	}
	if files == 0 {
		return nil // as git: nothing at all
	}
	bw := bufio.NewWriter(w)
	nameW := min(maxName, max(width/2, 20))
	barW := max(width-nameW-maxCount-5, 10)
	for _, r := range rows {
		name := r.name
		if len(name) > nameW {
			name = "..." + name[len(name)-nameW+3:]
		}
		if r.plus+r.minus == 0 && r.count != "0" {
			fmt.Fprintf(bw, " %-*s | %s\n", nameW, name, r.count)
			continue
		}
		p, m := r.plus, r.minus
		if maxChange > barW {
			p, m = scale(p, maxChange, barW), scale(m, maxChange, barW)
		}
		line := fmt.Sprintf(" %-*s | %*s %s%s", nameW, name, maxCount, r.count, strings.Repeat("+", p), strings.Repeat("-", m))
		fmt.Fprintln(bw, strings.TrimRight(line, " "))
	}
	fmt.Fprintf(bw, " %d file%s changed", files, plural(files))
	if ins > 0 || del == 0 {
		fmt.Fprintf(bw, ", %d insertion%s(+)", ins, plural(ins))
	}
	if del > 0 || ins == 0 {
		fmt.Fprintf(bw, ", %d deletion%s(-)", del, plural(del))
	}
	fmt.Fprintln(bw)
	return bw.Flush()
}

// scale shrinks n of total to width columns, keeping at least one for a nonzero n.
func scale(n, total, width int) int {
	if n == 0 {
		return 0
	}
	return max(1, n*width/total)
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// Report is the JSON shape of `diff --json`: fields are only ever added.
type Report struct {
	ID        string       `json:"id"`
	Workspace string       `json:"workspace"`
	Profile   string       `json:"profile"`
	Mode      Mode         `json:"mode"`
	State     State        `json:"state"`
	Mounts    []Mount      `json:"mounts"`
	Files     []ReportFile `json:"files"`
}

// ReportFile is one changed path in a Report.
type ReportFile struct {
	Mount        string `json:"mount"`         // the mount's name: "workspace", "mount-1"
	Path         string `json:"path"`          // relative to the mount's root
	Display      string `json:"display"`       // as diff shows it
	Kind         Kind   `json:"kind"`          // added, modified, deleted, mode, type
	TypeBefore   Type   `json:"type_before"`   // file, dir, symlink; "" when added
	TypeAfter    Type   `json:"type_after"`    // "" when deleted
	ModeBefore   string `json:"mode_before"`   // octal, "0644"; "" when added
	ModeAfter    string `json:"mode_after"`    // "" when deleted
	SizeBefore   int64  `json:"size_before"`   // files only
	SizeAfter    int64  `json:"size_after"`    //
	TargetBefore string `json:"target_before"` // symlinks only
	TargetAfter  string `json:"target_after"`  //
	SHA256Before string `json:"sha256_before"` // the original's content as the run started ("" when unknown)
	SHA256After  string `json:"sha256_after"`  //
	Binary       bool   `json:"binary"`
	Added        int    `json:"added"`   // lines
	Removed      int    `json:"removed"` // lines
	Conflict     bool   `json:"conflict"`
}

// NewReport builds the JSON report of a changeset's diffs.
func (c *Changeset) NewReport(fds []FileDiff) Report {
	r := Report{ID: c.ID, Workspace: c.Workspace, Profile: c.Profile, Mode: c.Mode, State: c.State, Mounts: c.Mounts, Files: []ReportFile{}}
	for _, fd := range fds {
		r.Files = append(r.Files, ReportFile{
			Mount: fd.Mount, Path: fd.Path, Display: fd.Display, Kind: fd.Kind,
			TypeBefore: fd.Before.Type, TypeAfter: fd.After.Type,
			ModeBefore: unixMode(fd.Before), ModeAfter: unixMode(fd.After),
			SizeBefore: fd.Before.Size, SizeAfter: fd.After.Size,
			TargetBefore: fd.Before.Target, TargetAfter: fd.After.Target,
			SHA256Before: fd.Before.SHA256, SHA256After: fd.After.SHA256,
			Binary: fd.Binary, Added: fd.Added, Removed: fd.Removed, Conflict: fd.Conflict,
		})
	}
	return r
}
