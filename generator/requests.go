package generator

import "github.com/compose-spec/compose-go/v2/types"

// MountsTarget is where the agent reads what its mount requests copied:
// a volume of the sandbox's own, read-only inside, which the launcher
// fills (Options.Mounts).
const MountsTarget = "/run/propio-sandbox/mounts"

// MountsVolumeKey is the key, in the project, of the volume at
// MountsTarget.
const MountsVolumeKey = "requests-mounts"

// MountsVolume is the engine's name of the project's volume at
// MountsTarget.
func MountsVolume(project string) string { return project + "_" + MountsVolumeKey }

// mountsVolume adds the volume at MountsTarget to project, and returns
// the agent's read-only mount of it.
func mountsVolume(project *types.Project) types.ServiceVolumeConfig {
	if project.Volumes == nil {
		project.Volumes = types.Volumes{}
	}
	project.Volumes[MountsVolumeKey] = types.VolumeConfig{
		Name:   MountsVolume(project.Name),
		Driver: "local",
		Labels: types.Labels{},
	}
	return types.ServiceVolumeConfig{
		Type:     types.VolumeTypeVolume,
		Source:   MountsVolumeKey,
		Target:   MountsTarget,
		ReadOnly: true,
		Volume:   &types.ServiceVolumeVolume{NoCopy: true},
	}
}
