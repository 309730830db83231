package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/docker/compose/v5/pkg/api"
	"github.com/moby/moby/client"
	"github.com/propio/propio-sandbox/internal/backend"
	"github.com/propio/propio-sandbox/internal/diskcap"
)

// ExitDiskCap is the exit code of a sandbox the launcher stopped because
// it wrote more than its disk cap (122 is EDQUOT, "Disk quota exceeded").
const ExitDiskCap = backend.ExitDiskCap

// DiskCapError: the sandbox wrote more than its disk cap to a place the
// launcher watches, and was stopped.
type DiskCapError = backend.DiskCapError

// Places the launcher caps, as messages name them.
const (
	PlaceWorkspace     = backend.PlaceWorkspace
	PlaceChangeset     = backend.PlaceChangeset
	PlaceWritableLayer = backend.PlaceWritableLayer
	PlaceImageVolumes  = backend.PlaceImageVolumes
)

// diskPlan is how the disk cap holds for one sandbox: what the engine
// enforces itself and what the launcher watches.
type diskPlan struct {
	Cap int64
	// StorageOpt: the engine caps the writable layer (storage_opt size).
	StorageOpt string
	// Layer: the launcher watches the writable layer (nil: read-only, or
	// capped by the engine).
	layer *diskcap.Gauge
	// Dirs: the launcher watches the directories the sandbox writes to
	// (rw binds, a changeset's upper directories or volumes), together.
	dirs *diskcap.Gauge
	// ImageVolumes: the launcher watches the volumes the engine makes for
	// the image's VOLUME paths, which no storage option caps.
	imageVolumes *diskcap.Gauge

	procs   *sandboxProcs
	storage Storage
}

// watchLayer is the fallback when the engine refused the storage option
// after all: the launcher watches the writable layer instead.
func (p *diskPlan) watchLayer() {
	p.StorageOpt = ""
	p.layer = p.procs.layerGauge(p.storage)
}

// storageOptRefused tells an engine's refusal of the storage option size
// ("--storage-opt is supported only for overlay over xfs with 'pquota'
// mount option", "Storage Opt size is not supported", a quota it could not
// enable) from other failures to create a container.
func storageOptRefused(err error) bool {
	msg := strings.ToLower(err.Error())
	return strings.Contains(msg, "storage-opt") || strings.Contains(msg, "storage opt") || strings.Contains(msg, "storageopt") || strings.Contains(msg, "quota")
}

// PlanDisk decides how the cap of the project's service holds: the
// writable layer's storage option when the engine can enforce it, and the
// gauges the launcher watches. The launch calls it once the project's
// volumes exist (and a copy's are filled), so that the baselines exclude
// the copy.
func (e *Engine) PlanDisk(ctx context.Context, project *types.Project, d backend.DiskRequest) (*backend.DiskPlan, error) {
	svc, ok := project.Services[d.Service]
	if !ok {
		return nil, fmt.Errorf("project %s has no %s service", project.Name, d.Service)
	}
	svc.Name = d.Service // as the project's key names it
	plan, err := e.planDisk(ctx, project, svc, d.Cap, d.OverlayUppers)
	if err != nil {
		return nil, err
	}
	return &backend.DiskPlan{
		Cap:        plan.Cap,
		StorageOpt: plan.StorageOpt,
		Watch: func(ctx context.Context) *backend.DiskCapError {
			gauges := plan.gauges()
			if len(gauges) == 0 {
				return nil
			}
			if o := diskcap.Watch(ctx, plan.Cap, gauges, diskcap.DefaultTiming, nil); o != nil {
				return plan.overError(o)
			}
			return nil
		},
		WatchLayer: plan.watchLayer,
	}, nil
}

