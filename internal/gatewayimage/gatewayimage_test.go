package gatewayimage_test

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/propio/propio-sandbox/internal/gatewayimage"
)

// build compiles a tiny program, with cgo or without.
func build(t *testing.T, cgo bool) string {
	t.Helper()
	dir := t.TempDir()
	src := "package main\nimport (\"fmt\"; \"os/user\")\nfunc main() { u, _ := user.Current(); fmt.Println(u != nil) }\n"
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module x\ngo 1.22\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "build", "-o", "prog", ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOFLAGS=")
	if cgo {
		if _, err := exec.LookPath("gcc"); err != nil {
			t.Skip("no C compiler here to build a dynamically linked program")
		}
		cmd.Env = append(cmd.Env, "CGO_ENABLED=1")
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	return filepath.Join(dir, "prog")
}

func TestStaticBinaryIsAlone(t *testing.T) {
	exe := build(t, false)
	files, err := gatewayimage.Files(exe)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 1 || files[gatewayimage.Binary] != exe {
		t.Fatalf("files = %v, want only the binary", files)
	}
}

func TestDynamicBinaryBringsItsLibraries(t *testing.T) {
	exe := build(t, true)
	files, err := gatewayimage.Files(exe)
	if err != nil {
		t.Fatal(err)
	}
	var interp, libc bool
	for dst, src := range files {
		if strings.Contains(dst, "ld-linux") || strings.Contains(dst, "ld-musl") {
			interp = true
		}
		if strings.Contains(filepath.Base(dst), "libc.") {
			libc = true
		}
		if _, err := os.Stat(src); err != nil {
			t.Errorf("%s comes from %s: %v", dst, src, err)
		}
	}
	if !interp || !libc {
		t.Fatalf("files = %v, want the interpreter and libc", files)
	}
}

func TestContextHasDockerfileAndRootfs(t *testing.T) {
	exe := build(t, false)
	r, err := gatewayimage.Context(exe)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(r)
	got := map[string]string{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		got[h.Name] = string(b)
	}
	if !strings.HasPrefix(got["Dockerfile"], "FROM scratch\n") || !strings.Contains(got["Dockerfile"], `ENTRYPOINT ["/propio-sandbox"]`) {
		t.Errorf("Dockerfile = %q", got["Dockerfile"])
	}
	want, _ := os.ReadFile(exe)
	if got["rootfs/propio-sandbox"] != string(want) {
		t.Errorf("rootfs/propio-sandbox is not the binary (%d bytes, want %d)", len(got["rootfs/propio-sandbox"]), len(want))
	}
}

func TestTagFollowsContent(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	os.WriteFile(a, []byte("one"), 0o755)
	os.WriteFile(b, []byte("two"), 0o755)
	ta, err := gatewayimage.Tag(a)
	if err != nil {
		t.Fatal(err)
	}
	tb, _ := gatewayimage.Tag(b)
	ta2, _ := gatewayimage.Tag(a)
	if ta == tb || ta != ta2 || !strings.HasPrefix(ta, gatewayimage.Repository+":") {
		t.Fatalf("tags %q %q %q", ta, tb, ta2)
	}
}

func TestNotLinux(t *testing.T) {
	f := filepath.Join(t.TempDir(), "script")
	os.WriteFile(f, []byte("#!/bin/sh\n"), 0o755)
	if _, err := gatewayimage.Files(f); !errors.Is(err, gatewayimage.ErrNotLinux) {
		t.Fatalf("err = %v, want ErrNotLinux", err)
	}
}

func TestCachedTag(t *testing.T) {
	dir := t.TempDir()
	exe, cache := filepath.Join(dir, "exe"), filepath.Join(dir, "state", "gateway-tag")
	os.WriteFile(exe, []byte("one"), 0o755)
	want, _ := gatewayimage.Tag(exe)
	for range 2 { // computed, then from the cache
		if got, err := gatewayimage.CachedTag(exe, cache); err != nil || got != want {
			t.Fatalf("CachedTag = %q, %v; want %q", got, err, want)
		}
	}
	if _, err := os.Stat(cache); err != nil {
		t.Fatalf("no cache written: %v", err)
	}
	// A new binary at the same path (another size): a new tag.
	os.WriteFile(exe, []byte("three"), 0o755)
	want2, _ := gatewayimage.Tag(exe)
	if got, _ := gatewayimage.CachedTag(exe, cache); got != want2 || got == want {
		t.Fatalf("after a rebuild CachedTag = %q, want %q", got, want2)
	}
	// A cache that cannot be written only costs the reading.
	if got, err := gatewayimage.CachedTag(exe, filepath.Join(exe, "not-a-dir", "cache")); err != nil || got != want2 {
		t.Fatalf("unwritable cache: %q, %v", got, err)
	}
}
