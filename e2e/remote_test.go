package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	launch "github.com/propio/propio-sandbox/internal/sandbox"
	"github.com/propio/propio-sandbox/internal/testenv"
)

// remoteScript runs in a mount namespace of its own (unshare -m), as a
// launcher on another machine than its engine: its base directory ($1) is
// a tmpfs that only this namespace sees, holding the workspace, HOME (the
// changesets, the account files) and a directory a profile mounts, so that
// no path of the launcher's exists for the engine. Then each command named
// after it ($2...: run, doctor, diff, apply, cat) runs in the workspace,
// its output after a "== N" line and followed by "== N exit CODE".
const remoteScript = `set -u
base=$1; shift
mount -t tmpfs -o size=32m,mode=0755 propio-remote-test "$base" || exit 99
mkdir -p "$base/workspace" "$base/home" "$base/data"
printf 'original\n' > "$base/workspace/kept.txt"
printf 'read from afar\n' > "$base/data/in.txt"
printf 'secret\n' > "$base/workspace/.env"
mkdir "$base/workspace/locked" && printf 'keep\n' > "$base/workspace/locked/config"
git -C "$base/workspace" init -q || exit 98
export HOME="$base/home" XDG_CONFIG_HOME="$base/home/.config" XDG_STATE_HOME="$base/home/.local/state"
cd "$base/workspace"
n=0
for step in "$@"; do
	n=$((n+1))
	echo "== $n"
	sh -c "$step" 2>&1
	code=$?
	printf '\n== %s exit %s\n' "$n" "$code"
done
`

// remoteSteps runs the steps in remoteScript's namespace and returns each
// one's output and exit code.
func remoteSteps(t *testing.T, env []string, base string, steps ...string) (outs []string, codes []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "unshare", append([]string{"--mount", "--propagation", "private", "--", "sh", "-c", remoteScript, "sh", base}, steps...)...)
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil || err != nil {
		t.Fatalf("the launcher's namespace: %v (%v):\n%s", err, ctx.Err(), out)
	}
	parts := regexp.MustCompile(`(?m)^== \d+\n`).Split(string(out), -1)[1:]
	end := regexp.MustCompile(`(?m)^== \d+ exit (\d+)\n?$`)
	for _, p := range parts {
		m := end.FindStringSubmatchIndex(p)
		if m == nil {
			t.Fatalf("a step's output has no exit line:\n%s", out)
		}
		outs, codes = append(outs, strings.TrimSuffix(p[:m[0]], "\n")), append(codes, p[m[2]:m[3]])
	}
	if len(outs) != len(steps) {
		t.Fatalf("%d steps ran, want %d:\n%s", len(outs), len(steps), out)
	}
	return outs, codes
}