func (e *Engine) planDisk(ctx context.Context, project *types.Project, svc types.ServiceConfig, limit int64, overlayUppers map[string]string) (*diskPlan, error) {
	info, err := e.cachedInfo(ctx)
	if err != nil {
		return nil, err
	}
	st := info.Storage
	w := &sandboxProcs{e: e, project: project.Name, service: svc.Name, local: st.Local, dataDir: info.DataDir}
	plan := &diskPlan{Cap: limit, procs: w, storage: st}

	if !svc.ReadOnly {
		if st.Quota {
			size := limit
			if st.Driver == "btrfs" {
				// A btrfs qgroup counts the image's blocks the layer
				// shares: the sandbox may still write the cap.
				img, err := e.cli.Client().ImageInspect(ctx, svc.Image)
				if err != nil {
					return nil, fmt.Errorf("looking up image %s: %w", svc.Image, err)
				}
				size += img.Size
			}
			plan.StorageOpt = strconv.FormatInt(size, 10)
		} else {
			plan.layer = w.layerGauge(st)
		}
	}

	// The image's VOLUME paths that nothing of the profile covers get
	// volumes of the engine's: watched as the writable layer is.
	vols, err := e.volumesOf(ctx, svc.Image)
	if err != nil {
		return nil, err
	}
	if anon := uncovered(vols, &svc); len(anon) > 0 {
		plan.imageVolumes = w.imageVolumesGauge(anon)
	}

	// The directories it writes to: rw binds, and a changeset's volumes.
	var roots, where []string
	var copies []string // volumes on the engine the launcher cannot read
	name := func(target string) string {
		if target == path.Clean(svc.WorkingDir) {
			return PlaceWorkspace
		}
		return target
	}
	for _, v := range svc.Volumes {
		switch {
		case v.Type == types.VolumeTypeBind && !v.ReadOnly:
			roots = append(roots, v.Source)
			where = append(where, name(v.Target))
		case v.Type == types.VolumeTypeVolume && !v.ReadOnly:
			vol, ok := project.Volumes[v.Source]
			if !ok {
				continue
			}
			if upper, ok := overlayUppers[v.Source]; ok {
				roots = append(roots, upper)
			} else if dir := readableVolume(ctx, e, vol.Name); dir != "" {
				roots = append(roots, dir)
			} else {
				copies = append(copies, vol.Name)
			}
			where = append(where, PlaceChangeset)
		}
	}
	if len(roots)+len(copies) == 0 {
		return plan, nil
	}
	trees := &diskcap.Trees{Roots: diskcap.Static(roots...), Held: w.held(&svc)}
	g := &diskcap.Gauge{What: joinPlaces(where), Size: trees.Size, FS: trees.FS}
	if len(copies) > 0 {
		// Measured by the engine: at intervals, no trigger.
		engineSize := e.volumesSize(copies, false)
		g.FS = nil
		g.Size = func(ctx context.Context) (int64, error) {
			var n int64
			if len(roots) > 0 {
				s, err := trees.Size(ctx)
				if err != nil {
					return 0, err
				}
				n = s
			}
			s, err := engineSize(ctx)
			return n + s, err
		}
	}
	plan.dirs = g
	return plan, nil
}

// overError says what went over.
func (p *diskPlan) overError(o *diskcap.Over) *backend.DiskCapError {
	return &DiskCapError{Cap: p.Cap, Where: o.Gauge.What, Size: o.Size}
}

// gauges are what the launcher watches for the plan.
func (p *diskPlan) gauges() []*diskcap.Gauge {
	var out []*diskcap.Gauge
	for _, g := range []*diskcap.Gauge{p.layer, p.dirs, p.imageVolumes} {
		if g != nil {
			out = append(out, g)
		}
	}
	return out
}

// uncovered are the paths of vols that no mount or tmpfs of the service
// covers: the engine makes a volume of its own for each.
func uncovered(vols []string, svc *types.ServiceConfig) []string {
	covered := map[string]bool{}
	for _, v := range svc.Volumes {
		covered[path.Clean(v.Target)] = true
	}
	for _, t := range svc.Tmpfs {
		dst, _, _ := strings.Cut(t, ":")
		covered[path.Clean(dst)] = true
	}
	var out []string
	for _, v := range vols {
		if !covered[path.Clean(v)] {
			out = append(out, path.Clean(v))
		}
	}
	return out
}

// imageVolumesGauge watches the volumes the engine made for the paths
// anon: walked when the launcher can read them, else measured by the
// engine. All they hold counts, the image's content there (which the
// engine copies in) too: a baseline taken when they are first seen could
// already hold what the sandbox wrote.
func (w *sandboxProcs) imageVolumesGauge(anon []string) *diskcap.Gauge {
	var dirs, names []string
	found := false
	find := func(ctx context.Context) error {
		if found {
			return nil
		}
		id, err := w.container(ctx)
		if err != nil || id == "" {
			return err
		}
		res, err := w.e.cli.Client().ContainerInspect(ctx, id, client.ContainerInspectOptions{})
		if err != nil {
			return fmt.Errorf("inspecting the sandbox's container: %w", err)
		}
		for _, m := range res.Container.Mounts {
			if m.Type == "volume" && slices.Contains(anon, path.Clean(m.Destination)) {
				if readable(m.Source) {
					dirs = append(dirs, m.Source)
				} else {
					names = append(names, m.Name)
				}
			}
		}
		found = true
		return nil
	}
	trees := &diskcap.Trees{FromZero: true, Roots: func(ctx context.Context) ([]string, error) {
		if err := find(ctx); err != nil {
			return nil, err
		}
		return dirs, nil
	}}
	var engineSize func(context.Context) (int64, error)
	return &diskcap.Gauge{What: PlaceImageVolumes, Size: func(ctx context.Context) (int64, error) {
		n, err := trees.Size(ctx)
		if err != nil || len(names) == 0 {
			return n, err
		}
		if engineSize == nil {
			engineSize = w.e.volumesSize(names, true)
		}
		m, err := engineSize(ctx)
		return n + m, err
	}}
}

