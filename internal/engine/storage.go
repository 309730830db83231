package engine

import (
	"bufio"
	"fmt"
	"github.com/propio/propio-sandbox/internal/backend"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/moby/moby/api/types/system"
)

// Storage is how the engine keeps writable layers (backend.Storage).
type Storage = backend.Storage

// storageOf reads the storage facts from the engine's info.
func storageOf(info system.Info, kind, host string) Storage {
	s := Storage{Driver: info.Driver}
	for _, kv := range info.DriverStatus {
		if kv[0] == "Backing Filesystem" {
			s.BackingFS = kv[1]
		}
	}
	s.Local, _ = onThisHost(info, host)
	s.Quota, s.Why = quota(s, kind, info.DockerRootDir, mountOptions)
	return s
}

// quota judges whether the engine can cap a writable layer (the storage
// option size), from its driver and, for overlay on xfs, the project quota
// option of the file system under its data directory (which only a local
// engine's mount table shows). opts reads a path's file system type and
// mount options.
func quota(s Storage, kind, dataDir string, opts func(string) (fstype, options string, err error)) (bool, string) {
	switch {
	case s.Driver == "btrfs" && kind == Docker:
		return true, "btrfs: the engine caps each writable layer with a qgroup"
	case s.Driver == "zfs" && kind == Docker:
		return true, "zfs: the engine caps each writable layer with a quota"
	case (s.Driver == "overlay2" || s.Driver == "overlay") && s.BackingFS == "xfs":
		if !s.Local {
			return false, s.Driver + " on xfs of an engine on another host: whether it has project quotas cannot be seen from here"
		}
		fstype, o, err := opts(dataDir)
		if err != nil {
			return false, fmt.Sprintf("%s on xfs: %v", s.Driver, err)
		}
		for _, opt := range strings.Split(o, ",") {
			if fstype == "xfs" && (opt == "prjquota" || opt == "pquota") {
				return true, s.Driver + " on xfs with project quotas: the engine caps each writable layer"
			}
		}
		return false, s.Driver + " on xfs without project quotas (mount option pquota)"
	}
	what := s.Driver
	if s.BackingFS != "" {
		what += " on " + s.BackingFS
	}
	return false, what + " cannot cap a writable layer: only btrfs, zfs and overlay on xfs with pquota can"
}

// onThisHost tells whether the engine runs on this host: a unix socket on
// Linux, the same host name, not Docker Desktop's VM.
func onThisHost(info system.Info, host string) (bool, string) {
	if runtime.GOOS != "linux" {
		return false, "the engine runs in a VM, not on this " + runtime.GOOS + " host"
	}
	if !strings.HasPrefix(host, "unix://") {
		return false, "the engine at " + host + " is not on this host"
	}
	if strings.Contains(info.OperatingSystem, "Docker Desktop") {
		return false, "Docker Desktop runs its engine in a VM"
	}
	if h, _ := os.Hostname(); info.Name != "" && h != "" && info.Name != h {
		return false, fmt.Sprintf("the engine runs on host %s, not on this one (%s)", info.Name, h)
	}
	return true, ""
}

// remoteOf tells whether the engine runs on another machine, and why: it
// is reached over the network (ssh://, tcp://: even on this machine's
// loopback, it is taken for another's, whose files are copied to it), or
// its host's name is not this one's. Docker Desktop's VM is not another
// machine: it shares this host's files.
func remoteOf(info system.Info, host string) (bool, string) {
	if !strings.HasPrefix(host, "unix://") && !strings.HasPrefix(host, "npipe://") {
		return true, "the engine at " + host + " is reached over the network"
	}
	if strings.Contains(info.OperatingSystem, "Docker Desktop") {
		return false, ""
	}
	if h, _ := os.Hostname(); info.Name != "" && h != "" && info.Name != h {
		return true, fmt.Sprintf("the engine at %s runs on host %s, not on this one (%s)", host, info.Name, h)
	}
	return false, ""
}

// mountOptions returns the type and the options (mount and super block) of
// the file system that holds path, from this process's mount table.
func mountOptions(path string) (fstype, options string, err error) {
	if real, err := filepath.EvalSymlinks(path); err == nil {
		path = real
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", "", err
	}
	defer f.Close()
	best := -1
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTIONS
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		fields, tail := strings.Fields(pre), strings.Fields(post)
		if !ok || len(fields) < 6 || len(tail) < 3 {
			continue
		}
		mp := unescapeMount(fields[4])
		if (path == mp || strings.HasPrefix(path, strings.TrimSuffix(mp, "/")+"/")) && len(mp) > best {
			best = len(mp)
			fstype, options = tail[0], fields[5]+","+tail[2]
		}
	}
	if best < 0 {
		return "", "", fmt.Errorf("no mount holds %s", path)
	}
	return fstype, options, sc.Err()
}

// unescapeMount undoes the octal escapes of a mount point in mountinfo.
func unescapeMount(s string) string {
	for _, e := range []struct{ from, to string }{{`\040`, " "}, {`\011`, "\t"}, {`\012`, "\n"}, {`\134`, `\`}} {
		s = strings.ReplaceAll(s, e.from, e.to)
	}
	return s
}
