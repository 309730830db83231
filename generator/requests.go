package generator

import (
	"path/filepath"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/propio/propio-sandbox/internal/profile"
)

// AgentRequestDir is where the agent's directory (agent_requests) is
// mounted in the agent's container, read-only: the launcher serves
// request.sock there, through which the agent asks the user.
const AgentRequestDir = "/run/propio-sandbox"

// AgentDir is the agent's directory of project under base
// (Host.AgentDir): the launcher makes it and serves request.sock in it. It
// is never the ask directory, which only the launcher and the gateway see.
func AgentDir(base, project string) string { return filepath.Join(base, project) }

// agentRequests mounts the agent's directory at AgentRequestDir when the
// profile lets the agent ask for something, in every network mode.
func agentRequests(p *profile.Profile, h Host, o Options, svc *types.ServiceConfig) {
	if len(p.AgentRequests) == 0 || h.AgentDir == "" {
		return
	}
	svc.Volumes = append(svc.Volumes, bind(AgentDir(h.AgentDir, o.Project), AgentRequestDir, true))
}