// TestRemoteEngine: an engine on "another machine" (a dockerd of the
// test's own, reached through ssh:// by Debian's sshd on loopback, and
// through tcp:// with mutual TLS, by docker contexts) runs a sandbox of a
// launcher whose workspace it cannot see (a tmpfs of the launcher's own
// mount namespace). The workspace goes there by copy and the sandbox's
// writes come back as a changeset that diff shows and apply writes; a
// mount in mode ro is copied there and stays read-only; a mount in mode
// rw is refused at its place in the profile. The same engine reached
// through its unix socket is taken for this host's, and its bind mount of
// the workspace visibly fails. Nothing is left on either engine.
func TestRemoteEngine(t *testing.T) {
	requireEngine(t)
	if testenv.EnginePodman(t) {
		t.Skip("starts a Docker engine of the test's own; the Podman pass has no remote engine to test")
	}
	r := testenv.PrivateRemoteDocker(t, ProbeImage)
	base := filepath.Join(t.TempDir(), "launcher")
	if err := os.Mkdir(base, 0o755); err != nil {
		t.Fatal(err)
	}
	ws := filepath.Join(base, "workspace")
	profiles := t.TempDir()
	profile := func(name, yaml string) string {
		p := filepath.Join(profiles, name+".yaml")
		if !strings.Contains(yaml, "network:") {
			yaml = "network: {mode: none}\n" + yaml
		}
		if err := os.WriteFile(p, []byte("image: "+ProbeImage+"\n"+yaml), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	ro := profile("ro", "mounts:\n  - {source: "+base+"/data, target: /data, mode: ro}\n")
	masked := profile("masked", "workspace: {hide: [.env], readonly: [/locked]}\n")
	rw := profile("rw", "mounts:\n  - source: "+base+"/data\n    target: /data\n    mode: rw\n")
	env := remoteEnv(t, r)
	ps := launcher

	for _, tc := range []struct{ name, context string }{{"ssh", "remote-ssh"}, {"tls", "remote-tls"}} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			outs, codes := remoteSteps(t, append(slices.Clone(env), "DOCKER_CONTEXT="+tc.context), base,
				ps+" doctor -p "+ro,
				ps+" run -p "+ro+" -- read /data/in.txt",
				ps+" run -p "+ro+" -- write /data/in.txt changed",
				ps+` run -p `+ro+` -- fs "write new.txt made afar" "write kept.txt changed afar"`,
				ps+" diff --stat",
				ps+" apply",
				"cat new.txt kept.txt",
				ps+" run -p "+rw+" -- exit 0",
				ps+" run -p "+masked+" -- read .env",
				ps+" run -p "+masked+" -- write locked/config changed",
				ps+" run -p "+masked+" -- write .git/config changed",
				ps+" run -p "+masked+" -- read /etc/passwd",
			)
			t.Logf("%s: %d steps in %s", tc.name, len(outs), time.Since(start).Round(time.Millisecond))
			if testing.Verbose() {
				t.Logf("the last steps:\n%s", strings.Join(outs[8:], "\n--\n"))
			}
			if line := doctorLine(outs[0], "engine"); !strings.Contains(line, "on another machine (the engine at tcp://") && !strings.Contains(line, "on another machine (the engine at ssh://") {
				t.Errorf("doctor's engine line does not say the engine is on another machine:\n%s", outs[0])
			}
			if codes[1] != "0" || !strings.Contains(outs[1], "read from afar") {
				t.Errorf("reading the ro mount's copy: exit %s:\n%s", codes[1], outs[1])
			}
			if codes[2] == "0" || !strings.Contains(outs[2], "read-only file system") {
				t.Errorf("writing to the ro mount's copy: exit %s:\n%s", codes[2], outs[2])
			}
			for _, w := range []string{"is reached over the network: the workspace goes there by copy", "changeset ", "(2 changes, copy)"} {
				if !strings.Contains(outs[3], w) {
					t.Errorf("the run that writes does not say %q: exit %s:\n%s", w, codes[3], outs[3])
				}
			}
			if codes[3] != "0" {
				t.Errorf("the run that writes: exit %s:\n%s", codes[3], outs[3])
			}
			if codes[4] != "0" || !strings.Contains(outs[4], "new.txt") || !strings.Contains(outs[4], "kept.txt") || !strings.Contains(outs[4], "2 files changed") {
				t.Errorf("diff --stat: exit %s:\n%s", codes[4], outs[4])
			}
			if codes[5] != "0" || codes[6] != "0" || outs[6] != "made afarchanged afar" {
				t.Errorf("apply: exit %s:\n%s\nthe workspace then: exit %s: %q", codes[5], outs[5], codes[6], outs[6])
			}
			if codes[7] != "3" || !strings.Contains(outs[7], filepath.Join(profiles, "rw.yaml")+":6:") || !strings.Contains(outs[7], "mounts[0].mode: rw") || !strings.Contains(outs[7], "use mode changeset") {
				t.Errorf("a mount in mode rw on a remote engine: exit %s, want 3 and its place:\n%s", codes[7], outs[7])
			}
			// What the sandbox mounts of the workspace, and the hidden
			// files' mask and the account files, are the engine's copies.
			if codes[8] != "0" || strings.Contains(outs[8], "secret") {
				t.Errorf("reading a hidden file: exit %s:\n%s", codes[8], outs[8])
			}
			for i, what := range map[int]string{9: "a workspace.readonly path", 10: "the git guard's .git/config"} {
				if codes[i] == "0" || !strings.Contains(outs[i], "read-only file system") {
					t.Errorf("writing %s: exit %s:\n%s", what, codes[i], outs[i])
				}
			}
			if codes[11] != "0" || !strings.Contains(outs[11], "nobody:x:65534") {
				t.Errorf("the account files: exit %s:\n%s", codes[11], outs[11])
			}
			remoteLeftovers(t, r.Engine, ws)
		})
	}

	// DOCKER_HOST names the engine as well as a context does: ssh://, and
	// tcp:// with DOCKER_TLS_VERIFY and DOCKER_CERT_PATH. The profile's
	// declared check runs there too, on a read-only copy of the workspace.
	checked := profile("checked", "checks:\n  - {name: reads the workspace, run: [read, kept.txt]}\n  - {name: cannot write it, run: [write, kept.txt, x]}\n")
	for _, tc := range []struct {
		name string
		env  []string
	}{
		{"DOCKER_HOST ssh", []string{"DOCKER_HOST=" + r.SSHHost}},
		{"DOCKER_HOST tls", []string{"DOCKER_HOST=" + r.TLSHost, "DOCKER_TLS_VERIFY=1", "DOCKER_CERT_PATH=" + r.CertDir}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			outs, codes := remoteSteps(t, append(slices.Clone(env), tc.env...), base,
				ps+` run -p `+ro+` -- fs "write new.txt made afar"`,
				ps+" diff --stat",
				ps+" run --skip-checks 'cannot write it' -p "+checked+" -- exit 0",
				ps+" run -p "+checked+" -- exit 0",
			)
			if codes[0] != "0" || !strings.Contains(outs[0], "is reached over the network: the workspace goes there by copy") || codes[1] != "0" || !strings.Contains(outs[1], "1 file changed") {
				t.Errorf("run, then diff --stat: exit %s:\n%s\nexit %s:\n%s", codes[0], outs[0], codes[1], outs[1])
			}
			if codes[2] != "0" {
				t.Errorf("a declared check that reads the workspace: exit %s:\n%s", codes[2], outs[2])
			}
			if codes[3] != "3" || !strings.Contains(outs[3], "preflight check cannot write it failed") || !strings.Contains(outs[3], "read-only file system") {
				t.Errorf("a declared check that writes the workspace: exit %s, want 3:\n%s", codes[3], outs[3])
			}
			remoteLeftovers(t, r.Engine, ws)
		})
	}

	// An allowlist runs there with its gateway, on the engine's networks:
	// a server on a network the test made there (network.join) is reached
	// by the rule's name and port, through the proxy and without it, another
	// port is denied, a declared check runs through a gateway of its own,
	// and the gateway's decision log comes back to the launcher, where logs reads
	// it.
	t.Run("allowlist", func(t *testing.T) {
		id := randomID()
		network, server := "propio-e2e-remote-"+id, "propio-e2e-remote-model-"+id
		if _, err := r.Docker("network", "create", network); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			r.Docker("rm", "-f", server)
			r.Docker("network", "rm", network)
		})
		if _, err := r.Docker("run", "-d", "--network", network, "--name", server, "-e", "PROBE_PORT_OFFSET=11354", ProbeImage, "serve", "model"); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			if out, _ := r.Docker("logs", server); strings.Contains(out, "serving model") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the server never started")
			}
		}
		allow := profile("allowlist", "network:\n  mode: allowlist\n  join: ["+network+"]\n  allow: [\""+server+":11434\"]\n")
		checked := profile("allowlist-checked", "network:\n  mode: allowlist\n  join: ["+network+"]\n  allow: [\""+server+":11434\"]\n"+
			"checks:\n  - {name: reaches the model, run: [fetch, --fail, \"http://"+server+":11434/check\"]}\n")
		outs, codes := remoteSteps(t, append(slices.Clone(env), "DOCKER_CONTEXT=remote-tls"), base,
			ps+" run -p "+allow+" -- fetch --fail http://"+server+":11434/api/tags",
			ps+" run -p "+allow+" -- fetch --fail --timeout 3s http://"+server+":11376/",
			ps+" logs --json",
			ps+" run -p "+allow+" -- fetch --fail --no-proxy http://"+server+":11434/transparent",
			ps+" run -p "+checked+" -- exit 0",
			`ls -A "$XDG_STATE_HOME/propio-sandbox/remote-logs"`,
		)
		if testing.Verbose() {
			t.Logf("the steps:\n%s", strings.Join(outs, "\n--\n"))
		}
		if want := "model http " + server + ":11434 /api/tags"; codes[0] != "0" || !strings.Contains(outs[0], want) {
			t.Errorf("the allowed port: exit %s, want %q:\n%s", codes[0], want, outs[0])
		}
		if codes[1] == "0" {
			t.Errorf("a port no rule allows was reached:\n%s", outs[1])
		}
		if codes[2] != "0" || !strings.Contains(outs[2], `"host":"`+server+`"`) || !strings.Contains(outs[2], `"allowed":false`) || !strings.Contains(outs[2], `"port":11376`) {
			t.Errorf("logs: the denial is not in the log that came back: exit %s:\n%s", codes[2], outs[2])
		}
		if want := "model http " + server + ":11434 /transparent"; codes[3] != "0" || !strings.Contains(outs[3], want) {
			t.Errorf("the allowed port, without the proxy: exit %s, want %q:\n%s", codes[3], want, outs[3])
		}
		if codes[4] != "0" {
			t.Errorf("a declared check through the gateway: exit %s:\n%s", codes[4], outs[4])
		}
		if codes[5] != "0" || strings.TrimSpace(outs[5]) != "" {
			t.Errorf("the gateway logs' stages are left: exit %s:\n%s", codes[5], outs[5])
		}
		remoteLeftovers(t, r.Engine, ws)
	})

	// What a remote engine cannot have is refused (ssh_agent on, an ask,
	// PROPIO_SANDBOX_MOUNTS, up), saying why and what to do, and nothing is left: no container, volume or network on the
	// engine, no changeset.
	t.Run("refused", func(t *testing.T) {
		agent := profile("agent", "ssh_agent: \"on\"\n")
		allow := profile("ask", "network:\n  mode: allowlist\n  allow: [a.test]\n  unlisted: ask\n")
		outs, codes := remoteSteps(t, append(slices.Clone(env), "DOCKER_CONTEXT=remote-tls"), base,
			ps+" run -p "+agent+" -- exit 0",
			ps+" run -p "+allow+" -- exit 0",
			"PROPIO_SANDBOX_MOUNTS="+base+"/data:/extra:ro "+ps+" run -p "+ro+" -- exit 0",
			ps+" up -p "+ro,
			ps+" changes",
		)
		for i, want := range []struct{ code, says, hint string }{
			{"3", "preflight check ssh-agent failed: the engine at tcp://", "hint: set ssh_agent: \"off\""},
			{"3", filepath.Join(profiles, "ask.yaml") + ":5:13: network.unlisted: ask does not run on an engine on another machine yet", "hint: use network.unlisted: deny there"},
			{"1", "the sandbox would mount from this host " + base + "/data at /extra (service agent)", "hint: on a remote engine the workspace"},
			{"1", "the sandbox would mount from this host ", "hint: on a remote engine the workspace"},
		} {
			if codes[i] != want.code || !strings.Contains(outs[i], want.says) || !strings.Contains(outs[i], want.hint) {
				t.Errorf("step %d: exit %s, want %s saying %q and %q:\n%s", i+1, codes[i], want.code, want.says, want.hint, outs[i])
			}
		}
		if testing.Verbose() {
			t.Logf("the steps:\n%s", strings.Join(outs, "\n--\n"))
		}
		if codes[4] != "0" || strings.Contains(outs[4], "20") {
			t.Errorf("a changeset is left: exit %s:\n%s", codes[4], outs[4])
		}
		remoteLeftovers(t, r.Engine, ws)
	})

	t.Run("local socket binds and fails", func(t *testing.T) {
		outs, codes := remoteSteps(t, append(slices.Clone(env), "DOCKER_HOST="+r.Host), base,
			ps+" doctor -p "+ro,
			ps+" run -p "+ro+" -- read kept.txt",
		)
		if strings.Contains(doctorLine(outs[0], "engine"), "on another machine") {
			t.Errorf("the engine at its unix socket is taken for another machine's:\n%s", outs[0])
		}
		if codes[1] == "0" || !strings.Contains(outs[1], "bind source path does not exist: "+base+"/") {
			t.Errorf("the engine bind-mounted a workspace it cannot see: exit %s:\n%s", codes[1], outs[1])
		}
		remoteLeftovers(t, r.Engine, ws)
	})

	if out, err := docker("ps", "-aq", "--filter", "label=dev.propio-sandbox.workspace="+ws); err != nil || strings.TrimSpace(out) != "" {
		t.Errorf("the tests' engine has containers of the remote sandboxes: %v %s", err, out)
	}
}

