package generator

import (
	"strings"

	"github.com/compose-spec/compose-go/v2/types"
)

// EngineFacts say what the project must say differently for the engine
// that runs it. The launch fills them from what the engine reports
// (internal/engine's Facts); render, from the engine the user names. The
// zero value is Docker's.
type EngineFacts struct {
	// TmpfsU: the engine refuses uid= and gid= on a tmpfs, and gives the
	// tmpfs to the container's user with the option U instead (Podman).
	TmpfsU bool
	// TmpfsCopyUp: the engine copies what the image has at a tmpfs's mount
	// point into the tmpfs unless told notmpcopyup (Podman), which would
	// show a hidden directory's contents.
	TmpfsCopyUp bool
	// NamesHost: the engine names the host in each container itself
	// (Podman: host.containers.internal), and may not resolve host-gateway
	// (Podman before 4.7): no host.docker.internal entry is added.
	NamesHost bool
	// KeepID: the engine runs rootless in a user namespace that must map
	// the user to itself (userns_mode keep-id) for files written in the
	// workspace to stay the user's (a rootless Podman).
	KeepID bool
	// UserSpaceGateway: the allowlist gateway relays in user space only,
	// never forwarding in its kernel (which needs it to start as root with
	// NET_ADMIN in its own network namespace): Podman, whose keep-id
	// mapping comes only with it, and which refuses allowlists anyway.
	UserSpaceGateway bool
	// FencedNetns: the engine's internal networks do not keep the host out
	// (Podman gives the host an address on each, and serves DNS there), so
	// an allowlist sandbox joins a network namespace held by a container of
	// its own (NetnsService) that fences it in to loopback and the gateway.
	FencedNetns bool
	// Remote: the engine runs on another machine, which has none of this
	// host's files. What the sandbox reads of them is copied into volumes
	// (a directory in mode ro, or in changeset mode where no changeset is
	// made: a snapshot, mounted read-only; a changeset is a copy), the
	// account files and the git configuration are not mounted, and any
	// other mount of a host path is an error (RemoteMountError).
	Remote bool
	// VolumeRoot is, for a remote engine, where its local volumes keep
	// their content on its host (DATA-ROOT/volumes: a volume's is
	// VolumeRoot/NAME/_data). A bind mount of a path inside a directory
	// the engine has a copy of in a volume is then made of that path in the
	// volume (a read-only path of the workspace, the git guard's, a hidden
	// file's mask, the account files).
	VolumeRoot string
}

// tmpfs says tmpfs options (Docker's words) in the engine's words.
func (e EngineFacts) tmpfs(in types.StringList) types.StringList {
	if !e.TmpfsU && !e.TmpfsCopyUp {
		return in
	}
	out := make(types.StringList, 0, len(in))
	for _, t := range in {
		dst, opts, _ := strings.Cut(t, ":")
		var keep []string
		chown := false
		for _, o := range strings.Split(opts, ",") {
			switch {
			case e.TmpfsU && (strings.HasPrefix(o, "uid=") || strings.HasPrefix(o, "gid=")):
				chown = true
			case o != "":
				keep = append(keep, o)
			}
		}
		if chown {
			keep = append(keep, "U")
		}
		if e.TmpfsCopyUp {
			keep = append(keep, "notmpcopyup")
		}
		out = append(out, dst+":"+strings.Join(keep, ","))
	}
	return out
}

// hostGateway is the extra host that names the host host.docker.internal,
// on an engine that does not name it itself; nil on one that does.
func (e EngineFacts) hostGateway() types.HostsList {
	if e.NamesHost {
		return nil
	}
	return types.HostsList{"host.docker.internal": []string{"host-gateway"}}
}
