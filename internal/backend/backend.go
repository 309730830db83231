// Package backend is the contract between a sandbox's launch and the
// container engine that runs it: the Runtime interface, the facts an engine
// reports about itself, and the words both sides use (labels, places,
// errors). internal/engine implements it for Docker and Podman; the launch
// (internal/sandbox) drives it, and its tests fake it.
//
// It holds no engine's implementation: it imports nothing of this module
// and talks to no engine (its only code is pure, as VersionLess, which
// both sides compare engine versions with).
package backend

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/compose-spec/compose-go/v2/types"
)

// Runtime is what a launch needs of a container engine.
//
// A sandbox is a Compose project: every container, network and volume a
// Runtime makes for it carries the project's labels (LabelProject and the
// launcher's), by which Kill, StopUnstarted, Remove and List find them.
type Runtime interface {
	// Facts says what the engine is and how it differs from Docker's
	// defaults.
	Facts(ctx context.Context) (Facts, error)
	// Info is what the engine says of itself: its architecture, data
	// directory, runtimes and storage (the preflight checks judge them).
	Info(ctx context.Context) (Info, error)
	// ImageArch is the CPU architecture of the image ref, in image terms,
	// and whether the engine has it.
	ImageArch(ctx context.Context, ref string) (arch string, found bool, err error)

	// HasImage reports whether the engine has the image ref. It never
	// pulls.
	HasImage(ctx context.Context, ref string) (bool, error)
	// Build builds the image of the project's service from its build
	// section.
	Build(ctx context.Context, project *types.Project, service string) error
	// BuildImage builds the image tag from a build context: a tar stream
	// with a Dockerfile at its root and everything the image needs (the
	// build has no network). The allowlist gateway's image is made so.
	BuildImage(ctx context.Context, tag string, buildContext io.Reader) error

	// HasNetwork reports whether the engine has a network of exactly this
	// name (an allowlist gateway joins the profile's network.join ones).
	HasNetwork(ctx context.Context, name string) (bool, error)
	// UsedSubnets lists the subnets the engine's networks take, so that a
	// sandbox's network can be numbered apart from them.
	UsedSubnets(ctx context.Context) ([]netip.Prefix, error)
	// PathExists reports whether path exists where the engine runs
	// containers (in its VM, when it runs in one), looking through a
	// container of image that it never starts.
	PathExists(ctx context.Context, image, path string) (bool, error)
	// ImageID is the engine's ID of the image ref, which changes with its
	// content.
	ImageID(ctx context.Context, ref string) (string, error)
	// ImageFile reads, through a container of image that it never starts,
	// the first of paths that is a file in the image (a symbolic link
	// followed within the image), at most max bytes: the path and its
	// content. None of them there is no error: path is "".
	ImageFile(ctx context.Context, image string, paths []string, max int64) (path string, data []byte, err error)

	// CreateVolumes creates the project's own volumes (not its external
	// ones) with their labels, marks them external in project, so that Run
	// uses them as they are, and labels each with LabelHelperImage:
	// helperImage.
	CreateVolumes(ctx context.Context, project *types.Project, helperImage string) error
	// CopyIn fills the volume with the host directory from, keeping modes,
	// mtimes, symbolic links and ownership.
	CopyIn(ctx context.Context, v Volume, from string) error
	// CopyOut replaces the host directory to with the volume's content, all
	// or nothing.
	CopyOut(ctx context.Context, v Volume, to string) error
	// CopyEntry makes a copy of a host path the entry e.Name at the root
	// of the volume, replacing what was there, while the volume may be
	// mounted in a running container (an agent's mount request).
	CopyEntry(ctx context.Context, v Volume, e Entry) (Copied, error)
	// OverlayCapable tells whether the engine can mount an overlay of a
	// directory of this host for a sandbox (a changeset's volume), and how;
	// when it cannot, Overlay says why.
	OverlayCapable(ctx context.Context) (Overlay, error)
	// ReleaseChangeset makes sure that no sandbox writes to the changeset
	// id (to the volumes labelled with it) before another run resumes it: the sandboxes of launchers that are gone are removed; one
	// of a live launcher is an error wrapping ErrChangesetInUse.
	ReleaseChangeset(ctx context.Context, id string) error

	// PlanDisk says how the disk cap of the project's service holds on this
	// engine: what the engine enforces (a storage option the launch sets on
	// the service) and what the launcher must watch. It is called once the
	// project's volumes exist and are filled.
	PlanDisk(ctx context.Context, project *types.Project, d DiskRequest) (*DiskPlan, error)

	// Run runs the project's service as a one-off container attached to the
	// launcher's streams, as `docker compose run` does: it creates the
	// project's networks, creates and starts the services the service
	// depends on, then creates, starts, attaches to and waits for the
	// one-off container, and returns its exit code. Once the container is
	// created, the Runtime forwards the launcher's signals to it.
	//
	// Errors it returns wrap ErrStorageOptRefused or ErrSubnetTaken when
	// that is what went wrong.
	Run(ctx context.Context, project *types.Project, o RunSpec) (code int, err error)
	// Up creates the project's networks and starts its services, detached,
	// as `docker compose up -d` does (an allowlist's gateway prepared ahead
	// of the sandbox that will use it).
	Up(ctx context.Context, project *types.Project) error
	// Exec runs a command in the running container of the project's
	// service, as `docker compose exec` does, and returns its exit code (an
	// exit code above zero is not an error).
	Exec(ctx context.Context, project string, o ExecSpec) (code int, err error)
	// UpdateResources changes, live, the limits of the running container
	// of the project's service (the agent's): the fields of r above zero;
	// the others stay as they are.
	UpdateResources(ctx context.Context, project, service string, r Resources) error
	// StartRelay creates and starts a container of r that shares the
	// network namespace of the project's running container of r.Service
	// (the sandbox's one-off), and returns its id. It carries r.Labels
	// (the sandbox's), so that Remove removes it with the sandbox.
	StartRelay(ctx context.Context, r Relay) (id string, err error)
	// Running reports whether the project has a running container of
	// service (a gateway prepared ahead, before a run adopts it).
	Running(ctx context.Context, project, service string) (bool, error)
	// RemoveContainer removes the container id, running or not; one that is
	// gone already is no error.
	RemoveContainer(ctx context.Context, id string) error
	// Kill kills the project's running containers at once.
	Kill(ctx context.Context, project string) error
	// StopUnstarted stops a sandbox whose command has not started yet:
	// it removes the project's containers that are created but not
	// started, and reports true (an allowlist's gateway may already run:
	// the teardown removes it). Once the command's container has been
	// started (whether it still runs or has ended) it is left alone (it
	// gets the launcher's signals from Run), and reported false. When it
	// cannot tell, it reports true.
	StopUnstarted(ctx context.Context, project string) bool
	// Remove deletes every container, network and volume of the project,
	// running or not: all of them, or, when launcher is above zero, only
	// those the launcher with that pid made (a new launcher may be starting
	// a sandbox of the same name). Removing what is already gone is not an
	// error.
	Remove(ctx context.Context, project string, launcher int) error
	// List returns the sandboxes the engine holds, oldest first.
	List(ctx context.Context) ([]Sandbox, error)

	// What a persistent sandbox's supervisor needs besides a run's.

	// Container is the ID of the container of the project's service,
	// running or not; "" when there is none.
	Container(ctx context.Context, project, service string) (string, error)
	// Wait waits until the container of the project's service is not
	// running, and returns its exit code. When the engine stops answering
	// (it is stopped or restarted), the error wraps ErrEngineGone.
	Wait(ctx context.Context, project, service string) (int, error)
	// Start starts the containers of the project's services that are not
	// running: those of the services the agent's depends on (an
	// allowlist's gateway) first, then the agent's, when the project has
	// it (a project of the gateway alone starts the gateway alone). They
	// must exist (a stopped persistent sandbox's, or one the engine stopped
	// when it restarted).
	Start(ctx context.Context, project *types.Project) error
	// Stop stops the project's running containers, the agent's first, and
	// keeps them, with their writable layers, and the project's networks
	// and volumes.
	Stop(ctx context.Context, project string) error

	// Reachable says, within a short time and on a connection of its own,
	// whether the engine still answers: an error when it has gone away
	// (stopped, shutting down, not answering).
	Reachable(ctx context.Context) error
}

