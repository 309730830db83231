package engine

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/docker/cli/cli/command"
	"github.com/docker/cli/cli/context/docker"
	"github.com/docker/cli/cli/context/store"
)

// newContext writes a context named name whose Docker endpoint is host into
// the docker CLI's configuration directory dir, as `docker context create`
// does.
func newContext(t *testing.T, dir, name, host string) {
	t.Helper()
	s := store.New(filepath.Join(dir, "contexts"), command.DefaultContextStoreConfig())
	err := s.CreateOrUpdate(store.Metadata{
		Name:      name,
		Metadata:  command.DockerContext{Description: "test"},
		Endpoints: map[string]any{docker.DockerEndpoint: docker.EndpointMeta{Host: host}},
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestLocateDockerContexts(t *testing.T) {
	dir := t.TempDir()
	newContext(t, dir, "other", "unix:///srv/other/docker.sock")
	newContext(t, dir, "desktop", "unix:///home/me/.docker/desktop/docker.sock")
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(`{"currentContext": "desktop"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	noCurrent := t.TempDir()
	newContext(t, noCurrent, "other", "unix:///srv/other/docker.sock")
	home := t.TempDir() // ~/.docker, when DOCKER_CONFIG is not set
	newContext(t, filepath.Join(home, ".docker"), "homed", "unix:///srv/homed/docker.sock")
	if err := os.WriteFile(filepath.Join(home, ".docker", "config.json"), []byte(`{"currentContext": "homed"}`), 0o600); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name    string
		want    string
		env     map[string]string
		host    string
		context string
		from    string
	}{
		// The docker CLI's order (cli/command.resolveContextName): --context,
		// then DOCKER_HOST (the default context), then DOCKER_CONTEXT, then
		// the config file's current context.
		{"flag beats DOCKER_HOST", WithContext("other"), map[string]string{"DOCKER_CONFIG": dir, "DOCKER_HOST": "unix:///env.sock"}, "unix:///srv/other/docker.sock", "other", "--context"},
		{"DOCKER_HOST beats DOCKER_CONTEXT", Auto, map[string]string{"DOCKER_CONFIG": dir, "DOCKER_HOST": "unix:///env.sock", "DOCKER_CONTEXT": "other"}, "unix:///env.sock", "", ""},
		{"DOCKER_CONTEXT beats the current context", Docker, map[string]string{"DOCKER_CONFIG": dir, "DOCKER_CONTEXT": "other"}, "unix:///srv/other/docker.sock", "other", "DOCKER_CONTEXT"},
		{"the current context", Auto, map[string]string{"DOCKER_CONFIG": dir}, "unix:///home/me/.docker/desktop/docker.sock", "desktop", filepath.Join(dir, "config.json")},
		{"the current context in ~/.docker", Docker, map[string]string{"HOME": home}, "unix:///srv/homed/docker.sock", "homed", filepath.Join(home, ".docker", "config.json")},
		{"no current context", Docker, map[string]string{"DOCKER_CONFIG": noCurrent}, DefaultHost, "", ""},
		{"the default context is DOCKER_HOST", WithContext("default"), map[string]string{"DOCKER_CONFIG": dir, "DOCKER_HOST": "unix:///env.sock"}, "unix:///env.sock", "", "--context"},
		{"the default context is the default socket", WithContext("default"), map[string]string{"DOCKER_CONFIG": dir}, DefaultHost, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			loc, err := Locate(context.Background(), tc.want, func(k string) string { return tc.env[k] })
			if err != nil {
				t.Fatal(err)
			}
			if loc.Host != tc.host || loc.Context != tc.context || (tc.context != "" && loc.ContextFrom != tc.from) {
				t.Errorf("Locate(%q) = host %q context %q from %q, want %q %q from %q", tc.want, loc.Host, loc.Context, loc.ContextFrom, tc.host, tc.context, tc.from)
			}
			if loc.Kind != Docker {
				t.Errorf("kind %q, want docker", loc.Kind)
			}
		})
	}
}

func TestLocateMissingContext(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "config.json")
	if err := os.WriteFile(file, []byte(`{"currentContext": "gone"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, want string
		env        map[string]string
		says       []string // in the error or its hints
	}{
		{"flag", WithContext("nope"), map[string]string{"DOCKER_CONFIG": dir}, []string{`"nope"`, "--context", filepath.Join(dir, "contexts")}},
		{"DOCKER_CONTEXT", Auto, map[string]string{"DOCKER_CONFIG": dir, "DOCKER_CONTEXT": "nope"}, []string{`"nope"`, "DOCKER_CONTEXT", "unset it"}},
		{"the config file's", Docker, map[string]string{"DOCKER_CONFIG": dir}, []string{`"gone"`, file, "docker context use"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Locate(context.Background(), tc.want, func(k string) string { return tc.env[k] })
			var ce *ContextError
			if !errors.As(err, &ce) {
				t.Fatalf("Locate(%q) = %v, want a ContextError", tc.want, err)
			}
			all := err.Error() + "\n" + strings.Join(ce.Hints(), "\n")
			for _, s := range tc.says {
				if !strings.Contains(all, s) {
					t.Errorf("the error does not say %q:\n%s", s, all)
				}
			}
		})
	}
}

func TestLocateBadConfigFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "config.json")
	if err := os.WriteFile(file, []byte(`{"currentContext": `), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Locate(context.Background(), Docker, func(k string) string { return map[string]string{"DOCKER_CONFIG": dir}[k] })
	if err == nil || !strings.Contains(err.Error(), file) {
		t.Fatalf("Locate with a broken %s = %v, want an error naming it", file, err)
	}
}

func TestSocketsOfContexts(t *testing.T) {
	dir := t.TempDir()
	newContext(t, dir, "desktop", "unix:///home/me/.docker/elsewhere.sock")
	newContext(t, dir, "remote", "tcp://engine.test:2376")
	got := Sockets(func(k string) string { return map[string]string{"DOCKER_CONFIG": dir}[k] }, "")
	if !slices.Contains(got, "/home/me/.docker/elsewhere.sock") {
		t.Errorf("Sockets lacks a context's socket: %q", got)
	}
}

func TestContextOfHost(t *testing.T) {
	dir := t.TempDir()
	newContext(t, dir, "local", "unix:///srv/local/docker.sock")
	newContext(t, dir, "remote", "tcp://engine.test:2376")
	for _, tc := range []struct {
		host, context string
	}{
		{"tcp://engine.test:2376", "remote"},
		{"tcp://other.test:2376", ""},
		{"unix:///srv/local/docker.sock", ""}, // a socket needs no more than its host
	} {
		ep, ok := contextOf(dir, tc.host)
		if ok != (tc.context != "") || ep.Context != tc.context {
			t.Errorf("contextOf(%s) = %q, %v; want %q", tc.host, ep.Context, ok, tc.context)
		}
		if ok && ep.opts == nil {
			t.Errorf("contextOf(%s) gives no options to reach it", tc.host)
		}
	}
}
