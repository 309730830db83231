// Package buildinputs finds what an image build reads that an agent could
// have changed, so that trust can cover it: the Dockerfile, the .dockerignore
// files that may apply (present or not: creating one later is a change), and
// the context files the Dockerfile's COPY and ADD instructions name
// literally, which are what RUN steps typically execute (setup scripts, a
// package.json whose lifecycle scripts npm ci runs). Directories and
// wildcards copied are not recorded: every edit of a source file would need
// trust again.
//
// It reads files, never blocking on one (a FIFO, a device), and never
// follows a link out of the build context; it never talks to an engine.
package buildinputs

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/propio/propio-sandbox/internal/fsutil"
)

// ErrUntrusted is returned (wrapped) when build inputs are new or changed
// since they were trusted.
var ErrUntrusted = errors.New("the build is not trusted")

// MaxDockerfile bounds the Dockerfile and .dockerignore files read.
const MaxDockerfile = 4 << 20

// Roles of the files of a build.
const (
	RoleDockerfile = "dockerfile"
	RoleIgnore     = "dockerignore"
	RoleCopy       = "copy"
)

// File is one file a build reads, and what it was when collected.
type File struct {
	Role string `json:"role"`
	Path string `json:"path"` // absolute
	// State is "sha256:HEX" for a regular file's content, "absent",
	// "symlink:TARGET" (with " sha256:HEX" when it leads to a regular file
	// in the context), "outside the context" for a path whose links lead
	// out of it (not read), or "not a regular file: KIND".
	State string `json:"state"`
}

// Inputs are the files a build reads that trust covers.
type Inputs struct {
	Context    string `json:"context"`
	Dockerfile string `json:"dockerfile"`
	Files      []File `json:"files"`
}

// Paths are a build's context and Dockerfile, absolute.
type Paths struct {
	Context, Dockerfile string
}

// InWorkspace reports whether the build's inputs are files the agent can
// change: the Dockerfile is in the workspace, or the context and the
// workspace overlap (one holds the other); by their paths as given, or
// with links resolved (a link in the workspace leads where the agent chose).
func (p Paths) InWorkspace(workspace string) bool {
	ctx, _ := fsutil.Resolve(p.Context)
	df, _ := fsutil.Resolve(p.Dockerfile)
	for _, c := range []string{filepath.Clean(p.Context), ctx} {
		if fsutil.Within(workspace, c) || fsutil.Within(c, workspace) {
			return true
		}
	}
	return fsutil.Within(workspace, filepath.Clean(p.Dockerfile)) || fsutil.Within(workspace, df)
}

// Collect reads the build's inputs as they are now. A Dockerfile or
// .dockerignore that is there but not a regular file is an error, as the
// build would hang on it or fail; a missing one is recorded as absent.
func Collect(p Paths) (*Inputs, error) {
	in := &Inputs{Context: filepath.Clean(p.Context), Dockerfile: filepath.Clean(p.Dockerfile)}
	data, err := fsutil.ReadRegular(in.Dockerfile, MaxDockerfile)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		in.Files = append(in.Files, File{RoleDockerfile, in.Dockerfile, "absent"})
	case err != nil:
		return nil, fmt.Errorf("reading the Dockerfile: %s %s", in.Dockerfile, fsutil.Problem(err))
	default:
		in.Files = append(in.Files, File{RoleDockerfile, in.Dockerfile, digestOf(data)})
	}
	for _, ignore := range []string{filepath.Join(in.Context, ".dockerignore"), in.Dockerfile + ".dockerignore"} {
		b, err := fsutil.ReadRegular(ignore, MaxDockerfile)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			in.Files = append(in.Files, File{RoleIgnore, ignore, "absent"})
		case err != nil:
			return nil, fmt.Errorf("reading %s: it %s", ignore, fsutil.Problem(err))
		default:
			in.Files = append(in.Files, File{RoleIgnore, ignore, digestOf(b)})
		}
	}
	realCtx, _ := fsutil.Resolve(in.Context)
	for _, src := range Sources(data) {
		path := filepath.Join(in.Context, filepath.FromSlash(src))
		state, record, err := copied(realCtx, path)
		if err != nil {
			return nil, err
		}
		if record {
			in.Files = append(in.Files, File{RoleCopy, path, state})
		}
	}
	return in, nil
}

// copied says what a COPY or ADD source is, and whether trust records it
// (not a directory).
func copied(realCtx, path string) (state string, record bool, err error) {
	st, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ENOTDIR):
		// A part of its path may be a link out of the context.
		if r, _ := fsutil.Resolve(path); !fsutil.Within(realCtx, r) {
			return "outside the context", true, nil
		}
		return "absent", true, nil
	case err != nil:
		return "", false, fmt.Errorf("reading %s, which the Dockerfile copies: %w", path, err)
	}
	r, _ := fsutil.Resolve(path)
	if st.Mode()&fs.ModeSymlink != 0 {
		target, err := os.Readlink(path)
		if err != nil {
			return "", false, fmt.Errorf("reading %s, which the Dockerfile copies: %w", path, err)
		}
		state = "symlink:" + target
		rst, err := os.Stat(r)
		switch {
		case err != nil || !fsutil.Within(realCtx, r):
			return state, true, nil
		case rst.IsDir():
			return state, true, nil
		}
		sum, kind, err := hashFile(r)
		if err != nil {
			return "", false, err
		}
		if kind != "" {
			return state + " " + kind, true, nil
		}
		return state + " " + sum, true, nil
	}
	if !fsutil.Within(realCtx, r) {
		return "outside the context", true, nil // a directory of its path is a link out
	}
	if st.IsDir() {
		return "", false, nil
	}
	sum, kind, err := hashFile(path)
	if err != nil {
		return "", false, err
	}
	if kind != "" {
		return kind, true, nil
	}
	return sum, true, nil
}

