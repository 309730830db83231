package launch

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/propio/propio-sandbox/internal/changeset"
)

// LikeRoot gives dir the owner (as root) and mode of the directory src.
func LikeRoot(dir, src string) error {
	st, err := os.Stat(src)
	if err != nil {
		return err
	}
	if os.Geteuid() == 0 {
		if uid, gid, ok := owner(st); ok {
			if err := os.Lchown(dir, uid, gid); err != nil {
				return err
			}
		}
	}
	return os.Chmod(dir, st.Mode()&(fs.ModePerm|fs.ModeSetgid|fs.ModeSticky))
}

func owner(st fs.FileInfo) (uid, gid int, ok bool) {
	s, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, 0, false
	}
	return int(s.Uid), int(s.Gid), true
}

// settleRacyMtimes works around the engine's archive API, which gives the
// copied tree's mtimes to the second only: a file the agent rewrote with
// the same size in the same second as its original's mtime would look
// unchanged. For each file of tree whose whole-second mtime, size and mode
// equal the original's, and whose original was written at or after since
// (a second's margin), the contents are compared: equal, the file gets the
// original's exact mtime; different, an mtime a nanosecond off, so that
// Seal reads it. Older originals cannot have been rewritten in their own
// second during the run.
func settleRacyMtimes(tree, source string, since time.Time) error {
	limit := since.Add(-time.Second).Unix()
	return filepath.WalkDir(tree, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		ti, err := d.Info()
		if err != nil {
			return err
		}
		if ti.ModTime().Nanosecond() != 0 {
			return nil
		}
		rel, _ := filepath.Rel(tree, p)
		orig := filepath.Join(source, rel)
		si, err := os.Lstat(orig)
		if err != nil || !si.Mode().IsRegular() || si.Size() != ti.Size() || si.Mode().Perm() != ti.Mode().Perm() ||
			si.ModTime().Unix() != ti.ModTime().Unix() || si.ModTime().Unix() < limit {
			return nil
		}
		same, err := sameContent(p, orig)
		if err != nil {
			return err
		}
		mtime := si.ModTime()
		if !same {
			mtime = ti.ModTime().Add(time.Nanosecond)
		}
		return os.Chtimes(p, mtime, mtime)
	})
}

func sameContent(a, b string) (bool, error) {
	x, err := os.ReadFile(a)
	if err != nil {
		return false, err
	}
	y, err := os.ReadFile(b)
	if err != nil {
		return false, err
	}
	return bytes.Equal(x, y), nil
}

// SettleCopied makes a copy changeset's trees, copied back after a run that
// started at since, tell Seal what it must read (see settleRacyMtimes):
// for the trees of host paths copied into a sandbox while it ran (an
// agent's mount request with write access).
func SettleCopied(cs *changeset.Changeset, since time.Time) error {
	for _, m := range cs.Mounts {
		if err := settleRacyMtimes(cs.TreeDir(m.Name), m.Source, since); err != nil {
			return fmt.Errorf("reading changeset %s: %w", cs.ID, err)
		}
	}
	return nil
}
