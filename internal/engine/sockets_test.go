package engine

import (
	"slices"
	"testing"
)

func TestSockets(t *testing.T) {
	env := map[string]string{
		"DOCKER_HOST":     "unix:///srv/engine/docker.sock",
		"CONTAINER_HOST":  "ssh://me@remote/run/podman/podman.sock", // not a local socket
		"XDG_RUNTIME_DIR": "/run/user/1000",
	}
	got := Sockets(func(k string) string { return env[k] }, "/home/me")
	for _, want := range []string{
		"/srv/engine/docker.sock",
		"/var/run/docker.sock", "/run/docker.sock",
		"/run/user/1000/docker.sock", "/run/user/1000/podman/podman.sock",
		"/run/podman/podman.sock", "/run/containerd/containerd.sock",
		"/home/me/.docker/run/docker.sock", "/home/me/.docker/desktop/docker.sock",
		"/home/me/.colima/default/docker.sock", "/home/me/.rd/docker.sock",
	} {
		if !slices.Contains(got, want) {
			t.Errorf("Sockets lacks %s: %q", want, got)
		}
	}
	seen := map[string]bool{}
	for _, s := range got {
		if seen[s] {
			t.Errorf("%s is listed twice: %q", s, got)
		}
		seen[s] = true
	}
	env = map[string]string{"CONTAINER_HOST": "unix:///tmp/podman.sock"}
	if got := Sockets(func(k string) string { return env[k] }, ""); !slices.Contains(got, "/tmp/podman.sock") {
		t.Errorf("CONTAINER_HOST's socket is not listed: %q", got)
	}
}
