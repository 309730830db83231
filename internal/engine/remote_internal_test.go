package engine

import (
	"os"
	"strings"
	"testing"

	"github.com/moby/moby/api/types/system"
)

// An engine is on another machine when it is reached over the network, or
// names a host that is not this one; Docker Desktop's VM, on a unix
// socket, is not another machine.
func TestRemoteOf(t *testing.T) {
	t.Parallel()
	here, err := os.Hostname()
	if err != nil {
		t.Skip("no host name:", err)
	}
	for _, tc := range []struct {
		name   string
		host   string
		info   system.Info
		remote bool
		why    string
	}{
		{"local socket", "unix:///var/run/docker.sock", system.Info{Name: here}, false, ""},
		{"socket without a name", "unix:///var/run/docker.sock", system.Info{}, false, ""},
		{"ssh", "ssh://me@far.test", system.Info{Name: here}, true, "the engine at ssh://me@far.test is reached over the network"},
		{"tcp on loopback", "tcp://127.0.0.1:2376", system.Info{Name: here}, true, "the engine at tcp://127.0.0.1:2376 is reached over the network"},
		{"socket of another host", "unix:///run/forwarded.sock", system.Info{Name: "far"}, true, "the engine at unix:///run/forwarded.sock runs on host far, not on this one (" + here + ")"},
		{"Docker Desktop", "unix:///home/me/.docker/desktop/docker.sock", system.Info{Name: "docker-desktop", OperatingSystem: "Docker Desktop"}, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			remote, why := remoteOf(tc.info, tc.host)
			if remote != tc.remote || !strings.Contains(why, tc.why) || !remote && why != "" {
				t.Errorf("remoteOf = %v, %q; want %v, %q", remote, why, tc.remote, tc.why)
			}
		})
	}
}