// Resources are a container's limits: CPUs (cores), Memory (bytes), PIDs
// (processes); zero is none given.
type Resources struct {
	CPUs   float64
	Memory int64
	PIDs   int64
}

// Facts are what an engine is, and how it differs from Docker's defaults:
// a caller asks these, never which product the engine is.
type Facts struct {
	// Kind is "docker" or "podman", as the engine itself says: for
	// messages and the SSH agent's forwarding (which differs by product on
	// macOS), not for branching on what the engine does.
	Kind string
	// Host is where the engine listens: unix:///var/run/docker.sock,
	// tcp://...
	Host string
	// APIVersion is the version of the engine's API the connection speaks
	// (a persistent sandbox's exec speaks it without asking again).
	APIVersion string
	// Rootless: the engine runs as an unprivileged user.
	Rootless bool
	// DockerDesktop: the engine is Docker Desktop's, in a VM.
	DockerDesktop bool
	// Local: the engine runs on this host (a unix socket, the same host
	// name, not a VM), so that its files are this host's.
	Local bool
	// StorageQuota: the engine can cap a container's writable layer (the
	// storage option size); StorageWhy says why it can or why not.
	StorageQuota bool
	StorageWhy   string
	// LimitsIgnored says why the engine does not enforce a container's
	// memory, pids and CPU limits (empty when it does).
	LimitsIgnored string
	// TmpfsU: the engine refuses uid= and gid= on a tmpfs, and gives the
	// tmpfs to the container's user with the option U instead (Podman).
	TmpfsU bool
	// TmpfsCopyUp: the engine copies what the image has at a tmpfs's mount
	// point into the tmpfs unless told notmpcopyup (Podman).
	TmpfsCopyUp bool
	// NamesHost: the engine names the host in each container itself
	// (Podman: host.containers.internal), and may not resolve host-gateway
	// (Podman before 4.7).
	NamesHost bool
	// KeepID: the engine runs rootless in a user namespace that must map
	// the user to itself (userns_mode keep-id) for files written in the
	// workspace to stay the user's (a rootless Podman).
	KeepID bool
	// UserSpaceGateway: an allowlist gateway must relay in user space, never
	// forwarding in its kernel (Podman, whose keep-id mapping comes only
	// with it).
	UserSpaceGateway bool
	// Remote: the engine runs on another machine (RemoteWhy says how that
	// was told), which has none of this host's files: the workspace goes
	// there by copy.
	Remote    bool
	RemoteWhy string
	// DataDir is where the engine keeps its images, containers and
	// volumes (Docker's DockerRootDir, Podman's graph root), on its host.
	DataDir string
	// InternalNetworks: a network made internal keeps the host out of it.
	// Podman gives the host an address on it (and serves DNS there), so an
	// allowlist sandbox there is fenced in another way (from Podman
	// FencedAllowlistSince on).
	InternalNetworks bool
	// Version is the engine's version, as it says (Podman's own, not its
	// API's).
	Version string
}