// remoteEnv is the launcher's environment for the engine r: its ssh first
// in PATH, and a DOCKER_CONFIG of the test's own with the contexts
// remote-ssh and remote-tls, which reach r through ssh:// and tcp:// with
// TLS.
func remoteEnv(t *testing.T, r *testenv.RemoteDocker) []string {
	t.Helper()
	cfg := t.TempDir()
	dockerCLI := func(args ...string) {
		t.Helper()
		cmd := exec.Command("docker", args...)
		cmd.Env = append(os.Environ(), "DOCKER_CONFIG="+cfg)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("docker %v: %v: %s", args, err, out)
		}
	}
	dockerCLI("context", "create", "remote-ssh", "--docker", "host="+r.SSHHost)
	dockerCLI("context", "create", "remote-tls", "--docker", "host="+r.TLSHost+
		",ca="+filepath.Join(r.CertDir, "ca.pem")+",cert="+filepath.Join(r.CertDir, "cert.pem")+",key="+filepath.Join(r.CertDir, "key.pem"))
	return []string{
		"PATH=" + r.SSHBin + ":" + os.Getenv("PATH"),
		"DOCKER_CONFIG=" + cfg,
		"PROPIO_HOME=" + repoRoot(),
		launch.EnvPrepare + "=0",
	}
}

