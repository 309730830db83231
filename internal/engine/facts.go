package engine

import (
	"context"

	"github.com/propio/propio-sandbox/internal/backend"
)

// FactsOf are the facts of an engine of kind (Docker or Podman; anything
// else is taken for Docker), rootless or not, that need no engine to tell:
// its kind and how it differs from Docker's defaults.
func FactsOf(kind string, rootless bool) backend.Facts {
	if kind != Podman {
		return backend.Facts{Kind: Docker, Rootless: rootless, InternalNetworks: true}
	}
	return backend.Facts{
		Kind:        Podman,
		Rootless:    rootless,
		TmpfsU:      true,
		TmpfsCopyUp: true,
		NamesHost:   true,
		KeepID:      rootless,
		// keep-id comes only with a gateway relaying in user space.
		UserSpaceGateway: rootless,
	}
}

// Facts says what the engine is: its kind and host, found when it was
// reached, how it differs from Docker's defaults, and what its info says
// (read once, or as preflight read it).
func (e *Engine) Facts(ctx context.Context) (backend.Facts, error) {
	info, err := e.cachedInfo(ctx)
	if err != nil {
		return backend.Facts{}, err
	}
	f := FactsOf(e.Kind, e.Rootless)
	f.Host = e.Host
	f.APIVersion = e.APIVersion()
	f.Rootless = f.Rootless || info.Rootless
	f.DockerDesktop = info.DockerDesktop
	f.Local = info.Storage.Local
	f.Remote, f.RemoteWhy = info.Remote, info.RemoteWhy
	f.DataDir = info.DataDir
	f.Version = info.Version
	f.StorageQuota, f.StorageWhy = info.Storage.Quota, info.Storage.Why
	f.LimitsIgnored = info.LimitsIgnored
	return f, nil
}
