package engine_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/propio/propio-sandbox/internal/engine"
	"github.com/propio/propio-sandbox/internal/testenv"
)

// TestInfo compares what Info and ImageArch say with what the docker CLI
// reports about the same engine.
func TestInfo(t *testing.T) {
	ctx := context.Background()
	eng := connectEngine(t)
	in, err := eng.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out, err := testenv.Docker("info", "--format", "{{.Architecture}}|{{.DockerRootDir}}|{{.DefaultRuntime}}|{{.Driver}}")
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Split(strings.TrimSpace(out), "|")
	if in.Arch != engine.NormalizeArch(want[0]) || in.DataDir != want[1] || in.DefaultRuntime != want[2] || in.Storage.Driver != want[3] || in.Storage.Why == "" {
		t.Errorf("Info = %+v; docker info says %q", in, want)
	}
	if !slices.Contains(in.Runtimes, in.DefaultRuntime) {
		t.Errorf("the default runtime %q is not among %v", in.DefaultRuntime, in.Runtimes)
	}
	arch, found, err := eng.ImageArch(ctx, testenv.ProbeImage)
	if err != nil || !found || arch != in.Arch {
		t.Errorf("ImageArch(probe) = %q, %v, %v; want %q, true", arch, found, err, in.Arch)
	}
	if _, found, err := eng.ImageArch(ctx, "propio-sandbox-e2e/does-not-exist:1"); err != nil || found {
		t.Errorf("ImageArch(missing) = found %v, %v; want not found", found, err)
	}
}

func TestNormalizeArch(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64", "armv7l": "arm", "s390x": "s390x"} {
		if got := engine.NormalizeArch(in); got != want {
			t.Errorf("NormalizeArch(%q) = %q, want %q", in, got, want)
		}
	}
}