// hashFile returns the digest of a regular file's content, or the kind of
// file it is when it is not one (without opening it).
func hashFile(path string) (sum, kind string, err error) {
	f, err := fsutil.OpenRegular(path)
	var nr *fsutil.NotRegularError
	if errors.As(err, &nr) {
		return "", "not a regular file: " + nr.Kind, nil
	}
	if err != nil {
		return "", "", fmt.Errorf("reading %s, which the Dockerfile copies: it %s", path, fsutil.Problem(err))
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", "", fmt.Errorf("reading %s, which the Dockerfile copies: %w", path, err)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), "", nil
}

func digestOf(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Key is the name trust records the build's digest under: the Dockerfile.
func (in *Inputs) Key() string { return "build:" + in.Dockerfile }

// Manifest is what the digest covers, as JSON: the context, the
// Dockerfile, and every file with its state. Trust keeps it, so that a later
// change can be told file by file.
func (in *Inputs) Manifest() []byte {
	files := slices.Clone(in.Files)
	slices.SortStableFunc(files, func(a, b File) int { return strings.Compare(a.Path, b.Path) })
	b, _ := json.MarshalIndent(Inputs{Context: in.Context, Dockerfile: in.Dockerfile, Files: files}, "", "  ")
	return append(b, '\n')
}

// Digest is the hex SHA-256 of the manifest.
func (in *Inputs) Digest() string {
	sum := sha256.Sum256(in.Manifest())
	return hex.EncodeToString(sum[:])
}

// name shows a path of the build for people: relative to the context when
// it is inside.
func (in *Inputs) name(path string) string {
	if rel, err := filepath.Rel(in.Context, path); err == nil && !strings.HasPrefix(rel, "../") {
		return rel
	}
	return path
}

// Show names a file of the build for people, with what it is.
func (in *Inputs) Show(f File) string {
	name := in.name(f.Path)
	state := f.State
	if h, ok := strings.CutPrefix(state, "sha256:"); ok && len(h) > 12 {
		state = "sha256 " + h[:12]
	}
	return name + " (" + state + ")"
}

// Changes describes how the build's inputs differ from those of an earlier
// manifest, file by file; nil when the manifest cannot be read.
func (in *Inputs) Changes(earlier []byte) []string {
	var old Inputs
	if err := json.Unmarshal(earlier, &old); err != nil {
		return nil
	}
	var out []string
	if old.Context != in.Context {
		out = append(out, "the build context is now "+in.Context+" (it was "+old.Context+")")
	}
	was := map[string]File{}
	for _, f := range old.Files {
		was[f.Path] = f
	}
	for _, f := range in.Files {
		o, ok := was[f.Path]
		delete(was, f.Path)
		name := in.name(f.Path)
		switch {
		case !ok && f.Role == RoleCopy:
			out = append(out, name+" is newly copied by the Dockerfile")
		case !ok:
			out = append(out, name+" is newly read")
		case o.State == f.State:
		case o.State == "absent":
			out = append(out, name+" was created")
		case f.State == "absent":
			out = append(out, name+" was removed")
		default:
			out = append(out, name+" changed")
		}
	}
	for _, o := range old.Files {
		if _, gone := was[o.Path]; gone {
			out = append(out, in.name(o.Path)+" is no longer copied")
		}
	}
	return out
}

// Record is what a trust store answers about a key: the digest trusted
// under it and the manifest kept with it (nil when not kept).
type Record struct {
	Digest   string
	Manifest []byte
}

// Verify returns nil when in is trusted as recorded (found says whether
// anything was), and an error wrapping ErrUntrusted that says what changed
// otherwise.
func (in *Inputs) Verify(rec Record, found bool) error {
	switch {
	case !found:
		return fmt.Errorf("the build of %s is new (it reads %s): %w", in.Dockerfile, in.list(), ErrUntrusted)
	case rec.Digest == in.Digest():
		return nil
	}
	changes := in.Changes(rec.Manifest)
	if len(changes) == 0 {
		return fmt.Errorf("the build of %s changed since it was trusted (it reads %s): %w", in.Dockerfile, in.list(), ErrUntrusted)
	}
	return fmt.Errorf("the build of %s changed since it was trusted: %s: %w", in.Dockerfile, strings.Join(changes, "; "), ErrUntrusted)
}

// list names the files of the build, relative to the context.
func (in *Inputs) list() string {
	var names []string
	for _, f := range in.Files {
		if f.State != "absent" || f.Role == RoleCopy {
			names = append(names, in.name(f.Path))
		}
	}
	return strings.Join(names, ", ")
}
