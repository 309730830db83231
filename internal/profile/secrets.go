package profile

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Secret is one entry of secrets: the variable it is keyed by holds a
// sentinel inside the sandbox, and the allowlist gateway puts the value,
// read From the host at launch, in the sentinel's place in the headers of
// requests to Hosts that it sends over TLS, and nowhere else: into plain
// HTTP requests only to those of Hosts that Cleartext names as well. This
// package never reads the value.
type Secret struct {
	From      SecretSource `yaml:"from"`
	Hosts     []Rule       `yaml:"hosts"`
	Cleartext []Rule       `yaml:"cleartext_hosts,omitempty"`
	// Dir is the directory of the profile file that set From: a relative
	// From.File starts there. Empty for a built-in.
	Dir string `yaml:"-"`
}

// SecretSource is where a secret's value is read at launch: exactly one of
// a host environment variable, a file, a command's standard output.
type SecretSource struct {
	Env     string   `yaml:"env,omitempty"`
	File    string   `yaml:"file,omitempty"`
	Command []string `yaml:"command,omitempty"`
}

// String says where the value comes from, never what it is: env NAME, file
// PATH, command ARGS.
func (s SecretSource) String() string {
	switch {
	case s.Env != "":
		return "env " + s.Env
	case s.File != "":
		return "file " + s.File
	case len(s.Command) > 0:
		return "command " + strings.Join(s.Command, " ")
	}
	return "nothing"
}

// sources counts the sources set.
func (s SecretSource) sources() int {
	n := 0
	for _, set := range []bool{s.Env != "", s.File != "", len(s.Command) > 0} {
		if set {
			n++
		}
	}
	return n
}

// secretFrom reports whether path is a secret's from: a child replaces it
// whole (merged, an env and a file would be two sources).
func secretFrom(path string) bool {
	rest, ok := strings.CutPrefix(path, "secrets.")
	if !ok {
		return false
	}
	name, field, ok := strings.Cut(rest, ".")
	return ok && name != "" && field == "from"
}

// settleSecrets drops the secrets a file of the chain set to null (a child
// drops a secret it inherits so) and records where each secret's from was
// set.
func (p *Profile) settleSecrets() {
	for name, s := range p.Secrets {
		if s == nil {
			delete(p.Secrets, name)
			continue
		}
		s.Dir = p.src.dirOf("secrets", name, "from")
	}
	if len(p.Secrets) == 0 {
		p.Secrets = nil
	}
}

// SecretNames are the names of the profile's secrets, sorted.
func (p *Profile) SecretNames() []string { return sortedKeys(p.Secrets) }

// SandboxEnv are the variables the sandbox sets itself, which no secret may
// take: its HOME, the gateway's proxies, the trust of the run's CA, git's
// discovery, the SSH agent.
var SandboxEnv = []string{
	"HOME", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "all_proxy", "no_proxy",
	"SSL_CERT_FILE", "NODE_EXTRA_CA_CERTS", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO", "JAVA_TOOL_OPTIONS",
	"GIT_DISCOVERY_ACROSS_FILESYSTEM", "SSH_AUTH_SOCK",
}

// checkSecrets reports what is wrong with the secrets: where they cannot be
// brokered (no allowlist), names the sandbox sets itself or env.set sets
// too, a source that is not exactly one, a file or command in a repository
// profile (the agent can write it: a command would run on the host, a file
// be read from anywhere), host rules that do not parse.
func (p *Profile) checkSecrets(add func(msg, hint string, path ...string)) {
	if len(p.Secrets) == 0 {
		return
	}
	names := p.SecretNames()
	if p.Network.Mode != "allowlist" {
		add(fmt.Sprintf("the secrets %s are brokered by the allowlist gateway, and network.mode is %s", strings.Join(names, ", "), p.Network.Mode),
			"set network.mode: allowlist, or write secrets: null to drop them (env.pass gives a sandbox the real values instead)", "network", "mode")
	}
	for _, name := range names {
		s := p.Secrets[name]
		at := []string{"secrets", name}
		switch {
		case slices.Contains(SandboxEnv, name):
			add(fmt.Sprintf("%s is set by the sandbox itself", name), "name the secret's variable otherwise", at...)
		case p.Env.Set[name] != "":
			add(fmt.Sprintf("%s is a secret and in env.set too", name), "remove it from env.set: the sandbox sees the secret's sentinel", at...)
		}
		from := append(slices.Clone(at), "from")
		if n := s.From.sources(); n != 1 {
			add(fmt.Sprintf("%d sources: want exactly one of env, file, command", n), "", from...)
			continue
		}
		if (s.From.File != "" || len(s.From.Command) > 0) && p.src.isRepo(p.originOf(from)) {
			kind := "file"
			if s.From.File == "" {
				kind = "command"
			}
			add(fmt.Sprintf("a repository profile cannot read a secret from a %s: the agent can write it", kind),
				"read it in a profile of your own ("+p.userProfiles()+"), outside the workspace, and extend or use that", append(from, kind)...)
		}
		if f := s.From.File; f != "" && !isAbsLike(f) && s.Dir == "" {
			add("a built-in profile's secret file must be absolute", "", append(from, "file")...)
		}
		for i, r := range s.Hosts {
			idx := strconv.Itoa(i)
			switch {
			case r.problem() != nil:
				add(r.problem().Error(), "write a name (api.example.com), *.name for its subdomains, or an address; add :port for a port other than 80 and 443",
					append(slices.Clone(at), "hosts", idx)...)
			case r.limits:
				add("a secret's hosts are rules without methods or paths", "limit the requests in network.allow", append(slices.Clone(at), "hosts", idx)...)
			}
		}
		for i, r := range s.Cleartext {
			if !slices.ContainsFunc(s.Hosts, func(h Rule) bool { return h.Text == r.Text }) {
				add(fmt.Sprintf("%q is not one of the secret's hosts", r.Text), "write it in hosts too, as it is written here: cleartext_hosts only lets a host of the secret have its value over plain HTTP",
					append(slices.Clone(at), "cleartext_hosts", strconv.Itoa(i))...)
			}
		}
	}
}

// secretFromEnv reports whether a secret reads its value from the host
// variable name.
func (p *Profile) secretFromEnv(name string) bool {
	for _, s := range p.Secrets {
		if s.From.Env == name {
			return true
		}
	}
	return false
}
