// Package gatewayimage makes the allowlist gateway's image from the running
// executable, so it needs no registry and no base image: FROM scratch, the
// propio-sandbox binary as the entrypoint (its `gateway` subcommand is the
// gateway), and, when the binary is dynamically linked, its ELF interpreter
// and the shared libraries it needs, copied from the host at the same paths.
//
// The image is named after the binary's content, so a new build of
// propio-sandbox gets a new gateway image and an old one is never reused.
package gatewayimage

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Repository is the name of the gateway's images; the tag is the binary's digest.
const Repository = "propio-sandbox/gateway"

// Binary is where the executable is in the image.
const Binary = "/propio-sandbox"

// ErrNotLinux is returned for an executable the engine's Linux cannot run.
var ErrNotLinux = errors.New("not a Linux executable")

// Tag is the image name for the executable at exe.
func Tag(exe string) (string, error) {
	f, err := os.Open(exe)
	if err != nil {
		return "", fmt.Errorf("reading the gateway binary: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("reading the gateway binary: %w", err)
	}
	return Repository + ":" + hex.EncodeToString(h.Sum(nil))[:16], nil
}

// CachedTag is Tag, remembered in cacheFile by the executable's path, size
// and modification time, so that a launch does not read the whole binary
// again. A cache that cannot be read or written only costs the reading.
func CachedTag(exe, cacheFile string) (string, error) {
	st, err := os.Stat(exe)
	if err != nil {
		return "", fmt.Errorf("reading the gateway binary: %w", err)
	}
	key := fmt.Sprintf("%s\x00%d\x00%d", exe, st.Size(), st.ModTime().UnixNano())
	if b, err := os.ReadFile(cacheFile); err == nil {
		if k, tag, ok := strings.Cut(string(b), "\n"); ok && k == key && strings.HasPrefix(tag, Repository+":") {
			return tag, nil
		}
	}
	tag, err := Tag(exe)
	if err != nil {
		return "", err
	}
	if os.MkdirAll(filepath.Dir(cacheFile), 0o700) == nil {
		tmp := fmt.Sprintf("%s.%d.tmp", cacheFile, os.Getpid())
		if os.WriteFile(tmp, []byte(key+"\n"+tag), 0o600) == nil {
			os.Rename(tmp, cacheFile)
		}
		os.Remove(tmp)
	}
	return tag, nil
}

// Context returns the build context of the image for exe: a tar stream with
// a Dockerfile, the binary, and the files it needs to run.
func Context(exe string) (io.Reader, error) {
	files, err := Files(exe)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dockerfile := "FROM scratch\nCOPY rootfs/ /\nENTRYPOINT [\"" + Binary + "\"]\n"
	if err := addBytes(tw, "Dockerfile", []byte(dockerfile), 0o644); err != nil {
		return nil, err
	}
	for _, dst := range sortedKeys(files) {
		data, err := os.ReadFile(files[dst])
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", files[dst], err)
		}
		if err := addBytes(tw, "rootfs"+dst, data, 0o755); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return &buf, nil
}

// Files maps each path in the image to the host file that fills it: the
// binary at Binary, and for a dynamically linked binary its interpreter and
// every shared library it needs, transitively.
func Files(exe string) (map[string]string, error) {
	f, err := elf.Open(exe)
	if err != nil {
		return nil, fmt.Errorf("%s: %w (%v)", exe, ErrNotLinux, err)
	}
	defer f.Close()
	files := map[string]string{Binary: exe}
	interp, err := interpreter(f)
	if err != nil || interp == "" {
		return files, err // static: the binary is all
	}
	files[interp] = interp
	dirs := searchDirs(interp)
	queue := []string{exe}
	seen := map[string]bool{}
	for len(queue) > 0 {
		file := queue[0]
		queue = queue[1:]
		lf, err := elf.Open(file)
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", file, err)
		}
		needed, err := lf.ImportedLibraries()
		runpath, _ := lf.DynString(elf.DT_RUNPATH)
		rpath, _ := lf.DynString(elf.DT_RPATH)
		lf.Close()
		if err != nil {
			return nil, fmt.Errorf("reading the libraries %s needs: %w", file, err)
		}
		var extra []string
		for _, list := range append(runpath, rpath...) {
			extra = append(extra, splitPaths(list, file)...)
		}
		for _, lib := range needed {
			if seen[lib] {
				continue
			}
			seen[lib] = true
			path, ok := find(lib, append(extra, dirs...))
			if !ok {
				return nil, fmt.Errorf("%s needs %s, which is not in %s", file, lib, strings.Join(dirs, ", "))
			}
			files[path] = path
			queue = append(queue, path)
		}
	}
	return files, nil
}

// interpreter returns the ELF interpreter a dynamic executable names, or "".
func interpreter(f *elf.File) (string, error) {
	for _, p := range f.Progs {
		if p.Type != elf.PT_INTERP {
			continue
		}
		b, err := io.ReadAll(p.Open())
		if err != nil {
			return "", fmt.Errorf("reading the ELF interpreter: %w", err)
		}
		return strings.TrimRight(string(b), "\x00"), nil
	}
	return "", nil
}

// searchDirs are where the dynamic linker looks for libraries: the
// interpreter's own directory and the usual multiarch and plain ones.
func searchDirs(interp string) []string {
	dirs := []string{filepath.Dir(interp)}
	for _, d := range []string{"/lib", "/usr/lib", "/lib64", "/usr/lib64"} {
		if m, _ := filepath.Glob(d + "/*-linux-gnu*"); len(m) > 0 {
			dirs = append(dirs, m...)
		}
		dirs = append(dirs, d)
	}
	return dirs
}

func splitPaths(list, file string) []string {
	var out []string
	for _, d := range strings.Split(list, ":") {
		if d == "" {
			continue
		}
		out = append(out, strings.ReplaceAll(d, "$ORIGIN", filepath.Dir(file)))
	}
	return out
}

func find(lib string, dirs []string) (string, bool) {
	if filepath.IsAbs(lib) {
		_, err := os.Stat(lib)
		return lib, err == nil
	}
	for _, d := range dirs {
		p := filepath.Join(d, lib)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
			return p, true
		}
	}
	return "", false
}

func addBytes(tw *tar.Writer, name string, data []byte, mode int64) error {
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: mode, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	_, err := tw.Write(data)
	return err
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
