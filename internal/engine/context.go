package engine

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/docker/cli/cli/command"
	"github.com/docker/cli/cli/config"
	"github.com/docker/cli/cli/context/docker"
	"github.com/docker/cli/cli/context/store"
	"github.com/moby/moby/client"
)

// A want names a Docker context with this prefix ("context:desktop-linux"):
// what --context asks for, which beats DOCKER_HOST as the docker CLI's flag
// does.
const contextPrefix = "context:"

// defaultContext is the docker CLI's name for "no context": DOCKER_HOST, else
// the default socket.
const defaultContext = command.DefaultContextName

// WithContext is the want that names the Docker context name (--context).
func WithContext(name string) string { return contextPrefix + name }

// dockerEndpoint is where the docker CLI would talk to, and why.
type dockerEndpoint struct {
	Host string
	// Context is the context's name; "" for the default one.
	Context string
	// From says where the context's name came from: --context,
	// DOCKER_CONTEXT, or the config file that names it current.
	From string
	// opts reach an endpoint that a host alone does not (TLS, ssh); nil
	// for a unix socket or a plain host.
	opts []client.Opt
}

// resolveDocker chooses the Docker endpoint as the docker CLI does
// (cli/command.resolveContextName): a context named by --context (flag,
// non-empty); else DOCKER_HOST, which means the default context; else
// DOCKER_CONTEXT; else the current context of the config file
// ($DOCKER_CONFIG/config.json, ~/.docker/config.json); else the default
// context. The default context is DOCKER_HOST when set, else the default
// socket. found is false when nothing named a host or a context (the
// default socket is a guess, which auto may replace by Podman's).
func resolveDocker(flag string, getenv func(string) string) (ep dockerEndpoint, found bool, err error) {
	dir := configDir(getenv)
	name, from := flag, "--context"
	if name == "" {
		if h := getenv(client.EnvOverrideHost); h != "" {
			return dockerEndpoint{Host: h}, true, nil
		}
		name, from = getenv(command.EnvOverrideContext), command.EnvOverrideContext
	}
	if name == "" {
		file := filepath.Join(dir, config.ConfigFileName)
		name, err = currentContext(file)
		if err != nil {
			return dockerEndpoint{}, false, err
		}
		from = file
	}
	if name == "" || name == defaultContext {
		if h := getenv(client.EnvOverrideHost); h != "" {
			return dockerEndpoint{Host: h, From: from}, true, nil
		}
		return dockerEndpoint{Host: DefaultHost}, name != "", nil
	}
	ep, err = contextEndpoint(dir, name, from)
	return ep, err == nil, err
}

// configDir is the docker CLI's configuration directory: $DOCKER_CONFIG,
// else ~/.docker.
func configDir(getenv func(string) string) string {
	if d := getenv(config.EnvOverrideConfigDir); d != "" {
		return d
	}
	home := getenv("HOME")
	if home == "" {
		home, _ = os.UserHomeDir()
	}
	return filepath.Join(home, ".docker")
}

// currentContext reads the current context's name from the docker CLI's
// config file; "" when there is no file or it names none. A file that
// cannot be read or parsed is an error: guessing another engine could run
// the sandbox where the user did not mean it to.
func currentContext(file string) (string, error) {
	f, err := os.Open(file)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("reading the docker CLI's config file %s for its current context: %w", file, err)
	}
	defer f.Close()
	cf, err := config.LoadFromReader(f)
	if err != nil {
		return "", fmt.Errorf("reading the docker CLI's config file %s for its current context: %w", file, err)
	}
	return cf.CurrentContext, nil
}

