package e2e

// A real agent CLI, installed from the npm registry, in a profile that
// extends strict, against a fake provider the test starts: OpenAI's Codex
// CLI (@openai/codex, whose Linux program is a static musl build, the kind
// of client whose resolver retries what glibc's gives up on).
//
// The image is propio-sandbox/agent with Codex installed from the two npm
// tarballs (the package and its Linux platform package), fetched on the host
// with `npm pack` and checked against the integrity pinned here; the build
// itself uses no network. Its tag is a hash of its inputs, so an engine that
// keeps its images (CI's) builds it once and reuses it.
//
// The provider (`probe provider`) runs on a network of the test's own, as
// provider.test, and is the gateway's only way out
// (PROPIO_SANDBOX_GATEWAY_NETWORK). The profile denies every real name that
// strict allows, so the gateway never looks one up; whatever else Codex tries
// is denied by strict and must show in `logs --denied`.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/testenv"
	"github.com/propio/propio-sandbox/profiles"
	"go.yaml.in/yaml/v3"
)

// codexVersion is the Codex CLI the test installs, and codexIntegrity the
// npm integrity of its package and of its Linux platform packages.
const codexVersion = "0.169.0"

var codexIntegrity = map[string]string{
	"":            "sha512-KhzYlkKPxoNssR8CEm45IjqnFWn7UtlF4CiD3tOJPea51xBs7MaHy0UQG9GSbCqk6Lrjn5QdJDV0QD1/FgWlGw==",
	"linux-x64":   "sha512-o05NyAOCDygSPRo1yinzxvkRSdmsZyBD9E7mbpmjRanSfM8lypqWtQgEo4XfNkwhuCR2aFu8mlGOsQGFXVbVww==",
	"linux-arm64": "sha512-NZ/DaQUpcQmxmqee7Z9uC1rzw3GhSbooawcaTe1LN5Yk+WlinUKGdTXJgClRT/9ogQEEM9TWxYzvxPfj5G/xFg==",
}

// codexDockerfile installs the two tarballs with npm, offline, in a stage of
// its own (the tarballs stay out of the image), as `npm install -g
// @openai/codex` would lay them out: the platform package beside the package
// whose bin/codex.js finds it.
const codexDockerfile = `FROM propio-sandbox/agent:latest AS install
COPY %[1]s %[2]s /pkgs/
RUN mkdir /opt/codex && cd /opt/codex && echo '{"private": true}' > package.json \
 && npm install --offline --no-audit --no-fund --omit=optional \
      /pkgs/%[1]s "@openai/codex-%[3]s@file:/pkgs/%[2]s"
FROM propio-sandbox/agent:latest
COPY --from=install /opt/codex /opt/codex
RUN ln -s /opt/codex/node_modules/@openai/codex/bin/codex.js /usr/local/bin/codex && codex --version
`

