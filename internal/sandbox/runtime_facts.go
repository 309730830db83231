package sandbox

import (
	"path"

	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/backend"
)

// hostFacts are the engine's differences from Docker's defaults that the
// generator writes into the project, as the Runtime reports them.
func hostFacts(f backend.Facts) generator.EngineFacts {
	e := generator.EngineFacts{
		TmpfsU:           f.TmpfsU,
		TmpfsCopyUp:      f.TmpfsCopyUp,
		NamesHost:        f.NamesHost,
		KeepID:           f.KeepID,
		UserSpaceGateway: f.UserSpaceGateway,
		FencedNetns:      !f.InternalNetworks,
		Remote:           f.Remote,
	}
	if f.Remote && f.DataDir != "" {
		e.VolumeRoot = path.Join(f.DataDir, "volumes")
	}
	return e
}
