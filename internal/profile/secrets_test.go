package profile_test

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/propio/propio-sandbox/internal/profile"
)

// TestSecretsAndLimits: what the secrets section and the limited allow rules
// decode to, through extends: a child adds hosts to an inherited secret,
// replaces its source whole, drops one with null; limits and the default
// methods come through; upstream_ca is relative to the file that sets it.
func TestSecretsAndLimits(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"parent/base.yaml": `image: a
network:
  mode: allowlist
  allow:
    - llm.test
    - {host: api.git.test, methods: [GET, HEAD]}
  upstream_ca: certs/ca.pem
secrets:
  LLM_TOKEN:
    from: {env: HOST_LLM}
    hosts: [llm.test]
  GIT_TOKEN:
    from: {command: [gh, auth, token]}
    hosts: [api.git.test]
  DROPPED:
    from: {env: DROPPED}
    hosts: [llm.test]
`,
		"p.yaml": `extends: ./parent/base.yaml
network:
  methods: [GET, HEAD, OPTIONS]
  allow:
    - {host: "*.git.test", methods: ["*"], paths: ["/org/**"]}
secrets:
  LLM_TOKEN:
    from: {file: token.txt}
    hosts: ["llm.test:8443"]
  DROPPED: null
`,
	})
	locs := profile.Locations{ConfigDir: filepath.Join(dir, "cfg"), Workspace: filepath.Join(dir, "ws")}
	p, err := locs.LoadFile(filepath.Join(dir, "p.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if got := p.SecretNames(); !slices.Equal(got, []string{"GIT_TOKEN", "LLM_TOKEN"}) {
		t.Errorf("secrets %v, want GIT_TOKEN and LLM_TOKEN (DROPPED dropped by null)", got)
	}
	llm := p.Secrets["LLM_TOKEN"]
	if llm.From.String() != "file token.txt" || llm.Dir != dir {
		t.Errorf("LLM_TOKEN from %+v in %s, want the child's file alone, in %s", llm.From, llm.Dir, dir)
	}
	var hosts []string
	for _, r := range llm.Hosts {
		hosts = append(hosts, r.Text)
	}
	if !slices.Equal(hosts, []string{"llm.test", "llm.test:8443"}) {
		t.Errorf("LLM_TOKEN hosts %v, want the parent's and the child's", hosts)
	}
	if g := p.Secrets["GIT_TOKEN"]; g.From.String() != "command gh auth token" || g.Dir != filepath.Join(dir, "parent") {
		t.Errorf("GIT_TOKEN from %q in %s", g.From, g.Dir)
	}
	if !slices.Equal(p.Network.Methods, []string{"GET", "HEAD", "OPTIONS"}) {
		t.Errorf("network.methods %v", p.Network.Methods)
	}
	var flags []string
	for _, r := range p.Network.Allow {
		flags = append(flags, r.Flag())
	}
	if want := []string{"llm.test", "api.git.test GET,HEAD", "*.git.test * /org/**"}; !slices.Equal(flags, want) {
		t.Errorf("allow rules %q, want %q", flags, want)
	}
	if p.Network.UpstreamCA != "certs/ca.pem" || p.Network.UpstreamCADir != filepath.Join(dir, "parent") {
		t.Errorf("upstream_ca %q in %q", p.Network.UpstreamCA, p.Network.UpstreamCADir)
	}

	// Shown as written, never with a value: the mapping form stays one.
	out, err := p.YAML()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"    - host: api.git.test\n      methods:\n        - GET\n", "secrets:\n  GIT_TOKEN:\n    from:\n      command:\n"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("profiles show lacks %q:\n%s", want, out)
		}
	}
}

