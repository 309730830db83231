package generator

import (
	"fmt"
	"maps"
	"path"
	"path/filepath"
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
		"on a remote engine the workspace and the directories in mode ro or changeset are copied there, and so is what the sandbox mounts of them; PROPIO_SANDBOX_MOUNTS, agent_requests, secrets the gateway brokers, network.unlisted: ask and persistent sandboxes (up) are not done there yet",
		"run it with an engine on this host, or without what the list names",
	}
}

// engineSide marks, on a bind mount, a path of the engine's host that
// remoteBinds made (an extension of the bind, which compose renders and
// loads back, and the engine never sees).
const engineSide = "x-propio-sandbox-engine-side"

// hostBinds refuses the bind mounts of this host's paths in the project's
// services: on a remote engine they would name paths of another machine.
func hostBinds(project *types.Project) error {
	var binds []string
	for _, name := range project.ServiceNames() {
		for _, v := range project.Services[name].Volumes {
			if v.Type == types.VolumeTypeBind && (v.Bind == nil || v.Bind.Extensions[engineSide] == nil) {
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

// Keys, in the project's volumes, of the copies of the directories of the
// hidden files' mask and of the account files, on a remote engine.
const (
	MaskVolumeKey     = "files-mask"
	AccountsVolumeKey = "files-accounts"
	ResolvVolumeKey   = "files-resolv"
	// GatewayLogVolumeKey is the allowlist gateway's decision log's.
	GatewayLogVolumeKey = "gateway-log"
)

// addVolume adds the volume key of the project, labelled as svc is.
func addVolume(project *types.Project, svc *types.ServiceConfig, key string) {
	if project.Volumes == nil {
		project.Volumes = types.Volumes{}
	}
	labels := types.Labels{LabelSnapshot: key}
	maps.Copy(labels, svc.Labels)
	project.Volumes[key] = types.VolumeConfig{Name: project.Name + "-" + key, Driver: "local", Labels: labels}
}

// remoteGatewayLog gives the allowlist gateway of a remote engine a volume
// for its decision log, filled from h.RemoteLogs/PROJECT before the run
// and copied back there after it, in place of the host's log directory.
// Without h.RemoteLogs, the log directory stays a host path, for hostBinds
// to refuse.
func remoteGatewayLog(project *types.Project, h Host, copies []VolumeCopy) []VolumeCopy {
	g, ok := project.Services[GatewayService]
	if !ok || h.RemoteLogs == "" {
		return copies
	}
	stage := filepath.Join(h.RemoteLogs, project.Name)
	for i, v := range g.Volumes {
		if v.Type == types.VolumeTypeBind && v.Source == h.LogDir && v.Target == GatewayLogDir {
			addVolume(project, &g, GatewayLogVolumeKey)
			g.Volumes[i] = types.ServiceVolumeConfig{Type: types.VolumeTypeVolume, Source: GatewayLogVolumeKey, Target: GatewayLogDir,
				Volume: &types.ServiceVolumeVolume{NoCopy: true}}
			copies = append(copies, VolumeCopy{Volume: GatewayLogVolumeKey, In: stage, Out: stage})
		}
	}
	project.Services[GatewayService] = g
	return copies
}

// remoteBinds makes the agent's bind mounts of this host's paths, for a
// remote engine (h.Engine.VolumeRoot), bind mounts of the engine's copies
// of them: a path inside a directory copied into a volume (the workspace's
// or a mount's changeset or snapshot: a read-only path, the git guard's)
// is that path in the volume's content, and the mask of hidden files and
// the account files are in volumes filled with a copy of their
// directories (which hold nothing else). It returns copies with those.
// What it cannot place stays, for hostBinds to refuse.
func remoteBinds(project *types.Project, h Host, svc *types.ServiceConfig, copies []VolumeCopy) []VolumeCopy {
	onEngine := func(i int, key, rel string) {
		svc.Volumes[i].Source = path.Join(h.Engine.VolumeRoot, project.Volumes[key].Name, "_data", filepath.ToSlash(rel))
		// Marked for hostBinds: the engine's path, not this host's.
		if svc.Volumes[i].Bind == nil {
			svc.Volumes[i].Bind = &types.ServiceVolumeBind{}
		}
		svc.Volumes[i].Bind.Extensions = types.Extensions{engineSide: true}
	}
	type root struct{ dir, key string }
	var roots []root
	for _, v := range svc.Volumes {
		if v.Type != types.VolumeTypeVolume {
			continue
		}
		for _, c := range copies {
			if c.Volume == v.Source {
				roots = append(roots, root{c.In, c.Volume})
			}
		}
		if cs := h.Changeset; cs != nil {
			for _, m := range cs.Mounts {
				if ChangesetVolumeKey(m.Name) == v.Source {
					roots = append(roots, root{m.Source, v.Source})
				}
			}
		}
	}
	// The deepest first: a mount inside another's directory is its own.
	slices.SortFunc(roots, func(a, b root) int { return len(b.dir) - len(a.dir) })
	dirs := map[string]string{} // a directory of host files: the key of the volume of its copy
	if h.EmptyFile != "" {
		dirs[filepath.Dir(h.EmptyFile)] = MaskVolumeKey
	}
	if h.Passwd != "" && h.Group != "" && filepath.Dir(h.Passwd) == filepath.Dir(h.Group) {
		dirs[filepath.Dir(h.Passwd)] = AccountsVolumeKey
	}
	if h.ResolvDir != "" {
		dirs[h.ResolvDir] = ResolvVolumeKey
	}
	used := map[string]string{} // volume key: the host directory copied
	for i, v := range svc.Volumes {
		if v.Type != types.VolumeTypeBind {
			continue
		}
		if key, ok := dirs[filepath.Dir(v.Source)]; ok {
			if _, made := used[key]; !made {
				used[key] = filepath.Dir(v.Source)
				addVolume(project, svc, key)
				copies = append(copies, VolumeCopy{Volume: key, In: filepath.Dir(v.Source)})
			}
			onEngine(i, key, filepath.Base(v.Source))
			continue
		}
		for _, r := range roots {
			if rel, err := filepath.Rel(r.dir, v.Source); err == nil && rel != ".." && !strings.HasPrefix(rel, "../") && rel != "." {
				onEngine(i, r.key, rel)
				break
			}
		}
	}
	return copies
}
