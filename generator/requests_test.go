package generator_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/profile"
)

// A profile whose agent may ask for mounts gives the agent the mounts
// volume, read-only, labelled as the sandbox's other resources; without
// mount in agent_requests there is none.
func TestMountsVolume(t *testing.T) {
	h := generator.Host{Workspace: "/w", Exists: map[string]bool{}, AgentDir: "/run/user/1/propio-sandbox/agent"}
	for _, on := range []bool{false, true} {
		yaml := "image: x\nagent_requests: [port]\n"
		if on {
			yaml = "image: x\nagent_requests: [port, mount]\n"
		}
		file := filepath.Join(t.TempDir(), "p.yaml")
		if err := os.WriteFile(file, []byte(yaml), 0o644); err != nil {
			t.Fatal(err)
		}
		p, err := profile.Locations{}.Load(file)
		if err != nil {
			t.Fatal(err)
		}
		proj, err := generator.Generate(p, h, generator.Options{Project: project})
		if err != nil {
			t.Fatal(err)
		}
		vol, ok := proj.Volumes[generator.MountsVolumeKey]
		if ok != on {
			t.Fatalf("Mounts %v: volume %s present %v", on, generator.MountsVolumeKey, ok)
		}
		if !on {
			continue
		}
		if vol.Name != generator.MountsVolume(project) || vol.Labels[generator.LabelWorkspace] != "/w" {
			t.Errorf("volume %+v: want name %s and the sandbox's labels", vol, generator.MountsVolume(project))
		}
		found := false
		for _, v := range proj.Services[generator.Service].Volumes {
			if v.Target == generator.MountsTarget {
				found = true
				if v.Source != generator.MountsVolumeKey || !v.ReadOnly {
					t.Errorf("mount %+v: want the volume, read-only", v)
				}
			}
		}
		if !found {
			t.Errorf("no mount at %s", generator.MountsTarget)
		}
	}
}