// FencedAllowlistSince is the first Podman version on which an allowlist
// sandbox is fenced in as Docker's internal network keeps it in (a
// container of its own holds its network namespace and fences it in,
// rootful and rootless): the version that is tested. An older Podman
// refuses allowlists.
const FencedAllowlistSince = "4.3.1"

// VersionLess reports whether version a is older than b, comparing their
// dot-separated numbers (1.41 and 1.9, 4.3.1 and 5.0.0-rc1: each part's
// leading digits); an empty a is older than any b.
func VersionLess(a, b string) bool {
	pa, pb := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < max(len(pa), len(pb)); i++ {
		var x, y int
		if i < len(pa) {
			fmt.Sscan(pa[i], &x)
		}
		if i < len(pb) {
			fmt.Sscan(pb[i], &y)
		}
		if x != y {
			return x < y
		}
	}
	return false
}

// Volume names a volume of the engine, and the helper container through
// which a Runtime copies it: made of Image (one the engine has), labelled
// with Labels (the sandbox's, so that Remove removes it too), never
// started.
type Volume struct {
	Name   string
	Image  string
	Labels map[string]string
}

// VolumeCopy fills a volume of the project with a host directory before the
// run, and copies the volume's content back to the host after it: the copy
// realisation of a changeset, for engines that cannot mount an overlay of a
// host path.
type VolumeCopy struct {
	Volume string // the volume's key in the project
	From   string // the host directory copied into the volume before the run
	To     string // the host directory the volume's final content replaces, after the run
}

