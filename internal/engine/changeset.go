package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/api/types/system"
	"github.com/moby/moby/client"
	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/backend"
	"github.com/propio/propio-sandbox/internal/treetar"
)

// VolumeCopy fills a volume of the project with a host directory before the
// run, and copies the volume's content back to the host after it.
type VolumeCopy = backend.VolumeCopy

// Overlay says whether the engine can mount an overlay of a directory of
// this host for a sandbox, and how.
type Overlay = backend.Overlay

// OverlayCapable tells whether the engine can mount an overlay of a
// directory of this host (a local volume of type overlay): it must run on
// this Linux host (a unix socket, the same host name, not Docker Desktop's
// VM) and as root (not rootless Docker or Podman); and, for a launcher that
// is not root, on Linux 5.11 or newer (userxattr), and not on Podman.
func (e *Engine) OverlayCapable(ctx context.Context) (Overlay, error) {
	no := func(why string) (Overlay, error) { return Overlay{Why: why}, nil }
	if runtime.GOOS != "linux" || !strings.HasPrefix(e.Host, "unix://") {
		_, why := onThisHost(system.Info{}, e.Host)
		return no(why)
	}
	if e.Kind == Podman && e.Rootless {
		return no("a rootless Podman cannot mount an overlay of a host directory")
	}
	if e.Kind == Podman && geteuid() != 0 {
		// Podman mounts a volume's options only for a container that
		// starts, so settleOverlay cannot have the kernel empty the work
		// directory, and what it leaves there is root's.
		return no("Podman leaves root's files in an overlay's work directory, which a launcher that is not root could not remove")
	}
	res, err := e.cli.Client().Info(ctx, client.InfoOptions{})
	if err != nil {
		return Overlay{}, fmt.Errorf("reading the engine's info: %w", err)
	}
	info := res.Info
	if local, why := onThisHost(info, e.Host); !local {
		return no(why)
	}
	for _, o := range info.SecurityOptions {
		if strings.Contains(o, "rootless") {
			return no("a rootless engine cannot mount an overlay of a host directory")
		}
	}
	userXattr := kernelAtLeast(info.KernelVersion, 5, 11)
	if !userXattr && geteuid() != 0 {
		return no(fmt.Sprintf("Linux %s has no overlay option userxattr, without which the overlay's marks are readable by root only", info.KernelVersion))
	}
	return Overlay{OK: true, UserXattr: userXattr}, nil
}

// kernelAtLeast compares a kernel release such as 6.1.0-18-amd64 with
// major.minor.
func kernelAtLeast(release string, major, minor int) bool {
	var a, b int
	if n, _ := fmt.Sscanf(release, "%d.%d", &a, &b); n < 2 {
		return false
	}
	return a > major || a == major && b >= minor
}

// LabelHelperImage names, on a volume, an image the engine has that can
// make the helper containers for it (the sandbox's).
const LabelHelperImage = backend.LabelHelperImage

// CreateVolumes creates the project's own volumes with their labels and
// LabelHelperImage, and marks them external, so that the Compose SDK uses
// them as they are and Remove (by label) removes them.
func (e *Engine) CreateVolumes(ctx context.Context, project *types.Project, helperImage string) error {
	if len(project.Volumes) == 0 {
		return nil
	}
	vols := types.Volumes{}
	for key, v := range project.Volumes {
		if v.External {
			vols[key] = v
			continue
		}
		labels := map[string]string{}
		maps.Copy(labels, v.Labels)
		labels[LabelHelperImage] = helperImage
		name := v.Name
		if name == "" {
			name = project.Name + "_" + key
		}
		if _, err := e.cli.Client().VolumeCreate(ctx, client.VolumeCreateOptions{Name: name, Driver: v.Driver, DriverOpts: v.DriverOpts, Labels: labels}); err != nil {
			return fmt.Errorf("creating volume %s: %w", name, err)
		}
		v.Name = name
		v.External = true
		v.Driver, v.DriverOpts = "", nil
		vols[key] = v
	}
	project.Volumes = vols
	return nil
}

// settleOverlay mounts the overlay volume once more, for a moment, through
// a helper container's archive API: overlayfs empties its work directory
// when it is mounted, and leaves there, when unmounted, what the kernel
// made as root (a whiteout it shares) and a launcher that is not root could
// not remove with the changeset. Remove calls it before it removes an
// overlay volume, with an image of the sandbox's.
func (e *Engine) settleOverlay(ctx context.Context, image string, labels map[string]string, volume string) error {
	id, remove, err := e.helper(ctx, image, volume, labels)
	if err != nil {
		return err
	}
	defer remove()
	if _, err := e.cli.Client().ContainerStatPath(ctx, id, client.ContainerStatPathOptions{Path: copyMount}); err != nil {
		return fmt.Errorf("mounting overlay volume %s again to clean its work directory: %w", volume, err)
	}
	return nil
}

// copyMount is where a helper container sees the volume it copies.
const copyMount = "/propio-changeset"

// labelHelper marks a helper container: one that holds a volume of a
// sandbox for a moment, and that whoever made it removes.
const labelHelper = "dev.propio-sandbox.helper"