// codexImage returns the tag of the Codex image, building it when the engine
// does not have it.
func codexImage(t *testing.T) string {
	t.Helper()
	platform := map[string]string{"amd64": "linux-x64", "arm64": "linux-arm64"}[runtime.GOARCH]
	if platform == "" {
		t.Skipf("Codex ships no Linux build for %s", runtime.GOARCH)
	}
	base, err := docker("image", "inspect", "-f", "{{.Id}}", "propio-sandbox/agent:latest")
	if err != nil {
		dockerfileSkipOrFail(t, "the agent image is missing (build it with `propio-sandbox build`, as .ci/run does): %v", err)
	}
	pkg := "openai-codex-" + codexVersion + ".tgz"
	platformPkg := "openai-codex-" + codexVersion + "-" + platform + ".tgz"
	dockerfile := fmt.Sprintf(codexDockerfile, pkg, platformPkg, platform)
	sum := sha256.Sum256([]byte(strings.Join([]string{dockerfile, strings.TrimSpace(base), codexIntegrity[""], codexIntegrity[platform]}, "\n")))
	tag := "propio-sandbox-e2e/codex:" + codexVersion + "-" + hex.EncodeToString(sum[:6])
	if _, err := docker("image", "inspect", tag); err == nil {
		return tag
	}

	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	npm := exec.CommandContext(ctx, "npm", "pack", "--pack-destination", dir,
		"@openai/codex@"+codexVersion, "@openai/codex@"+codexVersion+"-"+platform)
	npm.Dir = dir
	if out, err := npm.CombinedOutput(); err != nil {
		dockerfileSkipOrFail(t, "fetching Codex from the npm registry (npm pack): %v\n%s", err, out)
	}
	for file, want := range map[string]string{pkg: codexIntegrity[""], platformPkg: codexIntegrity[platform]} {
		data, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			t.Fatal(err)
		}
		sum := sha512.Sum512(data)
		if got := "sha512-" + base64.StdEncoding.EncodeToString(sum[:]); got != want {
			t.Fatalf("%s from the registry has integrity %s, pinned %s", file, got, want)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte(dockerfile), 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if out, err := docker("build", "-q", "-t", tag, dir); err != nil {
		t.Fatalf("building the Codex image: %v\n%s", err, out)
	}
	t.Logf("built %s in %s", tag, time.Since(start).Round(time.Second))
	// The images of other inputs are this test's too: remove those no
	// container uses (docker refuses the others).
	if out, err := docker("image", "ls", "--format", "{{.Repository}}:{{.Tag}}", "propio-sandbox-e2e/codex"); err == nil {
		for _, old := range strings.Fields(out) {
			if old != tag {
				docker("rmi", old)
			}
		}
	}
	return tag
}

// fakeProvider starts `probe provider CMD` as provider.test on a network of
// its own, over HTTP and over TLS (its certificate from a test CA, whose
// ca.pem is in certs), and returns the network and the container.
func fakeProvider(t *testing.T, cmd string) (network, id, certs string) {
	t.Helper()
	certs = filepath.Join(t.TempDir(), "certs")
	makeTestCA(t, certs, "provider.test")
	// Internal: nothing on it has a route out, the gateway included.
	network = "propio-e2e-provider-" + randomID()
	if _, err := docker("network", "create", "--internal", "--label", "dev.propio-sandbox.e2e=1", network); err != nil {
		t.Fatalf("creating the provider's network: %v", err)
	}
	t.Cleanup(func() { testenv.RemoveNetwork(t, network) })
	out, err := docker("run", "-d", "--label", "dev.propio-sandbox.e2e=1", "--network", network,
		"--network-alias", "provider.test", "-v", certs+":/certs:ro", ProbeImage, "provider", cmd)
	if err != nil {
		t.Fatalf("starting the provider: %v", err)
	}
	id = strings.TrimSpace(out)
	t.Cleanup(func() { docker("rm", "-f", id) })
	deadline := time.Now().Add(20 * time.Second)
	for {
		logs, _ := docker("logs", id)
		if strings.Contains(logs, "serving provider") {
			return network, id, certs
		}
		if time.Now().After(deadline) {
			t.Fatalf("the provider did not start:\n%s", logs)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// firstWrite is an output that remembers when it was first written to.
type firstWrite struct {
	mu  sync.Mutex
	buf bytes.Buffer
	at  time.Time
}

func (f *firstWrite) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.at.IsZero() && len(p) > 0 {
		f.at = time.Now()
	}
	return f.buf.Write(p)
}

// strictNames are the names built-in strict allows (its LLM providers):
// the test's profile denies them all, so that nothing Codex does makes the
// gateway look up a real name.
func strictNames(t *testing.T) []string {
	t.Helper()
	data, err := profiles.FS.ReadFile("strict.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var strict struct {
		Network struct {
			Allow []string `yaml:"allow"`
		} `yaml:"network"`
	}
	if err := yaml.Unmarshal(data, &strict); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, rule := range strict.Network.Allow {
		host, _, _ := strings.Cut(rule, ":")
		names = append(names, host)
	}
	return names
}

// codexToolCommand writes a file, and says what the sandbox holds for the
// provider's key, and as whom it ran.
const codexToolCommand = `printf 'written by codex\n' > /workspace/codex-wrote.txt && echo "key inside: ${OPENAI_API_KEY%-*}" && echo "tool ran as $(id -u):$(id -g)"`

// codexArgs runs Codex non-interactively against the fake provider, with
// its own sandbox and approvals off (the container is the sandbox).
var codexArgs = []string{"codex", "exec", "--json",
	"--skip-git-repo-check", "--ephemeral", "--dangerously-bypass-approvals-and-sandbox",
	"-c", "model_provider=fake", "-c", "model=fake-model",
	"-c", `model_providers.fake={name="fake", base_url="https://provider.test/v1", env_key="OPENAI_API_KEY", wire_api="responses"}`,
	"Write codex-wrote.txt in the workspace."}

// withoutProxyVariables makes a command ignore the gateway's proxies: its
// connections take the transparent path, names resolved by the gateway.
var withoutProxyVariables = []string{"env", "-u", "HTTP_PROXY", "-u", "HTTPS_PROXY", "-u", "ALL_PROXY",
	"-u", "http_proxy", "-u", "https_proxy", "-u", "all_proxy"}

// TestRealAgentCodex runs `codex exec` in a profile extending strict, as a
// user that is not root when the test can make one: Codex asks the fake
// provider, over TLS, which answers with a shell tool call that writes a
// file in /workspace, then with a final message once it has the tool's
// output. Its key is brokered, as strict brokers OPENAI_API_KEY (here to
// provider.test too): Codex, unchanged, holds the sentinel and sends it;
// the provider gets the real key, behind the gateway's TLS (the provider's
// CA is the profile's upstream_ca). It runs twice: through the proxy
// variables, which Codex follows, and with them unset, through the
// transparent path (the gateway's DNS and its TLS listener).
func TestRealAgentCodex(t *testing.T) {
	s := newSandbox(t)
	image := codexImage(t)
	network, provider, certs := fakeProvider(t, codexToolCommand)
	const key = "sk-e2e-not-a-key"
	s.Env = append(s.Env, "PROPIO_SANDBOX_GATEWAY_NETWORK="+network, "OPENAI_API_KEY="+key)
	p := s.Profile(fmt.Sprintf("extends: strict\nimage: %s\nnetwork:\n  allow: [provider.test]\n  deny: [%s]\n  upstream_ca: %s\n"+
		"secrets:\n  OPENAI_API_KEY: {from: {env: OPENAI_API_KEY}, hosts: [provider.test]}\n",
		image, strings.Join(strictNames(t), ", "), filepath.Join(certs, "ca.pem")))
	run := codexLauncher(t, s)

	for _, way := range []struct {
		name   string
		prefix []string
		via    string // how the gateway saw the side calls
	}{
		{"proxy variables", nil, "connect"},
		{"transparent", withoutProxyVariables, "dns"},
	} {
		t.Run(way.name, func(t *testing.T) {
			path := filepath.Join(s.Workspace, "codex-wrote.txt")
			os.Remove(path)
			before, _ := docker("logs", provider)
			r, first, total := run.Run(t, append(append([]string{"run", "-p", p, "--"}, way.prefix...), codexArgs...)...)
			t.Logf("time to first output %s (codex's first event on stdout), whole run %s",
				first.Round(time.Millisecond), total.Round(time.Millisecond))
			after, _ := docker("logs", provider)
			saw := strings.TrimPrefix(after, before)
			if r.Code != 0 {
				t.Fatalf("codex did not exit 0:\n%s\nthe provider saw:\n%s", r, saw)
			}

			data, err := os.ReadFile(path)
			if err != nil || string(data) != "written by codex\n" {
				t.Errorf("the tool call did not write codex-wrote.txt: %v %q", err, data)
			} else if u, g := isolationOwner(t, path); int(u) != run.uid || int(g) != run.gid {
				t.Errorf("codex-wrote.txt is owned by %d:%d, want the invoking %d:%d", u, g, run.uid, run.gid)
			}

			want := fmt.Sprintf("tool ran as %d:%d", run.uid, run.gid)
			if !strings.Contains(saw, "tool call ") || !strings.Contains(saw, "tool output ") || !strings.Contains(saw, want) || !strings.Contains(saw, "final message") {
				t.Errorf("want a tool call, its output with %q and a final message in the provider's log:\n%s", want, saw)
			}
			// The provider got the real key on every request; the sandbox
			// held a sentinel (the tool said what it saw, less its random
			// end); nothing printed the key.
			if n, m := strings.Count(saw, "request POST "), strings.Count(saw, `authorization "Bearer `+key+`"`); n < 2 || m != n {
				t.Errorf("%d requests, %d with the real key: want every one brokered:\n%s", n, m, saw)
			}
			if !strings.Contains(saw, `key inside: propio-sentinel-OPENAI_API_KEY`) || strings.Contains(saw, "key inside: "+key) {
				t.Errorf("the tool does not report a sentinel inside:\n%s", saw)
			}
			if strings.Contains(r.Stdout+r.Stderr, key) {
				t.Errorf("the key shows in the launcher's output:\n%s", r)
			}
			if !codexSaid(r.Stdout, "done: "+want) {
				t.Errorf("codex's events lack the final message %q:\n%s", "done: "+want, r.Stdout)
			}

			for _, e := range decisions(t, s, false) {
				if host, _ := e["host"].(string); e["allowed"] == true && host != "provider.test" {
					t.Errorf("the gateway allowed %s: %v", host, e)
				}
			}
			var tried []string
			for _, e := range decisions(t, s, true) {
				// Denied by a rule, at once: not a lookup that failed (the
				// provider's network resolves no real name).
				if reason, _ := e["reason"].(string); reason == "" || e["error"] != nil {
					t.Errorf("a denial with no reason, or with an error: %v", e)
				}
				if name := fmt.Sprintf("%v:%v", e["host"], e["port"]); e["via"] == way.via && !slices.Contains(tried, name) {
					tried = append(tried, name)
				}
			}
			t.Logf("denied via %s: %s", way.via, strings.Join(tried, " "))
			if len(tried) == 0 {
				t.Errorf("logs --denied shows nothing via %s that codex tried besides the provider", way.via)
			}
		})
	}

	t.Run("exit code", func(t *testing.T) {
		r, _, _ := run.Run(t, "run", "-p", p, "--", "codex", "exec", "--no-such-flag")
		if r.Code != 2 || !strings.Contains(r.Stderr, "unexpected argument '--no-such-flag'") {
			t.Errorf("want codex's exit code 2 for an unknown flag, as the launcher's:\n%s", r)
		}
	})
}

// codexRun runs the launcher as uid:gid.
type codexRun struct {
	uid, gid int
	cmd      func(ctx context.Context, args ...string) *exec.Cmd
}

// codexLauncher prepares launcher runs as a user that is not root: uid 4244
// when the test runs as root, the test's own user otherwise.
func codexLauncher(t *testing.T, s *sandbox) codexRun {
	t.Helper()
	c := codexRun{uid: os.Getuid(), gid: os.Getgid(), cmd: s.Command}
	if c.uid != 0 {
		return c
	}
	c.uid, c.gid = 4244, 4244
	sockGID := isolationSocketGID(t)
	bin := isolationUserLauncher(t, s, c.uid)
	c.cmd = func(ctx context.Context, args ...string) *exec.Cmd {
		cmd := s.Command(ctx, args...)
		cmd.Path, cmd.Args[0] = bin, bin
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(c.uid), Gid: uint32(c.gid), Groups: []uint32{sockGID}}}
		return cmd
	}
	return c
}

// Run runs the launcher with args, bounded by two minutes, and returns how it
// ended, how long it took to print something on stdout and how long in all.
func (c codexRun) Run(t *testing.T, args ...string) (r Result, first, total time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := c.cmd(ctx, args...)
	var stdout, stderr firstWrite
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	total = time.Since(start)
	r = Result{Stdout: stdout.buf.String(), Stderr: stderr.buf.String()}
	var ee *exec.ExitError
	switch {
	case ctx.Err() != nil:
		t.Fatalf("%v did not finish in time:\n%s", args, r)
	case errors.As(err, &ee):
		r.Code = ee.ExitCode()
	case err != nil:
		t.Fatalf("running %v: %v", args, err)
	}
	if !stdout.at.IsZero() {
		first = stdout.at.Sub(start)
	}
	return r, first, total
}

// codexSaid reports whether codex's JSON events hold an agent message
// containing text.
func codexSaid(events, text string) bool {
	for _, line := range strings.Split(events, "\n") {
		var e struct {
			Type string `json:"type"`
			Item struct {
				Type string `json:"type"`
				Text string `json:"text"`
			} `json:"item"`
		}
		if json.Unmarshal([]byte(line), &e) == nil && e.Type == "item.completed" && e.Item.Type == "agent_message" && strings.Contains(e.Item.Text, text) {
			return true
		}
	}
	return false
}