// Entry is a host path copied into a volume by CopyEntry: a regular file,
// or a directory with the directories, regular files and symbolic links
// below it (links copied as links, never followed; sockets, devices and
// fifos left out). Setuid and setgid bits are dropped; owners, modes and
// modification times are kept.
type Entry struct {
	Name string // the entry's name at the volume's root: one path segment
	From string // the host path, absolute, its links resolved
	// Skip are paths below From (relative, forward slashes) left out, a
	// directory with all below it.
	Skip map[string]bool
	// Max is what the regular files may come to, in bytes: the copy stops
	// with an error wrapping ErrEntryTooLarge past it. 0: no limit.
	Max int64
}

// Copied is what CopyEntry copied.
type Copied struct {
	Bytes int64 // of the regular files
	Files int64 // regular files and symbolic links
}

// ErrEntryTooLarge: the entry came to more than its Max while it was
// copied (it grew since it was measured).
var ErrEntryTooLarge = errors.New("the copy is larger than its limit")

// Streams are what a command in a sandbox reads and writes instead of the
// launcher's streams (those the Runtime was connected with): a nil one is
// the launcher's.
type Streams struct {
	In       io.Reader
	Out, Err io.Writer
}

// RunSpec says how Run runs the one-off container.
type RunSpec struct {
	// Service is the project's service to run.
	Service string
	// TTY allocates a terminal; Interactive attaches the launcher's stdin.
	TTY, Interactive bool
	// Streams, where set, take the place of the launcher's: the
	// container's output and what the Runtime says while it starts it go
	// there (a declared check's output is kept, not shown).
	Streams Streams
	// NotRunning, when set, is called when a signal the Runtime forwarded
	// found the container not running yet (created, not started): the
	// signal is lost on it, and the launch must stop the start itself.
	NotRunning func(os.Signal)
	// Detach: Run returns once the container has started, with code 0, and
	// leaves it running, attached to nothing; it is kept when it stops (a
	// persistent sandbox's, which Wait waits for).
	Detach bool

	// Started, when set, is called once the container has been started,
	// with its name.
	Started func(container string)
}

// ExecSpec says how Exec runs a command.
type ExecSpec struct {
	// Service is the project's service whose container runs the command.
	Service string
	// Command is the command and its arguments.
	Command []string
	// TTY allocates a terminal (the launcher's: Streams.In and Streams.Out
	// nil); Interactive attaches the command's stdin.
	TTY, Interactive bool
	// Streams, where set, take the place of the launcher's.
	Streams Streams
}

// Relay is a container that joins a running sandbox's network namespace
// to relay connections into it (a port the agent asked to publish): no
// network of its own, no capability, a read-only root, one directory of
// the host bind-mounted.
type Relay struct {
	// Project and Service name the running container whose network
	// namespace it joins.
	Project, Service string
	// Image is the image it runs (the gateway's: this binary), with
	// Command as its arguments.
	Image   string
	Command []string
	// Dir is the host directory mounted at Target (read-write), where it
	// serves its socket.
	Dir, Target string
	// User is the user:group it runs as; KeepID maps the host's user to
	// itself in a rootless engine's user namespace (Podman's keep-id).
	User   string
	KeepID bool
	Labels map[string]string
}

