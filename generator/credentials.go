package generator

import (
	"fmt"
	"path"
	"strings"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/propio/propio-sandbox/internal/profile"
)

// SSHAgentTarget is where a forwarded SSH agent's socket is inside; the
// sandbox's SSH_AUTH_SOCK names it.
const SSHAgentTarget = "/ssh-agent"

// ExtraMount is a mount the user added for one launch
// (PROPIO_SANDBOX_MOUNTS), on top of the profile's.
type ExtraMount struct {
	Source, Target string // absolute paths
	ReadOnly       bool
}

// SSHAgent is a forwarded SSH agent: the socket to mount at SSHAgentTarget.
type SSHAgent struct {
	Source  string // a socket path on the host, or in the engine's VM
	Relabel bool   // SELinux relabelling (:z), for Podman
}

// PasswdFile and GroupFile are the account files of a sandbox that runs as
// uid:gid: tools such as ssh refuse to run as a uid without an entry, and
// take ~ from it, not from $HOME; so the sandbox user gets one, with its home
// at profile.HomeDir (root too, when the launcher runs as root).
func PasswdFile(uid, gid int) string {
	if uid == 0 {
		return fmt.Sprintf("root:x:0:%d:root:%s:/bin/sh\n"+
			"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n", gid, profile.HomeDir)
	}
	return fmt.Sprintf("root:x:0:0:root:/root:/bin/sh\n"+
		"sandbox:x:%d:%d:propio-sandbox user:%s:/bin/sh\n"+
		"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n", uid, gid, profile.HomeDir)
}

// GroupFile is the group file that goes with PasswdFile.
func GroupFile(gid int) string {
	if gid == 0 {
		return "root:x:0:\nnogroup:x:65534:\n"
	}
	return fmt.Sprintf("root:x:0:\nsandbox:x:%d:\nnogroup:x:65534:\n", gid)
}

// credentials adds what the host shares with the sandbox beyond the
// workspace: git's discovery setting, the user's git configuration, the SSH
// agent and known_hosts, the account files, and the launch's extra mounts.
func credentials(p *profile.Profile, h Host, svc *types.ServiceConfig) {
	// The workspace is a mount: git must look above it for a repository
	// that starts higher up.
	svc.Environment["GIT_DISCOVERY_ACROSS_FILESYSTEM"] = ptr("1")

	// Each file at the host's path and at the sandbox's HOME, so git finds
	// it whichever HOME is active.
	dual := func(src string) {
		targets := []string{src}
		if rel, ok := strings.CutPrefix(src, strings.TrimSuffix(h.Home, "/")+"/"); ok && h.Home != "" {
			if inside := path.Join(profile.HomeDir, rel); inside != src {
				targets = append(targets, inside)
			}
		}
		for _, t := range targets {
			svc.Volumes = append(svc.Volumes, bind(src, t, true))
		}
	}
	// A remote engine has not the git configuration of this host: the
	// image's is used.
	if p.Git.Config && !h.Engine.Remote {
		for _, f := range h.GitConfig {
			dual(f)
		}
	}
	if h.SSHAgent.Source != "" {
		v := bind(h.SSHAgent.Source, SSHAgentTarget, false)
		if h.SSHAgent.Relabel {
			v.Bind.SELinux = "z"
		}
		svc.Volumes = append(svc.Volumes, v)
		svc.Environment["SSH_AUTH_SOCK"] = ptr(SSHAgentTarget)
		if h.KnownHosts != "" {
			dual(h.KnownHosts)
		}
	}
	if p.User.IsHost() && h.Passwd != "" && h.Group != "" {
		svc.Volumes = append(svc.Volumes, bind(h.Passwd, "/etc/passwd", true), bind(h.Group, "/etc/group", true))
	}
	for _, m := range h.ExtraMounts {
		svc.Volumes = append(svc.Volumes, bind(m.Source, m.Target, m.ReadOnly))
	}
	if h.Engine.KeepID && p.User.IsHost() {
		svc.UserNSMode = "keep-id"
	}
}