// helper creates (never starts) a container of image with the volume at
// copyMount, labelled as the sandbox and as a helper, for the engine's
// archive API; remove removes it.
func (e *Engine) helper(ctx context.Context, image, volume string, labels map[string]string) (id string, remove func(), err error) {
	c := e.cli.Client()
	labels = maps.Clone(labels)
	if labels == nil {
		labels = map[string]string{}
	}
	labels[labelHelper] = "true"
	res, err := c.ContainerCreate(ctx, client.ContainerCreateOptions{
		Config: &container.Config{
			Image:      image,
			Entrypoint: []string{"/propio-sandbox-never-started"},
			Labels:     labels,
		},
		HostConfig: &container.HostConfig{
			NetworkMode: "none",
			Mounts:      []mount.Mount{{Type: mount.TypeVolume, Source: volume, Target: copyMount, VolumeOptions: &mount.VolumeOptions{NoCopy: true}}},
		},
	})
	if err != nil {
		return "", nil, fmt.Errorf("creating a container to copy volume %s: %w", volume, err)
	}
	return res.ID, func() {
		rctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c.ContainerRemove(rctx, res.ID, client.ContainerRemoveOptions{Force: true})
	}, nil
}

// CopyIn fills the volume with the directory from, keeping modes, mtimes,
// symbolic links and ownership.
func (e *Engine) CopyIn(ctx context.Context, v backend.Volume, from string) error {
	volume := v.Name
	id, remove, err := e.helper(ctx, v.Image, volume, v.Labels)
	if err != nil {
		return err
	}
	defer remove()
	pr, pw := io.Pipe()
	// Docker skips the metadata of an archive's "." entry, and the volume's
	// root must get the owner and mode of the tree's: the tree goes in under
	// the mount point's own name, from /. Podman writes that into the
	// container's own file system, not the volume: the tree goes in at the
	// mount point, as ".".
	dest, prefix := "/", strings.TrimPrefix(copyMount, "/")
	if e.Kind == Podman {
		dest, prefix = copyMount, "."
	}
	go func() { pw.CloseWithError(treetar.Write(pw, from, prefix)) }()
	_, err = e.cli.Client().CopyToContainer(ctx, id, client.CopyToContainerOptions{DestinationPath: dest, Content: pr})
	pr.CloseWithError(errors.New("copy ended"))
	if err != nil {
		return fmt.Errorf("copying %s into volume %s: %w", from, volume, err)
	}
	return nil
}

// CopyOut replaces the directory to with the volume's content: extracted
// next to it first, then swapped in, so that a failure leaves to as it was.
func (e *Engine) CopyOut(ctx context.Context, v backend.Volume, to string) error {
	volume := v.Name
	id, remove, err := e.helper(ctx, v.Image, volume, v.Labels)
	if err != nil {
		return err
	}
	defer remove()
	res, err := e.cli.Client().CopyFromContainer(ctx, id, client.CopyFromContainerOptions{SourcePath: copyMount + "/."})
	if err != nil {
		return fmt.Errorf("copying volume %s out: %w", volume, err)
	}
	defer res.Content.Close()
	if err := treetar.Replace(res.Content, to); err != nil {
		return fmt.Errorf("copying volume %s out to %s: %w", volume, to, err)
	}
	return nil
}

var geteuid = os.Geteuid

// ErrChangesetInUse: a running sandbox of a live launcher writes to the
// changeset.
var ErrChangesetInUse = backend.ErrChangesetInUse

// ReleaseChangeset makes sure that no sandbox writes to changeset id before
// another run resumes it: the sandboxes of launchers that are gone (killed,
// so their container may still run, its overlay still mounted) are removed
// now; one of a live launcher is ErrChangesetInUse.
func (e *Engine) ReleaseChangeset(ctx context.Context, id string) error {
	vols, err := e.cli.Client().VolumeList(ctx, client.VolumeListOptions{Filters: make(client.Filters).Add("label", generator.LabelChangeset+"="+id)})
	if err != nil {
		return fmt.Errorf("listing volumes: %w", err)
	}
	done := map[string]bool{}
	for _, v := range vols.Items {
		project := v.Labels[LabelProject]
		if project == "" || done[project] {
			continue
		}
		done[project] = true
		if v.Labels[backend.LabelKeep] != "" {
			// A persistent sandbox's, stopped or running: it still writes
			// to it, until down removes it (and gc, once forgotten).
			return fmt.Errorf("persistent sandbox %s writes to changeset %s: %w", project, id, ErrChangesetInUse)
		}
		pid, _ := strconv.Atoi(v.Labels[LabelPID])
		if LauncherAlive(pid, v.Labels[LabelHost]) {
			return fmt.Errorf("sandbox %s (launcher pid %d on %s) writes to changeset %s: %w", project, pid, v.Labels[LabelHost], id, ErrChangesetInUse)
		}
		if err := e.Remove(ctx, project, 0); err != nil {
			return fmt.Errorf("removing sandbox %s of a launcher that is gone: %w", project, err)
		}
	}
	return nil
}