// Overlay says whether an engine can mount an overlay of a directory of
// this host for a sandbox, and how.
type Overlay struct {
	OK  bool
	Why string // why not, when not
	// UserXattr: mount it with the userxattr option (Linux 5.11 and newer),
	// so that its marks (opaque directories) are user.overlay.* attributes,
	// which a launcher that is not root can read; trusted.* ones it cannot.
	UserXattr bool
}

// DiskRequest asks how a disk cap holds for one service.
type DiskRequest struct {
	// Service is the project's service the cap is for.
	Service string
	// Cap is the cap in bytes, above zero.
	Cap int64
	// OverlayUppers maps the project's overlay volumes (a changeset's), by
	// their key in the project, to their upper directories on this host,
	// which the launcher may watch.
	OverlayUppers map[string]string
}

// DiskPlan is how the disk cap holds for one sandbox: what the engine
// enforces itself and what the launcher watches.
type DiskPlan struct {
	Cap int64
	// StorageOpt is the size the engine caps the writable layer at (the
	// service's storage option size), or "" when it does not.
	StorageOpt string
	// Watch measures what the launcher watches until ctx ends, and returns
	// what went over the cap first, or nil (at once when nothing is
	// watched).
	Watch func(ctx context.Context) *DiskCapError
	// WatchLayer is the fallback when the engine refused StorageOpt after
	// all: Watch watches the writable layer from then on.
	WatchLayer func()
}

// ExitDiskCap is the exit code of a sandbox the launcher stopped because
// it wrote more than its disk cap (122 is EDQUOT, "Disk quota exceeded").
const ExitDiskCap = 122

// DiskCapError: the sandbox wrote more than its disk cap to a place the
// launcher watches, and was stopped.
type DiskCapError struct {
	Cap   int64  // the cap, in bytes
	Where string // one of the places below, a mount's target, or several joined
	Size  int64  // what the launcher measured
}

func (e *DiskCapError) Error() string {
	return fmt.Sprintf("the sandbox wrote more than its disk cap (%d bytes) to %s; stopped", e.Cap, e.Where)
}

// Places a launcher caps, as messages name them.
const (
	PlaceWorkspace     = "the workspace"
	PlaceChangeset     = "its changeset"
	PlaceWritableLayer = "its writable layer"
	// PlaceImageVolumes: the volumes the engine makes for the image's
	// VOLUME paths (none mounted there by the profile).
	PlaceImageVolumes = "its image's volumes"
)

// Sandbox is one sandbox the engine knows of, from its labels.
type Sandbox struct {
	Project   string    `json:"project"`
	Workspace string    `json:"workspace"`
	Profile   string    `json:"profile"`
	PID       int       `json:"launcher_pid"`
	Host      string    `json:"launcher_host"`
	Alive     bool      `json:"launcher_alive"` // the launcher process still runs (on this host)
	State     string    `json:"state"`          // of its container, or "leftover" when only networks remain
	Created   time.Time `json:"created"`
	// A persistent sandbox's (up): its name, and why it is gone when it
	// is. Its PID and Alive are its supervisor's.
	Persistent bool   `json:"persistent"`
	Name       string `json:"name,omitempty"`
	Why        string `json:"why,omitempty"`
	// Keep and KeepID are a persistent sandbox's record (the directory
	// LabelKeep names) and which sandbox of that name it is (LabelKeepID).
	Keep   string `json:"-"`
	KeepID string `json:"-"`

	// Prepared: made ahead of the sandbox that will use it (an allowlist's
	// gateway and networks, LabelPrepared), by a process that keeps it.
	Prepared bool `json:"prepared,omitempty"`
}

