package engine

import (
	"errors"
	"strings"
	"testing"

	"github.com/propio/propio-sandbox/internal/backend"
)

// Which storage can cap a writable layer: btrfs and zfs on Docker, overlay
// on xfs only with project quotas, which only a local engine's mount table
// shows; everything else cannot, and says what it is.
func TestQuota(t *testing.T) {
	opts := func(fstype, options string) func(string) (string, string, error) {
		return func(string) (string, string, error) { return fstype, options, nil }
	}
	for name, tc := range map[string]struct {
		s    Storage
		kind string
		opts func(string) (string, string, error)
		want bool
		why  string
	}{
		"btrfs":               {Storage{Driver: "btrfs", Local: true}, Docker, nil, true, "qgroup"},
		"btrfs on podman":     {Storage{Driver: "btrfs", Local: true}, Podman, nil, false, "cannot cap"},
		"zfs":                 {Storage{Driver: "zfs"}, Docker, nil, true, "quota"},
		"overlay2 on ext4":    {Storage{Driver: "overlay2", BackingFS: "extfs", Local: true}, Docker, nil, false, "overlay2 on extfs cannot cap"},
		"xfs with pquota":     {Storage{Driver: "overlay2", BackingFS: "xfs", Local: true}, Docker, opts("xfs", "rw,relatime,attr2,inode64,prjquota"), true, "project quotas"},
		"xfs without pquota":  {Storage{Driver: "overlay2", BackingFS: "xfs", Local: true}, Docker, opts("xfs", "rw,relatime,attr2,inode64,noquota"), false, "without project quotas"},
		"xfs accounting only": {Storage{Driver: "overlay", BackingFS: "xfs", Local: true}, Podman, opts("xfs", "rw,pqnoenforce"), false, "without project quotas"},
		"xfs elsewhere":       {Storage{Driver: "overlay2", BackingFS: "xfs"}, Docker, nil, false, "another host"},
		"mount table unread":  {Storage{Driver: "overlay2", BackingFS: "xfs", Local: true}, Docker, func(string) (string, string, error) { return "", "", errors.New("no mount holds /x") }, false, "no mount holds"},
	} {
		t.Run(name, func(t *testing.T) {
			got, why := quota(tc.s, tc.kind, "/var/lib/docker", tc.opts)
			if got != tc.want || !strings.Contains(why, tc.why) {
				t.Errorf("quota = %v, %q; want %v, with %q", got, why, tc.want, tc.why)
			}
		})
	}
}

// The engine's refusals of the size option are told from other failures.
func TestStorageOptRefused(t *testing.T) {
	for msg, want := range map[string]bool{
		"Error response from daemon: --storage-opt is supported only for overlay over xfs with 'pquota' mount option": true,
		"Error response from daemon: Storage Opt size is not supported":                                               true,
		"failed to enable quota: operation not permitted":                                                             true,
		"Error response from daemon: No such image: x":                                                                false,
	} {
		if got := storageOptRefused(errors.New(msg)); got != want {
			t.Errorf("storageOptRefused(%q) = %v, want %v", msg, got, want)
		}
	}
}

// The SDK's errors the launch branches on are classified, and say what
// the engine said.
func TestRunError(t *testing.T) {
	for _, tc := range []struct {
		msg        string
		storageOpt bool
		is         error
	}{
		{"Error response from daemon: --storage-opt is supported only for overlay over xfs with 'pquota' mount option", true, backend.ErrStorageOptRefused},
		{"Error response from daemon: --storage-opt is supported only for overlay over xfs with 'pquota' mount option", false, nil},
		{"Error response from daemon: Pool overlaps with other one on this address space", false, backend.ErrSubnetTaken},
		{"Error response from daemon: No such image: x", true, nil},
	} {
		orig := errors.New(tc.msg)
		err := runError(orig, tc.storageOpt)
		if err.Error() != tc.msg || !errors.Is(err, orig) {
			t.Errorf("runError(%q) = %v; want the engine's error as it is", tc.msg, err)
		}
		for _, s := range []error{backend.ErrStorageOptRefused, backend.ErrSubnetTaken} {
			if errors.Is(err, s) != (s == tc.is) {
				t.Errorf("runError(%q, %v) is %v: %v, want %v", tc.msg, tc.storageOpt, s, errors.Is(err, s), s == tc.is)
			}
		}
	}
	if runError(nil, true) != nil {
		t.Error("runError(nil) is not nil")
	}
}

func TestMountOptions(t *testing.T) {
	fstype, opts, err := mountOptions("/proc/self")
	if err != nil || fstype != "proc" || opts == "" {
		t.Errorf("mountOptions(/proc/self) = %q, %q, %v; want proc and its options", fstype, opts, err)
	}
}

func TestJoinPlaces(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		want string
	}{
		{[]string{PlaceWorkspace}, "the workspace"},
		{[]string{PlaceWorkspace, "/data", PlaceChangeset, PlaceChangeset}, "the workspace, /data and its changeset"},
	} {
		if got := joinPlaces(tc.in); got != tc.want {
			t.Errorf("joinPlaces(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