// TestSecretsInvalid: each mistake is reported at its position, with the
// rest.
func TestSecretsInvalid(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		yaml  string
		files map[string]string
		ws    bool // the profile is in the workspace: a repository profile
		want  []string
	}{
		"secrets without an allowlist": {
			yaml: "image: a\nnetwork: {mode: open}\nsecrets:\n  T: {from: {env: X}, hosts: [a.test]}\n",
			want: []string{"2:17: network.mode: the secrets T are brokered by the allowlist gateway, and network.mode is open"},
		},
		"two sources, no hosts": {
			yaml: "image: a\nnetwork: {mode: allowlist}\nsecrets:\n  T: {from: {env: X, file: /f}}\n",
			want: []string{
				`4:6: secrets.T: missing required field "hosts"`,
				"4:13: secrets.T.from: 2 fields, and at most 1 may be set",
			},
		},
		"a name the sandbox sets": {
			yaml: "image: a\nnetwork: {mode: allowlist}\nsecrets:\n  HTTPS_PROXY: {from: {env: X}, hosts: [a.test]}\n",
			want: []string{"4:16: secrets.HTTPS_PROXY: HTTPS_PROXY is set by the sandbox itself"},
		},
		"a name env.set sets": {
			yaml: "image: a\nnetwork: {mode: allowlist}\nenv:\n  set: {T: x}\nsecrets:\n  T: {from: {env: X}, hosts: [a.test]}\n",
			want: []string{"6:6: secrets.T: T is a secret and in env.set too"},
		},
		"bad hosts": {
			yaml: "image: a\nnetwork: {mode: allowlist}\nsecrets:\n  T: {from: {env: X}, hosts: [\"*.com\", \"a.test:0\"]}\n",
			want: []string{
				`4:31: secrets.T.hosts[0]: "*.com" is too broad: a wildcard must keep at least two labels, as in *.example.com`,
				`4:40: secrets.T.hosts[1]: "a.test:0": port "0" is not a number from 1 to 65535`,
			},
		},
		"cleartext hosts not among the hosts": {
			yaml: "image: a\nnetwork: {mode: allowlist}\nsecrets:\n  T: {from: {env: X}, hosts: [a.test], cleartext_hosts: [a.test, b.test, \"a.test:80\"]}\n",
			want: []string{
				`4:66: secrets.T.cleartext_hosts[1]: "b.test" is not one of the secret's hosts`,
				`4:74: secrets.T.cleartext_hosts[2]: "a.test:80" is not one of the secret's hosts`,
			},
		},
		"a command in a repository profile": {
			yaml: "image: a\nnetwork: {mode: allowlist}\nsecrets:\n  T: {from: {command: [cat, /etc/shadow]}, hosts: [a.test]}\n",
			ws:   true,
			want: []string{"4:23: secrets.T.from.command: a repository profile cannot read a secret from a command: the agent can write it"},
		},
		"a file in a repository profile": {
			yaml: "image: a\nnetwork: {mode: allowlist}\nsecrets:\n  T: {from: {file: ~/.aws/credentials}, hosts: [a.test]}\n",
			ws:   true,
			want: []string{"4:20: secrets.T.from.file: a repository profile cannot read a secret from a file: the agent can write it"},
		},
		"a variable in a secret's file": {
			yaml: "image: a\nnetwork: {mode: allowlist}\nsecrets:\n  T: {from: {file: \"${AWS}/x\"}, hosts: [a.test]}\n",
			want: []string{`4:20: secrets.T.from.file: "${AWS}" cannot be expanded: only ${WORKSPACE}, ${HOME}, ${PROPIO_HOME} and ~/ are`},
		},
		"limits where none go": {
			yaml: "image: a\nnetwork:\n  mode: allowlist\n  deny: [{host: a.test, methods: [GET]}]\n  methods: [get]\n",
			want: []string{
				`4:10: network.deny[0]: got object, want string`,
				`5:13: network.methods[0]: "get" is not valid here (want an HTTP method in upper case, such as GET, or * for any)`,
			},
		},
		"bad limits": {
			yaml: "image: a\nnetwork:\n  mode: allowlist\n  allow:\n    - {host: a.test, paths: [/a/b**]}\n    - {host: \"a b\", methods: [GET]}\n",
			want: []string{
				`5:7: network.allow[0]: "/a/b**": ** must be a whole segment, as in /repos/**`,
				`6:14: network.allow[1].host: "a b" is not valid here (want a host: a name, *.name or an address, with :port if needed (no scheme or path))`,
			},
		},
		"limits without an allowlist": {
			yaml: "image: a\nnetwork:\n  mode: open\n  methods: [GET]\n  upstream_ca: ca.pem\n",
			want: []string{
				"4:12: network.methods: applies only to network.mode allowlist, and the mode is open",
				"5:16: network.upstream_ca: applies only to network.mode allowlist, and the mode is open",
			},
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			ws := filepath.Join(dir, "ws")
			at := dir
			if tt.ws {
				at = ws
			}
			writeFiles(t, at, map[string]string{"p.yaml": tt.yaml})
			locs := profile.Locations{ConfigDir: filepath.Join(dir, "cfg"), Workspace: ws}
			got := validate(t, locs, filepath.Join(at, "p.yaml"), at)
			if !slices.Equal(got, tt.want) {
				t.Errorf("problems:\n%s\nwant:\n%s\nprofile:\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"), tt.yaml)
			}
		})
	}
}
