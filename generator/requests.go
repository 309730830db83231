package generator

import (
	"path/filepath"
	"slices"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/propio/propio-sandbox/internal/profile"
)

// AgentRequestDir is where the agent's directory (agent_requests) is
// mounted in the agent's container, read-only: the launcher serves
// request.sock there, through which the agent asks the user.
const AgentRequestDir = "/run/propio-sandbox"

// MountRequest is the agent_requests kind that gives the sandbox the
// volume at MountsTarget (ask.KindMount).
const MountRequest = "mount"

// AgentDir is the agent's directory of project under base
// (Host.AgentDir): the launcher makes it and serves request.sock in it. It
// is never the ask directory, which only the launcher and the gateway see.
func AgentDir(base, project string) string { return filepath.Join(base, project) }

// agentRequests mounts the agent's directory at AgentRequestDir when the
// profile lets the agent ask for something, in every network mode, and,
// when it may ask for mounts, the volume at MountsTarget that the launcher
// fills with what the user allowed.
func agentRequests(p *profile.Profile, h Host, project *types.Project, svc *types.ServiceConfig) {
	if len(p.AgentRequests) == 0 || h.AgentDir == "" {
		return
	}
	svc.Volumes = append(svc.Volumes, bind(AgentDir(h.AgentDir, project.Name), AgentRequestDir, true))
	if slices.Contains(p.AgentRequests, MountRequest) {
		svc.Volumes = append(svc.Volumes, mountsVolume(project, MountsVolumeKey, MountsTarget, true),
			mountsVolume(project, WritesVolumeKey, WritesTarget, false))
	}
}

// MountsTarget is where the agent reads what its mount requests copied:
// a volume of the sandbox's own, read-only inside, which the launcher
// fills (when the profile's agent_requests has mount).
const MountsTarget = "/run/propio-sandbox/mounts"

// MountsVolumeKey is the key, in the project, of the volume at
// MountsTarget.
const MountsVolumeKey = "requests-mounts"

// MountsVolume is the engine's name of the project's volume at
// MountsTarget.
func MountsVolume(project string) string { return project + "_" + MountsVolumeKey }

// WritesTarget is where the agent writes to the copies its mount requests
// with write access made: a volume of the sandbox's own, read-write inside,
// which the launcher fills, and copies back into a changeset when the
// sandbox ends (nothing is written to the host path itself).
const WritesTarget = "/run/propio-sandbox/mounts-rw"

// WritesVolumeKey is the key, in the project, of the volume at
// WritesTarget.
const WritesVolumeKey = "requests-mounts-rw"

// mountsVolume adds the volume key to project, and returns the agent's
// mount of it at target.
func mountsVolume(project *types.Project, key, target string, readOnly bool) types.ServiceVolumeConfig {
	if project.Volumes == nil {
		project.Volumes = types.Volumes{}
	}
	project.Volumes[key] = types.VolumeConfig{
		Name:   project.Name + "_" + key,
		Driver: "local",
		Labels: types.Labels{},
	}
	return types.ServiceVolumeConfig{
		Type:     types.VolumeTypeVolume,
		Source:   key,
		Target:   target,
		ReadOnly: readOnly,
		Volume:   &types.ServiceVolumeVolume{NoCopy: true},
	}
}