// Labels that tie a sandbox's resources to the launcher that made them.
const (
	LabelProject = "dev.propio-sandbox.project"
	LabelPID     = "dev.propio-sandbox.launcher-pid"
	LabelHost    = "dev.propio-sandbox.launcher-host"
	// LabelHelperImage names, on a volume, an image the engine has that can
	// make the helper containers for it (the sandbox's).
	LabelHelperImage = "dev.propio-sandbox.helper-image"
	// LabelKeep marks a persistent sandbox's resources (up) with the
	// directory of its record, and LabelKeepID with which sandbox of that
	// name they are: they belong to the record, not to a launcher's pid.
	LabelKeep   = "dev.propio-sandbox.keep"
	LabelKeepID = "dev.propio-sandbox.keep-id"

	// LabelPrepared marks what was made ahead of the sandbox that will use
	// it (a gateway and its networks); LabelPID is then its keeper's.
	LabelPrepared = "dev.propio-sandbox.prepared"
)

// Errors a Runtime's calls wrap, for the launch to branch on.
var (
	// ErrStorageOptRefused: the engine refused the writable layer's
	// storage option (its storage was misjudged).
	ErrStorageOptRefused = errors.New("the engine refused the storage option size")
	// ErrSubnetTaken: the sandbox network's subnet was taken by another
	// network between choosing it and creating it.
	ErrSubnetTaken = errors.New("the sandbox network's subnet is taken")
	// ErrChangesetInUse: a running sandbox of a live launcher writes to the
	// changeset.
	ErrChangesetInUse = errors.New("the changeset is in use")
	// ErrEngineGone: the engine stopped answering (it was stopped or
	// restarted) while the launcher waited on it.
	ErrEngineGone = errors.New("the engine went away")
)

// LauncherAlive reports whether the launcher pid still runs on this host.
// On another host it cannot tell, and says alive so that nothing is
// removed.
func LauncherAlive(pid int, host string) bool {
	if !SameHost(host) {
		return true
	}
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// SameHost reports whether host is this host's name.
func SameHost(host string) bool {
	h, _ := os.Hostname()
	return host == h
}

// Info is what the engine says about itself that preflight checks need.
type Info struct {
	// Kind is the engine: Docker or Podman; Version its version, as it
	// says.
	Kind, Version string
	// Host is the address the engine is reached at; Context the Docker
	// context that named it ("" for none) and ContextFrom what chose that
	// context (--context, DOCKER_CONTEXT, or the docker CLI's config file).
	Host, Context, ContextFrom string
	// Arch is the engine's CPU architecture in image terms (amd64, arm64).
	Arch string
	// DataDir is where the engine keeps its images and containers
	// (Docker's DockerRootDir, Podman's graph root).
	DataDir string
	// Runtimes are the names of the OCI runtimes the engine offers, sorted.
	Runtimes []string
	// DefaultRuntime is the one used when a container names none.
	DefaultRuntime string
	// Storage is how the engine keeps writable layers.
	Storage Storage
	// Rootless: the engine says it runs as an unprivileged user (rootless
	// Docker; Podman says so in its own info, not in the compatible one).
	Rootless bool
	// DockerDesktop: the engine is Docker Desktop's.
	DockerDesktop bool
	// Remote: the engine runs on another machine (RemoteWhy says how that
	// was told). CPUs and Memory are its host's; Published are the host
	// addresses its containers publish ports on (ADDRESS:PORT/PROTO),
	// read for a remote engine only.
	Remote    bool
	RemoteWhy string
	CPUs      float64
	Memory    int64
	Published []string
	// LimitsIgnored says why the engine does not enforce a container's
	// memory, pids and CPU limits (empty when it does): a rootless engine
	// on cgroups v1, which Podman says it ignores them on.
	LimitsIgnored string
}

// Storage is how the engine keeps containers' writable layers, and whether
// it can cap one.
type Storage struct {
	// Driver is the engine's storage driver: overlay2 (Docker), overlay
	// (Podman), btrfs, zfs, vfs...
	Driver string
	// BackingFS is the file system under the driver, when the engine says.
	BackingFS string
	// Local: the engine runs on this host (a unix socket, the same host
	// name, not Docker Desktop's VM), so its files are this host's.
	Local bool
	// Quota: a writable layer can be capped by the engine (storage_opt
	// size), so that writes past the cap fail inside the sandbox.
	Quota bool
	// Why says why it can, or why not.
	Why string
}
