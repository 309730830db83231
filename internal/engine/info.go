package engine

import (
	"context"
	"fmt"
	"github.com/propio/propio-sandbox/internal/backend"
	"net"
	"sort"
	"strconv"
	"strings"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"
)

// Info is what the engine says of itself (backend.Info).
type Info = backend.Info

// Info reads the engine's architecture, data directory and runtimes: as
// the engine last said them, when its process and configuration are the
// same since (infocache.go), unless FreshInfo.
func (e *Engine) Info(ctx context.Context) (Info, error) {
	if !e.FreshInfo {
		if in, ok := cachedEngineInfo(e.Host, e.identity); ok && in.Kind == e.Kind {
			in.Context, in.ContextFrom = e.Context, e.ContextFrom
			in.Rootless = in.Rootless || e.Rootless
			e.infoMu.Lock()
			e.info = &in
			e.infoMu.Unlock()
			return in, nil
		}
	}
	res, err := e.cli.Client().Info(ctx, client.InfoOptions{})
	if err != nil {
		return Info{}, fmt.Errorf("reading the engine's info: %w", err)
	}
	in := Info{
		Kind:           e.Kind,
		Version:        res.Info.ServerVersion,
		Host:           e.Host,
		Context:        e.Context,
		ContextFrom:    e.ContextFrom,
		Arch:           NormalizeArch(res.Info.Architecture),
		DataDir:        res.Info.DockerRootDir,
		DefaultRuntime: res.Info.DefaultRuntime,
	}
	for name := range res.Info.Runtimes {
		in.Runtimes = append(in.Runtimes, name)
	}
	sort.Strings(in.Runtimes)
	for _, o := range res.Info.SecurityOptions {
		if strings.Contains(o, "rootless") {
			in.Rootless = true
		}
	}
	// Podman's compatible info does not say it runs rootless; its own did.
	in.Rootless = in.Rootless || e.Rootless
	in.DockerDesktop = strings.Contains(res.Info.OperatingSystem, "Docker Desktop")
	in.Storage = storageOf(res.Info, e.Kind, e.Host)
	in.Remote, in.RemoteWhy = remoteOf(res.Info, e.Host)
	in.CPUs, in.Memory = float64(res.Info.NCPU), res.Info.MemTotal
	if in.Rootless && res.Info.CgroupVersion == "1" {
		in.LimitsIgnored = "a rootless engine on cgroups v1 cannot set a container's memory, pids or CPU limits"
	}
	if in.Remote {
		// What the engine's containers publish changes from launch to
		// launch: never kept (an engine elsewhere is not named anyway).
		if in.Published, err = e.published(ctx); err != nil {
			return Info{}, err
		}
	} else {
		keepEngineInfo(e.identity, in)
	}
	e.infoMu.Lock()
	e.info = &in
	e.infoMu.Unlock()
	return in, nil
}

// published are the host addresses the engine's containers publish ports
// on, as ADDRESS:PORT/PROTO (0.0.0.0 for all of its addresses).
func (e *Engine) published(ctx context.Context) ([]string, error) {
	res, err := e.cli.Client().ContainerList(ctx, client.ContainerListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing the engine's containers for the ports they publish: %w", err)
	}
	var out []string
	for _, c := range res.Items {
		for _, p := range c.Ports {
			if p.PublicPort != 0 {
				ip := "0.0.0.0"
				if p.IP.IsValid() {
					ip = p.IP.String()
				}
				out = append(out, fmt.Sprintf("%s/%s", net.JoinHostPort(ip, strconv.Itoa(int(p.PublicPort))), p.Type))
			}
		}
	}
	sort.Strings(out)
	return out, nil
}

// cachedInfo is the info read last (preflight reads it before the run), or
// read now.
func (e *Engine) cachedInfo(ctx context.Context) (Info, error) {
	e.infoMu.Lock()
	in := e.info
	e.infoMu.Unlock()
	if in != nil {
		return *in, nil
	}
	return e.Info(ctx)
}

// ImageArch returns the CPU architecture the image ref is built for, in
// image terms, and whether the engine has the image at all.
func (e *Engine) ImageArch(ctx context.Context, ref string) (arch string, found bool, err error) {
	res, err := e.cli.Client().ImageInspect(ctx, ref)
	switch {
	case cerrdefs.IsNotFound(err):
		return "", false, nil
	case err != nil:
		return "", false, fmt.Errorf("looking up image %s: %w", ref, err)
	}
	if res.Config != nil {
		var vols []string
		for v := range res.Config.Volumes {
			vols = append(vols, v)
		}
		sort.Strings(vols)
		e.infoMu.Lock()
		if e.imageVolumes == nil {
			e.imageVolumes = map[string][]string{}
		}
		e.imageVolumes[ref] = vols
		e.infoMu.Unlock()
	}
	return NormalizeArch(res.Architecture), true, nil
}

// volumesOf are the paths the image declares as volumes (VOLUME), as
// ImageArch found them (preflight looks the image up before the run), or
// as the engine says now.
func (e *Engine) volumesOf(ctx context.Context, ref string) ([]string, error) {
	e.infoMu.Lock()
	vols, ok := e.imageVolumes[ref]
	e.infoMu.Unlock()
	if ok {
		return vols, nil
	}
	if _, _, err := e.ImageArch(ctx, ref); err != nil {
		return nil, err
	}
	e.infoMu.Lock()
	defer e.infoMu.Unlock()
	return e.imageVolumes[ref], nil
}

// NormalizeArch names a CPU architecture as images do: the kernel's x86_64
// is amd64, aarch64 is arm64.
func NormalizeArch(arch string) string {
	switch arch {
	case "x86_64", "x86-64":
		return "amd64"
	case "aarch64":
		return "arm64"
	case "armv7l", "armhf":
		return "arm"
	case "i386", "i686":
		return "386"
	}
	return arch
}