// contextEndpoint reads the Docker endpoint of the context name from the
// context store in dir, with its TLS material.
func contextEndpoint(dir, name, from string) (dockerEndpoint, error) {
	if err := store.ValidateContextName(name); err != nil {
		return dockerEndpoint{}, &ContextError{Name: name, From: from, Dir: dir, Err: err}
	}
	s := store.New(filepath.Join(dir, "contexts"), command.DefaultContextStoreConfig())
	meta, err := s.GetMetadata(name)
	if err != nil {
		var nf interface{ NotFound() }
		if errors.As(err, &nf) {
			err = errNoSuchContext
		}
		return dockerEndpoint{}, &ContextError{Name: name, From: from, Dir: dir, Err: err}
	}
	epMeta, err := docker.EndpointFromContext(meta)
	if err != nil {
		return dockerEndpoint{}, &ContextError{Name: name, From: from, Dir: dir, Err: err}
	}
	ep, err := docker.WithTLSData(s, name, epMeta)
	if err != nil {
		return dockerEndpoint{}, &ContextError{Name: name, From: from, Dir: dir, Err: err}
	}
	if ep.Host == "" {
		return dockerEndpoint{}, &ContextError{Name: name, From: from, Dir: dir, Err: errors.New("its docker endpoint names no host")}
	}
	out := dockerEndpoint{Host: ep.Host, Context: name, From: from}
	if !strings.HasPrefix(ep.Host, "unix://") {
		if out.opts, err = ep.ClientOpts(); err != nil {
			return dockerEndpoint{}, &ContextError{Name: name, From: from, Dir: dir, Err: err}
		}
	}
	return out, nil
}

var errNoSuchContext = errors.New("no such context")

// ContextError is a Docker context that cannot be used: missing from the
// context store, or unreadable.
type ContextError struct {
	Name string
	// From is where the name came from: --context, DOCKER_CONTEXT, or the
	// config file that names it current.
	From string
	// Dir is the docker CLI's configuration directory the context was
	// looked up in.
	Dir string
	Err error
}

func (e *ContextError) Error() string {
	what := "docker context " + fmt.Sprintf("%q", e.Name)
	switch {
	case e.From == "--context" || e.From == command.EnvOverrideContext:
		what += " (named by " + e.From + ")"
	case e.From != "":
		what += " (the current context of " + e.From + ")"
	}
	if errors.Is(e.Err, errNoSuchContext) {
		return fmt.Sprintf("%s does not exist in %s", what, filepath.Join(e.Dir, "contexts"))
	}
	return fmt.Sprintf("%s in %s: %v", what, filepath.Join(e.Dir, "contexts"), e.Err)
}

func (e *ContextError) Unwrap() error { return e.Err }

// Hints say what to do about it.
func (e *ContextError) Hints() []string {
	hints := []string{"list the contexts with `docker context ls` (DOCKER_CONFIG=" + e.Dir + ")"}
	switch e.From {
	case "--context":
		hints = append(hints, "name an existing one with --context, or leave --context out")
	case command.EnvOverrideContext:
		hints = append(hints, "set DOCKER_CONTEXT to an existing one, or unset it")
	default:
		hints = append(hints, "choose an existing one with `docker context use NAME` (it edits "+e.From+"), or set DOCKER_CONTEXT or DOCKER_HOST")
	}
	return hints
}

// contextHosts are the hosts of the Docker endpoints of every context in
// the store in dir; none when it cannot be read.
func contextHosts(dir string) []string {
	list, err := store.New(filepath.Join(dir, "contexts"), command.DefaultContextStoreConfig()).List()
	if err != nil {
		return nil
	}
	var hosts []string
	for _, m := range list {
		if ep, err := docker.EndpointFromContext(m); err == nil && ep.Host != "" {
			hosts = append(hosts, ep.Host)
		}
	}
	return hosts
}

// contextOf is the context in the store in dir whose Docker endpoint is
// host, with the options that reach it (its TLS material, ssh), for a
// background process of a launch that found host through that context: it
// is given the host alone. ok is false when no context has it, or one at a
// unix socket (which needs no more than its host).
func contextOf(dir, host string) (ep dockerEndpoint, ok bool) {
	if strings.HasPrefix(host, "unix://") {
		return dockerEndpoint{}, false
	}
	list, err := store.New(filepath.Join(dir, "contexts"), command.DefaultContextStoreConfig()).List()
	if err != nil {
		return dockerEndpoint{}, false
	}
	for _, m := range list {
		if meta, err := docker.EndpointFromContext(m); err == nil && meta.Host == host {
			ep, err := contextEndpoint(dir, m.Name, "")
			return ep, err == nil
		}
	}
	return dockerEndpoint{}, false
}
