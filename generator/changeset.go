package generator

import (
	"fmt"
	"path"
	"strconv"
	"strings"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/propio/propio-sandbox/internal/profile"
)

// Realisations of a changeset.
const (
	// ChangesetOverlay: the engine mounts an overlay of the source with the
	// changeset's upper and work directories (a local volume of type
	// overlay); the container needs no privilege for it.
	ChangesetOverlay = "overlay"
	// ChangesetCopy: the source is copied into a volume before the run, and
	// the volume's content is copied back into the changeset after it.
	ChangesetCopy = "copy"
)

// WorkspaceMount is the changeset name of the workspace; mounts[i] is
// "mount-<i>".
const WorkspaceMount = "workspace"

// LabelChangeset names, on a changeset's volumes, the changeset and its mount.
const (
	LabelChangeset      = "dev.propio-sandbox.changeset"
	LabelChangesetMount = "dev.propio-sandbox.changeset-mount"
)

// Changeset is the changeset a launch writes to.
type Changeset struct {
	ID     string
	Mode   string // ChangesetOverlay or ChangesetCopy
	Mounts []ChangesetMount
	// UserXattr mounts overlays with the userxattr option: their marks
	// (opaque directories) are then user.overlay.* attributes, which a
	// launcher that is not root can read.
	UserXattr bool
}

// ChangesetMount is one directory of a changeset.
type ChangesetMount struct {
	Name   string // WorkspaceMount, or mount-<i> for mounts[i]
	Source string // the original directory on the host: absolute, symlinks resolved
	Target string // where the sandbox sees it
	// UpperDir and WorkDir are the overlay's directories on the host (overlay only).
	UpperDir, WorkDir string
	// CopyIn and CopyOut are, for a copy, the host directory copied into
	// its volume before the run (the source, or what the last run left),
	// and the one the volume's content replaces after it.
	CopyIn, CopyOut string
}

// extension is the changeset as the x-propio-sandbox extension says it.
func (cs *Changeset) extension() *ExtensionChangeset {
	e := &ExtensionChangeset{ID: cs.ID, Mode: cs.Mode}
	if cs.Mode == ChangesetCopy {
		for _, m := range cs.Mounts {
			e.Copies = append(e.Copies, VolumeCopy{Volume: ChangesetVolumeKey(m.Name), In: m.CopyIn, Out: m.CopyOut})
		}
	}
	return e
}

// ChangesetVolumeKey is the key, in the project's volumes, of the volume
// of a changeset's mount.
func ChangesetVolumeKey(mount string) string { return "changeset-" + mount }

// ChangesetMounts lists the directories of p that are in changeset mode, with
// their names, sources (as the profile says them: the caller resolves
// symlinks) and targets. Optional mounts whose source does not exist are
// left out, as the sandbox leaves them out.
func ChangesetMounts(p *profile.Profile, h Host) []ChangesetMount {
	var out []ChangesetMount
	if p.Workspace.Mode == profile.ModeChangeset {
		out = append(out, ChangesetMount{Name: WorkspaceMount, Source: h.Workspace, Target: path.Clean(p.Workspace.Target)})
	}
	for i, m := range p.Mounts {
		if m.Mode != profile.ModeChangeset {
			continue
		}
		src := MountSource(m, h)
		if !h.Exists[src] && m.Optional {
			continue
		}
		out = append(out, ChangesetMount{Name: "mount-" + strconv.Itoa(i), Source: src, Target: path.Clean(profile.Expand(m.Target, h.Vars()))})
	}
	return out
}

// ChangesetVolume is the name of the volume of a changeset's mount in project.
func ChangesetVolume(project, mount string) string {
	return project + "-changeset-" + mount
}

// changesetMount returns the volume that realises the changeset's mount
// name, adding it to project, or false when the launch has no changeset
// (render and the declared checks): the sandbox then sees the source read-only.
func changesetMount(project *types.Project, h Host, name, target string) (types.ServiceVolumeConfig, bool, error) {
	cs := h.Changeset
	if cs == nil {
		return types.ServiceVolumeConfig{}, false, nil
	}
	var m *ChangesetMount
	for i := range cs.Mounts {
		if cs.Mounts[i].Name == name {
			m = &cs.Mounts[i]
		}
	}
	if m == nil {
		return types.ServiceVolumeConfig{}, false, nil
	}
	key := ChangesetVolumeKey(name)
	vol := types.VolumeConfig{
		Name:   ChangesetVolume(project.Name, name),
		Driver: "local",
		Labels: types.Labels{LabelChangeset: cs.ID, LabelChangesetMount: name},
	}
	switch cs.Mode {
	case ChangesetOverlay:
		for _, d := range []struct{ what, dir string }{{"source", m.Source}, {"upper directory", m.UpperDir}, {"work directory", m.WorkDir}} {
			if err := overlayPath(d.dir); err != nil {
				return types.ServiceVolumeConfig{}, false, fmt.Errorf("changeset %s: the %s %w", name, d.what, err)
			}
		}
		o := "lowerdir=" + m.Source + ",upperdir=" + m.UpperDir + ",workdir=" + m.WorkDir
		if cs.UserXattr {
			o += ",userxattr"
		}
		vol.DriverOpts = map[string]string{"type": "overlay", "device": "overlay", "o": o}
	case ChangesetCopy:
	default:
		return types.ServiceVolumeConfig{}, false, fmt.Errorf("changeset %s: mode %q is neither overlay nor copy", name, cs.Mode)
	}
	if project.Volumes == nil {
		project.Volumes = types.Volumes{}
	}
	project.Volumes[key] = vol
	return types.ServiceVolumeConfig{
		Type:   types.VolumeTypeVolume,
		Source: key,
		Target: target,
		// The image's content at the target must never be copied in.
		Volume: &types.ServiceVolumeVolume{NoCopy: true},
	}, true, nil
}

// ErrOverlayPath is returned for a path the overlay's options cannot carry.
var ErrOverlayPath = fmt.Errorf("cannot be an overlay directory")

// overlayPath refuses a path that overlay options cannot say: the engine
// splits them at commas, and overlayfs splits lower directories at colons.
func overlayPath(p string) error {
	if !path.IsAbs(p) {
		return fmt.Errorf("%q is not absolute: %w", p, ErrOverlayPath)
	}
	if strings.ContainsAny(p, ",:") {
		return fmt.Errorf("%q has a comma or colon, which overlay options cannot hold: %w", p, ErrOverlayPath)
	}
	return nil
}