// readableVolume is the volume's directory on this host when the launcher
// can read it (a local engine, a launcher that is root or owns it), else "".
func readableVolume(ctx context.Context, e *Engine, name string) string {
	res, err := e.cli.Client().VolumeInspect(ctx, name, client.VolumeInspectOptions{})
	if err != nil || res.Volume.Mountpoint == "" {
		return ""
	}
	f, err := os.Open(res.Volume.Mountpoint)
	if err != nil {
		return ""
	}
	defer f.Close()
	if _, err := f.Readdirnames(1); err != nil && !errors.Is(err, io.EOF) {
		return ""
	}
	return res.Volume.Mountpoint
}

// volumesSize measures volumes through the engine's disk usage (which
// walks them on the engine's side): their growth since the first measure,
// or, fromZero, all they hold.
func (e *Engine) volumesSize(names []string, fromZero bool) func(context.Context) (int64, error) {
	var base map[string]int64
	if fromZero {
		base = map[string]int64{}
	}
	return func(ctx context.Context) (int64, error) {
		res, err := e.cli.Client().DiskUsage(ctx, client.DiskUsageOptions{Volumes: true, Verbose: true})
		if err != nil {
			return 0, fmt.Errorf("reading the engine's disk usage: %w", err)
		}
		now := map[string]int64{}
		for _, v := range res.Volumes.Items {
			if slices.Contains(names, v.Name) && v.UsageData != nil {
				now[v.Name] = v.UsageData.Size
			}
		}
		if base == nil {
			base = maps.Clone(now)
		}
		var n int64
		for name, s := range now {
			n += max(0, s-base[name])
		}
		return n, nil
	}
}

// joinPlaces names places in a message: "the workspace and /data".
func joinPlaces(places []string) string {
	var uniq []string
	for _, p := range places {
		if !slices.Contains(uniq, p) {
			uniq = append(uniq, p)
		}
	}
	if len(uniq) <= 1 {
		return strings.Join(uniq, "")
	}
	return strings.Join(uniq[:len(uniq)-1], ", ") + " and " + uniq[len(uniq)-1]
}

// sandboxProcs finds the sandbox's container and its processes, for the
// gauges: once found, the container is remembered.
type sandboxProcs struct {
	e       *Engine
	project string
	service string
	local   bool
	dataDir string // the engine's data directory

	mu      sync.Mutex
	id      string
	looked  time.Time // when the engine was last asked, while there was no container
	initPid int       // the host pid of the container's first process
}

// container is the agent's container id, or "" while it does not exist yet.
// The engine is asked at most every quarter second: the gauges ask often
// while the sandbox starts, and the engine is busy starting it.
func (w *sandboxProcs) container(ctx context.Context) (string, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.id != "" || time.Since(w.looked) < 250*time.Millisecond {
		return w.id, nil
	}
	w.looked = time.Now()
	list, err := w.e.cli.Client().ContainerList(ctx, client.ContainerListOptions{
		All: true,
		Filters: make(client.Filters).Add("label", LabelProject+"="+w.project).
			Add("label", api.ServiceLabel+"="+w.service),
	})
	if err != nil {
		return "", fmt.Errorf("finding the sandbox's container: %w", err)
	}
	if len(list.Items) > 0 {
		w.id = list.Items[0].ID
	}
	return w.id, nil
}

// pids are the host process ids of the sandbox's processes, when the engine
// is on this host; none otherwise. The first is its init's (the engine's
// State.Pid); the others, from the engine's top, only when they are in the
// same pid namespace (an engine may report them as the sandbox sees them,
// which would name the host's own processes).
func (w *sandboxProcs) pids(ctx context.Context) []int {
	if !w.local {
		return nil
	}
	id, err := w.container(ctx)
	if err != nil || id == "" {
		return nil
	}
	initPid := w.init(ctx, id)
	if initPid == 0 {
		return nil
	}
	ns := func(pid int) string {
		link, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid))
		return link
	}
	want := ns(initPid)
	if want == "" {
		return nil // gone, or not ours to look at
	}
	// Every process in the container's pid namespace, read from this
	// host's /proc (the engine's top is no help: Podman's gives the pids
	// inside the container).
	out := []int{initPid}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return out
	}
	for _, e := range entries {
		if n, err := strconv.Atoi(e.Name()); err == nil && n != initPid && ns(n) == want {
			out = append(out, n)
		}
	}
	return out
}

