package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/types"
)

// TestBuildBaseImageMissing: a build that fails while a base image of its
// Dockerfile is not on the engine says which, and how to get it (for the
// default image's base, without a registry too); a build that fails with
// its bases there keeps its own error.
func TestBuildBaseImageMissing(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	dockerfile := "FROM golang:1 AS build\nFROM " + DebianBase + "\nCOPY --from=build /x /x\n"
	if err := os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte(dockerfile), 0o644); err != nil {
		t.Fatal(err)
	}
	svc := types.ServiceConfig{Name: "agent"}
	svc.Image, svc.Build = agentImage, &types.BuildConfig{Context: dir}
	project := &types.Project{Services: types.Services{"agent": svc}}
	failed := errors.New("building example/agent:1: pull access denied")

	f := newFake(t)
	f.images["golang:1"] = true
	f.on["Build"] = func(context.Context) error { return failed }
	err := buildImage(t.Context(), f, project, "agent")
	var base *BaseImageError
	if !errors.As(err, &base) || !errors.Is(err, failed) || strings.Join(base.Images, " ") != DebianBase {
		t.Fatalf("want a BaseImageError for %s wrapping the build's: %v", DebianBase, err)
	}
	hints := strings.Join(base.Hints(), "\n")
	for _, want := range []string{"docker pull " + DebianBase, "bash e2e/base-image.sh"} {
		if !strings.Contains(hints, want) {
			t.Errorf("hints %q lack %q", hints, want)
		}
	}

	f.images[DebianBase] = true
	if err := buildImage(t.Context(), f, project, "agent"); !errors.Is(err, failed) || errors.As(err, &base) {
		t.Errorf("with the base images there, want the build's own error: %v", err)
	}
}