// TestRemoteEngineBuiltins: the built-in profiles run on a remote engine
// (reached through TLS) with the default image, in a workspace that is a
// git repository with a file they hide: the hidden file reads empty, the
// account files name the user, a file written comes back as a changeset,
// and standard's and strict's allowlist gateways run there.
func TestRemoteEngineBuiltins(t *testing.T) {
	requireEngine(t)
	if testenv.EnginePodman(t) {
		t.Skip("starts a Docker engine of the test's own; the Podman pass has no remote engine to test")
	}
	requireAgentImage(t)
	r := testenv.PrivateRemoteDocker(t, agentImage)
	env := append(remoteEnv(t, r), "DOCKER_CONTEXT=remote-tls")
	base := filepath.Join(t.TempDir(), "launcher")
	if err := os.Mkdir(base, 0o755); err != nil {
		t.Fatal(err)
	}
	const script = `id -un; cat .env; echo written > f.txt; echo ok`
	outs, codes := remoteSteps(t, env, base,
		launcher+" run -p offline -- bash -c '"+script+"'",
		launcher+" run -p standard -- bash -c '"+script+"'",
		launcher+" run -p strict -- bash -c '"+script+"'",
		launcher+" changes",
	)
	for i, p := range []string{"offline", "standard", "strict"} {
		if codes[i] != "0" || !strings.Contains(outs[i], "root\nok") || strings.Contains(outs[i], "secret") || !strings.Contains(outs[i], "made (1 change, copy)") {
			t.Errorf("-p %s: exit %s, want 0, the user's name, .env empty and a changeset of f.txt:\n%s", p, codes[i], outs[i])
		}
	}
	for _, p := range []string{"offline", "standard", "strict"} {
		if codes[3] != "0" || !strings.Contains(outs[3], "builtin:"+p+" ") {
			t.Errorf("changes: exit %s, want a changeset of -p %s:\n%s", codes[3], p, outs[3])
		}
	}
	remoteLeftovers(t, r.Engine, filepath.Join(base, "workspace"))
}

// remoteLeftovers fails t when the engine keeps, a few seconds after the
// launcher has gone, a container, volume or network of the workspace's.
func remoteLeftovers(t *testing.T, e *testenv.Engine, workspace string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		left := privateLeftovers(t, e, workspace)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("left on the remote engine: %v", left)
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}
