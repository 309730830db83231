package generator

import (
	"fmt"
	"slices"
	"strings"

	"github.com/compose-spec/compose-go/v2/types"
)

// LabelSnapshot names, on a snapshot's volume, the mount it holds a copy
// of (WorkspaceMount, or mount-<i>).
const LabelSnapshot = "dev.propio-sandbox.snapshot"

// SnapshotVolumeKey is the key, in the project's volumes, of the snapshot
// of the mount name (a remote engine's copy of a directory the sandbox
// only reads).
func SnapshotVolumeKey(name string) string { return "snapshot-" + name }

// snapshotMount returns the read-only mount of a volume that the launch
// fills with a copy of the host directory src before the run (never
// copied back), adding the volume to project: how a remote engine, which
// has none of this host's files, shows the sandbox a directory it reads.
func snapshotMount(project *types.Project, name, src, target string) (types.ServiceVolumeConfig, VolumeCopy) {
	key := SnapshotVolumeKey(name)
	if project.Volumes == nil {
		project.Volumes = types.Volumes{}
	}
	project.Volumes[key] = types.VolumeConfig{
		Name:   project.Name + "-" + key,
		Driver: "local",
		Labels: types.Labels{LabelSnapshot: name},
	}
	return types.ServiceVolumeConfig{
		Type:     types.VolumeTypeVolume,
		Source:   key,
		Target:   target,
		ReadOnly: true,
		// The image's content at the target must never be copied in.
		Volume: &types.ServiceVolumeVolume{NoCopy: true},
	}, VolumeCopy{Volume: key, In: src}
}

// RemoteMountError: the sandbox would mount paths of this host on an
// engine on another machine, which does not have them.
type RemoteMountError struct {
	// Mounts say each such mount: "SOURCE at TARGET (service S)".
	Mounts []string
}

func (e *RemoteMountError) Error() string {
	return fmt.Sprintf("the engine runs on another machine, which has none of this host's files, and the sandbox would mount from this host %s", strings.Join(e.Mounts, ", "))
}

// Hints say what to do about it.
func (e *RemoteMountError) Hints() []string {
	return []string{
		"on a remote engine the workspace and the directories in mode ro or changeset are copied; a hidden file (workspace.hide), a read-only path of the workspace (workspace.readonly), a git repository's guarded paths, PROPIO_SANDBOX_MOUNTS, network.mode allowlist and agent_requests are not done there yet",
		"run it with an engine on this host, or without what the list names",
	}
}

// hostBinds refuses the bind mounts of the project's services: on a remote
// engine they would name paths of another machine.
func hostBinds(project *types.Project) error {
	var binds []string
	for _, name := range project.ServiceNames() {
		for _, v := range project.Services[name].Volumes {
			if v.Type == types.VolumeTypeBind {
				binds = append(binds, fmt.Sprintf("%s at %s (service %s)", v.Source, v.Target, name))
			}
		}
	}
	if len(binds) == 0 {
		return nil
	}
	slices.Sort(binds)
	return &RemoteMountError{Mounts: binds}
}
