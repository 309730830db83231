package engine_test

import (
	"testing"

	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/engine"
)

func TestFactsOf(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		kind     string
		rootless bool
		want     generator.EngineFacts
	}{
		"docker":          {engine.Docker, false, generator.EngineFacts{}},
		"auto is docker":  {engine.Auto, false, generator.EngineFacts{}},
		"podman":          {engine.Podman, false, generator.EngineFacts{TmpfsU: true, TmpfsCopyUp: true, NamesHost: true, UserSpaceGateway: true}},
		"rootless podman": {engine.Podman, true, generator.EngineFacts{TmpfsU: true, TmpfsCopyUp: true, NamesHost: true, KeepID: true, UserSpaceGateway: true}},
	} {
		if got := engine.FactsOf(tc.kind, tc.rootless); got != tc.want {
			t.Errorf("%s: %+v, want %+v", name, got, tc.want)
		}
	}
}
