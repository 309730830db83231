package backend

import (
	"os"
	"os/exec"
	"testing"
)

// A launcher is alive while its process runs on this host; one of another
// host is taken as alive, as nothing here can tell.
func TestLauncherAlive(t *testing.T) {
	host, _ := os.Hostname()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Skipf("cannot run true: %v", err)
	}
	dead := cmd.Process.Pid
	for name, tc := range map[string]struct {
		pid  int
		host string
		want bool
	}{
		"this process":          {os.Getpid(), host, true},
		"the parent":            {os.Getppid(), host, true},
		"exited":                {dead, host, false},
		"no pid":                {0, host, false},
		"exited, on other host": {dead, host + "-other", true},
	} {
		if got := LauncherAlive(tc.pid, tc.host); got != tc.want {
			t.Errorf("%s: LauncherAlive(%d, %q) = %v, want %v", name, tc.pid, tc.host, got, tc.want)
		}
	}
}
