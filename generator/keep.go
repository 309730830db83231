package generator

import (
	"time"

	"github.com/compose-spec/compose-go/v2/types"
)

// Keep makes the project a persistent sandbox's (propio-sandbox up): its
// agent's main process waits, doing nothing, until it is stopped, whatever
// the image holds (a FROM scratch image has no shell, no sleep), and the
// commands run in it come through exec. That process is the launcher's own
// executable, statically linked, bind-mounted read-only at KeeperPath, run
// as KeeperCommand: the agent gets no new capability, and no way to the
// launcher (the keeper only waits for a signal).
type Keep struct {
	// Binary is the host path of the launcher's executable, statically
	// linked.
	Binary string
	// Idle is how long the sandbox may run no command before its
	// supervisor removes it; zero: never.
	Idle time.Duration
}

// KeeperPath is where the keeper's executable is in a persistent
// sandbox.
const KeeperPath = "/run/propio-sandbox-keeper"

// KeeperCommand is the persistent sandbox's main process.
var KeeperCommand = []string{KeeperPath, "keeper"}

// keep makes svc a persistent sandbox's: its entrypoint is the keeper
// (the image's entrypoint and command would end, or run the agent, where
// the sandbox must only wait for exec), mounted read-only.
func (k *Keep) apply(svc *types.ServiceConfig, ext *Extension) {
	svc.Entrypoint = append(types.ShellCommand(nil), KeeperCommand...)
	svc.Command = nil
	svc.Volumes = append(svc.Volumes, bind(k.Binary, KeeperPath, true))
	ext.Keep = &ExtensionKeep{Idle: k.Idle}
}

// ExtensionKeep is a persistent sandbox's part of the extension.
type ExtensionKeep struct {
	// Idle is how long the sandbox may run no command before its
	// supervisor removes it; zero: never (resources.idle: off).
	Idle time.Duration
}

func (k *ExtensionKeep) value() map[string]any {
	idle := "off"
	if k.Idle > 0 {
		idle = k.Idle.String()
	}
	return map[string]any{"idle": idle}
}
