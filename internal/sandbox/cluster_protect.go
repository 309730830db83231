package sandbox

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/fsutil"
	"github.com/propio/propio-sandbox/internal/treetar"
)

// protectedPaths are the workspace's paths that the sandbox's container
// has mounted read-only over the workspace's volume (hidden, readonly,
// the git guard's), relative to the workspace, with forward slashes.
func protectedPaths(objs *generator.KubeObjects) []string {
	target := ""
	for _, c := range objs.Pod.Spec.InitContainers {
		if c.Name == generator.KubeCopyContainer && len(c.VolumeMounts) > 0 {
			target = c.VolumeMounts[0].MountPath
		}
	}
	var out []string
	for _, c := range objs.Pod.Spec.Containers {
		if c.Name != "sandbox" || target == "" {
			continue
		}
		for _, m := range c.VolumeMounts {
			if !m.ReadOnly {
				continue // a path held, not read-only (the git directory): the sandbox writes there
			}
			if rel, ok := strings.CutPrefix(path.Clean(m.MountPath), target+"/"); ok && rel != "" {
				out = append(out, rel)
			}
		}
	}
	return out
}

// restoreProtected makes each of rels in the tree what it is in the
// original (or absent, as it is there): what the sandbox could not change
// comes back as it went in, whatever the copy out of the Pod says (a
// keeper container the sandbox tampered with could say anything). The
// directories on the way are made real directories of the tree, never
// followed through a link.
func restoreProtected(tree, original string, rels []string) error {
	for _, rel := range rels {
		parts := strings.Split(rel, "/")
		dir := tree
		for _, p := range parts[:len(parts)-1] {
			dir = filepath.Join(dir, p)
			fi, err := os.Lstat(dir)
			if err == nil && fi.IsDir() {
				continue
			}
			if err := os.RemoveAll(dir); err != nil {
				return err
			}
			if err := os.Mkdir(dir, 0o755); err != nil {
				return err
			}
		}
		dst := filepath.Join(tree, filepath.FromSlash(rel))
		if err := os.RemoveAll(dst); err != nil {
			return err
		}
		src := filepath.Join(original, filepath.FromSlash(rel))
		fi, err := os.Lstat(src)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			link, err := os.Readlink(src)
			if err != nil {
				return err
			}
			if err := os.Symlink(link, dst); err != nil {
				return err
			}
			continue
		case fi.Mode().IsRegular():
			if err := copyFileLike(src, dst, fi); err != nil {
				return fmt.Errorf("restoring %s from the original: %w", rel, err)
			}
			continue
		case !fi.IsDir():
			continue // sockets, devices, fifos: not a changeset's
		}
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(treetar.Write(pw, src, ".")) }()
		err = treetar.Extract(pr, dst)
		pr.CloseWithError(errors.New("restore ended"))
		if err != nil {
			return fmt.Errorf("restoring %s from the original: %w", rel, err)
		}
	}
	return nil
}

// copyFileLike copies the regular file src to dst (which must not exist)
// with its mode, modification time and, as root, owner.
func copyFileLike(src, dst string, fi fs.FileInfo) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	if err := fsutil.WriteNew(dst, in); err != nil {
		return err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && os.Geteuid() == 0 {
		if err := os.Lchown(dst, int(st.Uid), int(st.Gid)); err != nil {
			return err
		}
	}
	if err := os.Chmod(dst, fi.Mode().Perm()); err != nil {
		return err
	}
	return os.Chtimes(dst, fi.ModTime(), fi.ModTime())
}
