package cli_test

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/propio/propio-sandbox/internal/changeset"
	"github.com/rogpeppe/go-internal/testscript"
)

// cmdMkChangeset makes a changeset in the script's store as a sandbox run
// would leave it, and sets $CSID to its id:
//
//	mkchangeset [-running] [-profile NAME] WORKSPACE RESULT [DELETED...]
//
// The changeset is in copy mode (no root needed to make whiteouts): its
// tree is WORKSPACE, then RESULT copied over it, then the DELETED paths
// removed; then it is sealed, unless -running.
func cmdMkChangeset(ts *testscript.TestScript, neg bool, args []string) {
	if neg {
		ts.Fatalf("unsupported: ! mkchangeset")
	}
	running, profile := false, "builtin:standard"
	for len(args) > 0 && args[0][0] == '-' {
		switch args[0] {
		case "-running":
			running = true
			args = args[1:]
		case "-profile":
			profile = args[1]
			args = args[2:]
		default:
			ts.Fatalf("mkchangeset: unknown flag %s", args[0])
		}
	}
	if len(args) < 2 {
		ts.Fatalf("usage: mkchangeset [-running] [-profile NAME] WORKSPACE RESULT [DELETED...]")
	}
	ws, err := filepath.EvalSymlinks(ts.MkAbs(args[0]))
	ts.Check(err)
	st := changeset.Store{Dir: filepath.Join(ts.Getenv("XDG_STATE_HOME"), "propio-sandbox", "changesets")}
	c, err := st.Create(ws, profile, changeset.ModeCopy, []changeset.Mount{{Name: changeset.WorkspaceMount, Source: ws, Target: "/workspace"}})
	ts.Check(err)
	tree := c.TreeDir(changeset.WorkspaceMount)
	ts.Check(copyTree(ws, tree))
	ts.Check(copyTree(ts.MkAbs(args[1]), tree))
	for _, d := range args[2:] {
		ts.Check(os.RemoveAll(filepath.Join(tree, d)))
	}
	if !running {
		ts.Check(c.Seal())
	}
	ts.Setenv("CSID", c.ID)
	// Ids carry the time to the second: the next one must differ.
	time.Sleep(time.Until(c.Created.Truncate(time.Second).Add(time.Second)))
}

// copyTree copies src over dst, keeping modes, mtimes and symlinks.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		to := filepath.Join(dst, rel)
		info, err := os.Lstat(p)
		if err != nil {
			return err
		}
		switch {
		case info.IsDir():
			if cur, err := os.Lstat(to); err == nil && !cur.IsDir() {
				os.Remove(to)
			}
			if err := os.MkdirAll(to, 0o755); err != nil {
				return err
			}
			if err := os.Chmod(to, info.Mode().Perm()); err != nil {
				return err
			}
		case info.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			os.RemoveAll(to)
			if err := os.Symlink(target, to); err != nil {
				return err
			}
			return nil
		default:
			os.RemoveAll(to)
			in, err := os.Open(p)
			if err != nil {
				return err
			}
			defer in.Close()
			out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, info.Mode().Perm())
			if err != nil {
				return err
			}
			if _, err := io.Copy(out, in); err != nil {
				out.Close()
				return err
			}
			if err := out.Close(); err != nil {
				return err
			}
			if err := os.Chmod(to, info.Mode().Perm()); err != nil {
				return err
			}
		}
		if err := os.Chtimes(to, info.ModTime(), info.ModTime()); err != nil {
			return fmt.Errorf("chtimes: %w", err)
		}
		return nil
	})
}
