package e2e

// The threat model's claims for each built-in profile, attacked from inside
// a sandbox of that very profile (its image, propio-sandbox/agent, has bash
// and git): what the agent reads of the host's secrets, what it writes
// outside the workspace, what it leaves for the host's git, setuid bits.
// The network's claims are proven by TestAllowlist and its bypass
// subtests, and by TestEnvHostGateway.

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestThreatModelBuiltins runs one attack script in each built-in profile.
func TestThreatModelBuiltins(t *testing.T) {
	t.Parallel()
	requireEngine(t)
	if out, err := docker("image", "inspect", agentImage); err != nil {
		t.Fatalf("the built-ins' image is needed (.ci/run builds it): %v %s", err, firstLine(out))
	}
	limitsIgnored := engineIgnoresLimits(t)
	for _, name := range []string{"offline", "open", "strict", "standard"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := newSandbox(t)
			gitRepo(t, s)
			mark, payload := marker(t)
			const secret = "e2e-threat-secret"
			isolationWriteFile(t, filepath.Join(s.Workspace, ".env"), "TOKEN="+secret+"-dotenv\n")
			isolationWriteFile(t, filepath.Join(s.Workspace, "certs", "server.pem"), secret+"-pem\n")
			if err := os.Link(filepath.Join(s.Workspace, ".env"), filepath.Join(s.Workspace, "notes.txt")); err != nil {
				t.Fatal(err)
			}
			isolationWriteFile(t, filepath.Join(s.Home, ".aws", "credentials"), "[default]\nkey = "+secret+"-aws\n")
			s.Env = append(s.Env, "AWS_SECRET_ACCESS_KEY="+secret+"-env", "GITHUB_TOKEN="+secret+"-gh",
				"MISTRAL_API_KEY="+secret+"-provider", // brokered by strict and standard, passed by no built-in
				"PROPIO_SANDBOX_TEST_DISK=64m")        // the disk cap, lowered for the test

			script := `
echo "dotenv=[$(cat .env)]"
echo "hardlink=[$(cat notes.txt)]"
echo "pem=[$(cat certs/server.pem)]"
echo "aws=[$(cat "$1/.aws/credentials" 2>&1)]"
echo "env=[${AWS_SECRET_ACCESS_KEY:-unset} ${GITHUB_TOKEN:-unset}]"
echo "provider=[${MISTRAL_API_KEY%-*}]"
echo "found=[$(grep -rlsF --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev -e "$4" / | head -3)]"
echo "socket=[$(ls /var/run/docker.sock /run/docker.sock /run/podman/podman.sock 2>&1 | tr '\n' ' ')]"
echo "outside=[$(touch /usr/local/bin/planted 2>&1)]"
echo "config=[$(echo "[core] fsmonitor = $2" 2>&1 >> .git/config)]"
echo "hook=[$( (echo "$2" > .git/hooks/pre-commit) 2>&1)]"
echo "rename=[$(mv .git .git-moved 2>&1)]"
cp -r .git copy && printf '[core]\n\tfsmonitor = %s\n' "$2" > copy/config && echo ../copy > .git/commondir
cp /bin/true tool && chmod 4755 tool
grep -E '^(CapEff|CapBnd|NoNewPrivs):' /proc/self/status | tr -s '\t' ' '
python3 -c '
import os, signal, time
pids = []
while len(pids) < 500:
    try:
        pid = os.fork()
    except OSError as e:
        print("forks=%d stopped:" % len(pids), e.strerror)
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    pids.append(pid)
for pid in pids:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
'
echo "tmp=[$(head -c 100M /dev/zero 2>&1 > /tmp/fill)]"
if [ "$3" = memory ]; then
  python3 -c 'b = bytearray(3 << 30); print("allocated")'
  echo "memory=$?"
fi
echo done`
			memory := "" // 3 GiB past the default limit of 2g, in one profile only: the limit is every profile's
			if name == "offline" {
				memory = "memory"
			}
			r := s.Run("", "-p", name, "--", "bash", "-c", script, "attack", s.Home, payload, memory, secret+"-provider")
			if r.Code != 0 || !strings.Contains(r.Stdout, "done") {
				t.Fatalf("the attack script did not run to its end:\n%s", r)
			}
			for _, want := range []string{
				"dotenv=[]", "hardlink=[]", "pem=[]",
				"aws=[cat: " + s.Home + "/.aws/credentials: No such file or directory]",
				"env=[unset unset]",
				"socket=[ls: cannot access '/var/run/docker.sock': No such file or directory ls: cannot access '/run/docker.sock': No such file or directory ls: cannot access '/run/podman/podman.sock': No such file or directory ]",
				"Read-only file system]", // .git/config
				"rename=[mv: cannot move '.git' to '.git-moved': Device or resource busy]",
				// No capability, none to gain, no privilege gain through setuid.
				"CapEff: 0000000000000000", "CapBnd: 0000000000000000", "NoNewPrivs: 1",
				"tmp=[head: error writing 'standard output': No space left on device]", // resources.disk
			} {
				if !strings.Contains(r.Stdout, want) {
					t.Errorf("%s: want %q in:\n%s", name, want, r)
				}
			}
			switch {
			case limitsIgnored:
				// The engine cannot hold them, and the launch says so
				// (TestResourceLimitsEnforcedOrWarned).
				if !strings.Contains(r.Stderr, "limits are not enforced") {
					t.Errorf("%s: on an engine that ignores resource limits, the launch did not say so:\n%s", name, r)
				}
			default:
				if m := regexp.MustCompile(`forks=(\d+) stopped: Resource temporarily unavailable`).FindStringSubmatch(r.Stdout); m == nil || atoi(m[1]) >= 100 {
					t.Errorf("%s: the pids limit (100) did not stop the forks:\n%s", name, r)
				}
				if memory != "" && (strings.Contains(r.Stdout, "allocated") || !strings.Contains(r.Stdout, "memory=137")) {
					t.Errorf("%s: 3 GiB were allocated past the memory limit:\n%s", name, r)
				}
			}
			outside := "outside=[touch: cannot touch '/usr/local/bin/planted': Read-only file system]"
			if name == "open" { // a writable root filesystem, as the sandbox user
				outside = "outside=[touch: cannot touch '/usr/local/bin/planted': Permission denied]"
				if os.Getuid() == 0 {
					outside = "outside=[]" // root may write its container's own layer, which goes with it
				}
			}
			if !strings.Contains(r.Stdout, outside) {
				t.Errorf("%s: want %q in:\n%s", name, outside, r)
			}
			if !strings.Contains(r.Stdout, "hook=[attack: line") || !strings.Contains(r.Stdout, ".git/hooks/pre-commit: Read-only file system]") {
				t.Errorf("%s: a hook could be written:\n%s", name, r)
			}
			// A provider key is a sentinel inside where a built-in brokers
			// it, and nothing where none passes it; its value is in no file.
			provider := "provider=[]"
			if name == "strict" || name == "standard" {
				provider = "provider=[propio-sentinel-MISTRAL_API_KEY]"
			}
			if !strings.Contains(r.Stdout, provider) || !strings.Contains(r.Stdout, "found=[]") {
				t.Errorf("%s: want %q and nothing found:\n%s", name, provider, r)
			}
			if strings.Contains(r.Stdout+r.Stderr, secret) {
				t.Errorf("%s: a secret reached the sandbox or the output:\n%s", name, r)
			}
			wantReported(t, r, ".git/commondir", "copy/config", "tool")
			useHostGit(t, s, s.Workspace, mark)
			if fi, err := os.Stat(filepath.Join(s.Workspace, "tool")); err != nil || fi.Mode()&fs.ModeSetuid != 0 {
				t.Errorf("%s: tool is setuid on the host: %v %v", name, fi.Mode(), err)
			}
			isolationHasContent(t, filepath.Join(s.Workspace, ".env"), "TOKEN="+secret+"-dotenv\n")
		})
	}
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}
