package engine

import "github.com/propio/propio-sandbox/generator"

// FactsOf are the engine facts the generator needs for an engine of kind
// (Docker or Podman; anything else is taken for Docker), rootless or not.
func FactsOf(kind string, rootless bool) generator.EngineFacts {
	if kind != Podman {
		return generator.EngineFacts{}
	}
	return generator.EngineFacts{
		TmpfsU:           true,
		TmpfsCopyUp:      true,
		NamesHost:        true,
		KeepID:           rootless,
		UserSpaceGateway: true,
	}
}

// Facts are what the project must say differently for this engine.
func (e *Engine) Facts() generator.EngineFacts { return FactsOf(e.Kind, e.Rootless) }
