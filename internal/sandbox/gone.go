package sandbox

import (
	"fmt"
	"slices"
	"strings"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/backend"
)

// ExitEngineGone is the exit code of a run whose engine went away while it
// ran (stopped, restarted, crashed): what docker run gives for a failure of
// the daemon itself.
const ExitEngineGone = 125

// EngineGoneError: the engine went away during the run. What the sandbox
// made is left on it (its containers may even run on, under Podman's
// conmon or a killed dockerd's shims); the next run or gc removes it once
// the engine is back, and judges then what the sandbox left in the
// workspace.
type EngineGoneError struct {
	Host       string
	Project    string
	Containers []string // the sandbox's containers, by name
	Networks   []string
	Volumes    []string
	Err        error // how the engine was found gone
}

func (e *EngineGoneError) Error() string {
	var what []string
	for _, kind := range []struct {
		name  string
		names []string
	}{{"containers", e.Containers}, {"networks", e.Networks}, {"volumes", e.Volumes}} {
		if len(kind.names) > 0 {
			what = append(what, kind.name+" "+strings.Join(kind.names, ", "))
		}
	}
	left := ""
	if len(what) > 0 {
		left = " (" + strings.Join(what, "; ") + ")"
	}
	return fmt.Sprintf("the engine at %s went away during the run of sandbox %s: the next propio-sandbox run or gc, once the engine is back, removes what the sandbox left on it%s and checks what it left in the workspace", e.Host, e.Project, left)
}

func (e *EngineGoneError) Unwrap() error { return e.Err }

// engineGone says what the run of project left on an engine that went
// away: its container (named when it was started), its services'
// containers, its own networks and volumes.
func engineGone(host string, project *types.Project, container string, err error) *EngineGoneError {
	e := &EngineGoneError{Host: host, Project: project.Name, Err: err}
	if container != "" {
		e.Containers = append(e.Containers, container)
	}
	e.also(project)
	return e
}

// also adds what project holds besides the sandbox's own container (a
// gateway prepared ahead, its networks), once.
func (e *EngineGoneError) also(project *types.Project) {
	for name, svc := range project.Services {
		if name == generator.Service {
			continue
		}
		c := svc.ContainerName
		if c == "" {
			c = generator.ContainerName(project.Name, name)
		}
		e.Containers = append(e.Containers, c)
	}
	for _, n := range project.Networks {
		if !n.External {
			e.Networks = append(e.Networks, n.Name)
		}
	}
	for _, v := range project.Volumes {
		if v.Labels[backend.LabelProject] == project.Name {
			e.Volumes = append(e.Volumes, v.Name)
		}
	}
	for _, l := range []*[]string{&e.Containers, &e.Networks, &e.Volumes} {
		slices.Sort(*l)
		*l = slices.Compact(*l)
	}
}