// init is the host pid of the container's first process, asked once.
func (w *sandboxProcs) init(ctx context.Context, id string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.initPid == 0 {
		res, err := w.e.cli.Client().ContainerInspect(ctx, id, client.ContainerInspectOptions{})
		if err == nil && res.Container.State != nil && res.Container.State.Pid > 0 {
			w.initPid = res.Container.State.Pid
		}
	}
	return w.initPid
}

// held is a Trees' Held for the service's directories: files the sandbox
// holds deleted on their file systems, as the host sees them or as the
// sandbox does (an overlay's own device).
func (w *sandboxProcs) held(svc *types.ServiceConfig) func(context.Context, map[uint64]bool) int64 {
	var targets []string
	for _, v := range svc.Volumes {
		if !v.ReadOnly && (v.Type == types.VolumeTypeBind || v.Type == types.VolumeTypeVolume) {
			targets = append(targets, v.Target)
		}
	}
	return func(ctx context.Context, devs map[uint64]bool) int64 {
		pids := w.pids(ctx)
		if len(pids) == 0 {
			return 0
		}
		devs = maps.Clone(devs)
		for _, t := range targets {
			if d, err := diskcap.Dev(fmt.Sprintf("/proc/%d/root%s/.", pids[0], t)); err == nil {
				devs[d] = true
			}
		}
		var n int64
		for _, b := range diskcap.Held(pids, devs) {
			n += b
		}
		return n
	}
}

// layerGauge watches the writable layer: by walking its upper directory
// when the launcher can read the engine's directories (an overlay of a
// local engine, a launcher that is root), else by asking the engine for its
// size (which walks it on the engine's side, and counts bytes of content,
// not blocks).
func (w *sandboxProcs) layerGauge(st Storage) *diskcap.Gauge {
	g := &diskcap.Gauge{What: PlaceWritableLayer}
	if st.Local && (st.Driver == "overlay2" || st.Driver == "overlay") && readable(w.dataDir) {
		var upper string
		roots := func(ctx context.Context) ([]string, error) {
			if upper != "" {
				return []string{upper}, nil
			}
			id, err := w.container(ctx)
			if err != nil || id == "" {
				return nil, err
			}
			res, err := w.e.cli.Client().ContainerInspect(ctx, id, client.ContainerInspectOptions{})
			if err != nil {
				return nil, fmt.Errorf("inspecting the sandbox's container: %w", err)
			}
			if gd := res.Container.GraphDriver; gd != nil {
				if dir := gd.Data["UpperDir"]; dir != "" && readable(dir) {
					upper = dir
				}
			}
			if upper == "" {
				return nil, errNoUpper
			}
			return []string{upper}, nil
		}
		trees := &diskcap.Trees{Roots: roots, FromZero: true, Held: w.rootHeld}
		engineSize := w.layerSize
		g.Size = func(ctx context.Context) (int64, error) {
			s, err := trees.Size(ctx)
			if errors.Is(err, errNoUpper) {
				// Not readable from here: the engine measures it.
				g.FS = nil
				return engineSize(ctx)
			}
			return s, err
		}
		g.FS = trees.FS
		return g
	}
	g.Size = w.layerSize
	return g
}

var errNoUpper = errors.New("the writable layer's directory cannot be read from here")

func readable(dir string) bool {
	f, err := os.Open(dir)
	if err != nil {
		return false
	}
	f.Close()
	return true
}

// layerSize asks the engine the size of the writable layer.
func (w *sandboxProcs) layerSize(ctx context.Context) (int64, error) {
	id, err := w.container(ctx)
	if err != nil || id == "" {
		return 0, err
	}
	res, err := w.e.cli.Client().ContainerInspect(ctx, id, client.ContainerInspectOptions{Size: true})
	if err != nil {
		return 0, fmt.Errorf("reading the sandbox's writable layer size: %w", err)
	}
	var n int64
	if res.Container.SizeRw != nil {
		n = *res.Container.SizeRw
	}
	return n + w.rootHeld(ctx, nil), nil
}

// rootHeld is what the sandbox holds deleted on its root file system.
func (w *sandboxProcs) rootHeld(ctx context.Context, _ map[uint64]bool) int64 {
	pids := w.pids(ctx)
	if len(pids) == 0 {
		return 0
	}
	d, err := diskcap.Dev(fmt.Sprintf("/proc/%d/root/.", pids[0]))
	if err != nil {
		return 0
	}
	return diskcap.Held(pids, map[uint64]bool{d: true})[d]
}
